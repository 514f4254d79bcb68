"""In-process sampling of one process, with the daemon's own sampling code.

Used when no daemon answers: the figures and the keys of stats() and summary() are
the daemon's because the code is. Imported only when needed: ``import client``
stays standard-library only and cheap.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgewatt.core.transport import current_uid

if TYPE_CHECKING:
    from edgewatt.client._samples import Reading
    from edgewatt.core.snapshot import Snapshot

log = logging.getLogger(__name__)


def _network_accounting() -> Any:
    """The daemon's per-target TCP bytes (sock_diag, no privilege needed for this
    user's processes), or None where netlink refuses."""
    from edgewatt.core.facts.network import NetworkAccounting

    try:
        return NetworkAccounting("/proc")
    except OSError as exc:
        log.warning("edgewatt: the process's own TCP bytes unavailable (sock_diag: %s)", exc)
        return None


class LocalSampler:
    """The in-process backend of a registration (client.Backend)."""

    mode = "local"

    def __init__(
        self,
        pid: int,
        *,
        labels: dict[str, str] | None = None,
        children: bool = True,
        interval: float = 1.0,
        power: bool = True,
        network: bool = False,
        on_snapshot: Callable[[Any], None] | None = None,
    ) -> None:
        from edgewatt.core import platforms
        from edgewatt.core import power as power_sources
        from edgewatt.core.carbon import from_environment as carbon_from_environment
        from edgewatt.core.options import from_environment
        from edgewatt.core.power.attribution import Attribution
        from edgewatt.core.power.meter import (
            PowerMeter,
            sample_hz_from_environment,
            window_hz_from_environment,
        )
        from edgewatt.core.power.source import PowerOptions
        from edgewatt.core.sampling.contributor_list import contributors
        from edgewatt.core.sampling.sampler import Parts, Sampler
        from edgewatt.core.sampling.trees import ProcessTrees
        from edgewatt.core.targets import Limits, Resolver, TargetTable

        carbon = carbon_from_environment()
        self.backend = platforms.choose()
        # One target inside a busy process: the kernel's children files (see LinuxPlatform).
        platform = platforms.create(self.backend, children_files=True)
        self.table = TargetTable(
            Limits(
                max_targets=1,
                history_samples=3600,
                exited_retention_s=float("inf"),
                label_shares=False,  # its own process alone: no other user's to share with
            ),
            Resolver(
                platform.boot_time(), platform.clock_ticks, open_process=platform.open_process
            ),
            carbon=carbon,
        )
        self.target = self.table.register(pid, labels or {}, children, current_uid()).target
        meter = None
        if power:
            options = PowerOptions(
                sample_hz=sample_hz_from_environment(),
                window_hz=window_hz_from_environment(),
                # The daemon's variables: a host's sysfs mounted elsewhere (a container),
                # a tegrastats elsewhere than JetPack puts it.
                sysfs_path=from_environment(PowerOptions, "sysfs_path", os.environ),
                tegrastats_path=from_environment(PowerOptions, "tegrastats_path", os.environ),
            )
            if os.environ.get("EDGEWATT_POWERMETRICS"):  # macOS: another powermetrics
                options = replace(options, powermetrics_path=os.environ["EDGEWATT_POWERMETRICS"])
            found = power_sources.discover(options)
            if found:
                gap = max(5 * interval, 5.0)
                meter = PowerMeter(
                    found,
                    max_gap_s=gap,
                    sample_hz=options.sample_hz,
                    window_hz=options.window_hz,
                )
                meter.start(first_line_wait_s=0.0)  # the registration is an edge: no wait
        tcp_counted = sys.platform.startswith("linux")  # sock_diag, /proc/PID/fd

        accounting = _network_accounting() if network and tcp_counted else None
        pss = os.path.exists(f"/proc/{os.getpid()}/smaps_rollup")  # Linux 4.14 on
        self.sampler = Sampler(
            self.table,
            interval=interval,
            host_name=socket.gethostname(),
            # Its own process alone: no cgroup target.
            parts=Parts(
                ProcessTrees(platform),
                contributors(accounting, pss_proc="/proc" if pss else None, cgroups=False),
            ),
            power=meter,
            attribution=Attribution(None, 3600.0),
            on_pass=on_snapshot,
            carbon=carbon,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def id(self) -> str:
        return self.target.id

    @property
    def info(self) -> dict[str, Any]:
        return {}  # no daemon answered for it

    def helper_pids(self) -> set[int]:
        """The processes this sampling runs (a power source's tegrastats, powermetrics)."""
        power = self.sampler.power
        return power.child_pids() if power is not None else set()

    def start(self, thread: bool = True) -> LocalSampler:
        """A first reading (the next one has a rate), then a sampling thread, or none
        when the caller samples (:meth:`sample`) at its own cadence."""
        self.sampler.sample_once()
        if thread:
            self._thread = threading.Thread(
                target=self.sampler.run, args=(self._stop,), name="edgewatt-sampler", daemon=True
            )
            self._thread.start()
        return self

    def sample(self) -> Snapshot:
        """One pass now (by the thread when it runs, so passes never overlap)."""
        return self.sampler.sample_now()

    def snapshot(self) -> Snapshot:
        """The latest pass."""
        return self.sampler.snapshot

    def close(self) -> None:
        """A last pass (the summary then ends at the call), then stop."""
        self.sampler.sample_now()
        self._stop.set()
        if self._thread is not None:
            self.sampler.wake()
            self._thread.join(timeout=5)
        else:
            self.sampler.close()

    def exited(self) -> bool:
        return self.table.get(self.target.id).state == "exited"

    def reading(self) -> Reading | None:
        """A monitor's reading: of a pass now where no thread samples (the monitor's
        loop keeps the cadence), else of the thread's latest."""
        from edgewatt.client._readings import reading_after_exit, reading_from_snapshot

        snapshot = self.sample() if self._thread is None else self.snapshot()
        reading = reading_from_snapshot(snapshot)
        if reading is None and self.exited():
            reading = reading_after_exit(snapshot, self.stats())
        return reading

    def stats(self) -> dict[str, Any]:
        return self.table.describe(self.target.id).get("latest") or {}

    def summary(self, final_wait_s: float = 0.0) -> dict[str, Any]:
        """To now: a pass first while the target runs, as the daemon's ?fresh=1; then,
        with ``final_wait_s``, at most that long for final figures (?final=S)."""
        if self.table.get(self.target.id).state == "running":
            self.sampler.sample_now()
        self._wait_final(final_wait_s)
        return self.table.summary(self.target.id, self.sampler.logical_cpus)

    def _wait_final(self, timeout_s: float) -> None:
        power = self.sampler.power
        if timeout_s > 0 and power is not None and not self.table.final(self.target.id):
            power.wait_settled(time.monotonic(), timeout_s)

    def samples(self) -> list[dict[str, Any]]:
        return self.table.samples(self.target.id)

    def settled_energies(self, readings: list[Reading], wait_s: float = 0.0) -> list[Any]:
        """The device's energy at each reading's instant once final (the power trace's
        integral up to it: PowerMeter.settled_energy), waiting at most ``wait_s`` for the
        reading after the newest; None where not final yet, or not this sampler's."""
        power = self.sampler.power
        if power is None:
            return [None] * len(readings)
        if wait_s > 0 and readings:
            power.wait_settled(max(r.instant for r in readings), wait_s)
        return [
            power.settled_energy(r.instant) if r.source == "in-process" else None for r in readings
        ]

    def _edge(self) -> None:
        """A phase's edge: a pass for this target, as the daemon's; the host's memory
        and interfaces are then the thread's last pass's (without the thread, the
        caller's passes are the only ones: a whole pass)."""
        self.sampler.sample_now(self.target.id if self._thread is not None else None)

    def start_phase(self, name: str, depth: int | None = 0) -> int:
        """Start a phase at ``depth`` (None: inside every running one); its edge is a
        pass taken now, as the daemon does. The depth it took."""
        phase = self.table.start_phase(self.target.id, name, current_uid(), depth)
        self._edge()
        return phase.depth

    def end_phase(
        self, depth: int | None = None, final_wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        """End the running phase with a pass now; its figures, or None if none ran."""
        ended = self.table.end_phase(self.target.id, current_uid(), depth)
        if ended is None:
            return None
        self._edge()
        self._wait_final(final_wait_s)
        return self.table.phase_summary(self.target.id, ended, self.sampler.logical_cpus)
