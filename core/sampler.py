"""The sampling loop: once per interval, read every target and the host into a Snapshot.

This is the only place that touches /proc on the hot path; exporters and the API
read the snapshot and the target table.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.platforms import Platform, Tree
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution, PassEnergy, Usage
from edgewatt.core.power.meter import WINDOW_BOOST_S, PowerMeter, PowerSnapshot
from edgewatt.core.power.source import BOARD_GPU_LOADS, BOARD_SOURCES, Gpu, gpu_only
from edgewatt.core.sampling import cgroups, procfs, system
from edgewatt.core.sampling.cgroups import (
    Cgroup,
    CgroupEnded,
    CgroupGone,
    CgroupTree,
    InvalidCgroup,
    NotTheirs,
)
from edgewatt.core.sampling.membership import Membership
from edgewatt.core.sampling.network import NetworkAccounting
from edgewatt.core.sampling.process import TreeReading
from edgewatt.core.sampling.taskstats import TaskExits
from edgewatt.core.snapshot import HostSample, ProcessSample, SamplerStats, Snapshot

if TYPE_CHECKING:  # the daemon's alone: the client's portable path never loads it (fcntl)
    from edgewatt.core.sampling.cgroup_traffic import CgroupTraffic
from edgewatt.core.targets import Target, TargetTable

log = logging.getLogger(__name__)

# Phases exported per target as series (each phase name is a label value): enough for
# a dashboard's recent-phases table, bounded whatever a client sends.
EXPORTED_PHASES = 10
# Seconds a container's or unit's target waits for its cgroup to come back (a restart:
# podman and docker take under a second, a unit its RestartSec) before it ends.
RESTART_GRACE_S = 10.0
# Seconds between two lookups of a gone cgroup's name (each runs a runtime's CLI or
# walks the cgroup tree): at most 10 in a restart's grace, whatever the interval.
FOLLOW_LOOKUP_EVERY_S = 1.0


class Sampler:
    def __init__(
        self,
        table: TargetTable,
        *,
        interval: float,
        host_name: str,
        platform: Platform | None = None,
        on_pass: Callable[[Snapshot], None] | None = None,
        power: PowerMeter | None = None,
        attribution: Attribution | None = None,
        network: NetworkAccounting | None = None,
        exits: TaskExits | None = None,
        membership: Membership | None = None,
        carbon: CarbonIntensity | None = None,
        cgroup_traffic: CgroupTraffic | None = None,
        cgroup_mounts: cgroups.Mounts | None = None,
    ) -> None:
        self.table = table
        self.carbon = carbon
        self.interval = interval
        self.host_name = host_name
        self.platform: Platform = platform or LinuxPlatform()
        self._on_pass = on_pass
        self.power = power
        self.network = network
        self.exits = exits  # the kernel's exit records: exact figures at a target's exit
        self.membership = membership or Membership()  # who belongs to which target
        self.cgroup_traffic = cgroup_traffic  # every byte of cgroup targets' sockets
        # Why cgroup targets have no network figures where cgroup_traffic is None.
        self.cgroup_traffic_problem = "cgroup traffic is not counted"
        self._cgroup_mounts = cgroup_mounts  # read at the first cgroup target
        self._proc = getattr(self.platform, "proc", "/proc")  # cgroup members' stat files
        self._network_bytes: dict[str, tuple[int, int] | None] = {}
        self._network_packets: dict[str, tuple[int, int]] = {}  # cgroup targets' IP packets
        self._network_counts: dict[str, str] = {}  # what a cgroup target's figures count
        self.attribution = attribution or Attribution(None, 3600.0)
        self._last_target_cpu: dict[str, float] = {}
        self._gpu_pids: set[int] = set()  # members found holding a GPU device
        self._last_energy: tuple[float, float, dict[str, float]] | None = None
        self._host_busy_delta: float | None = None
        self._trees: dict[str, Tree] = {}
        self._attributes: dict[str, Mapping[str, str | int]] = {}
        self._relist = False  # a tree lost members or a target exited: list /proc anew
        self._last_cpu: system.HostCpu | None = None
        self._failed: set[str] = set()
        self._exited: dict[str, float] = {}  # found exited this pass: target id -> when
        self._end_reasons: dict[str, str] = {}  # ... why, for a cgroup target's summary
        # ... whether their exit sample has the kernel's figures, its peak RSS, and
        # whether every member's teardown is in them
        self._exit_modes: dict[str, tuple[bool, int | None, bool]] = {}
        self._overruns = 0
        self._errors = 0
        self._exits = 0
        self._sequence = 0
        self.logical_cpus = self.platform.logical_cpus()
        self.snapshot = Snapshot(time=time.time(), sequence=0, host=None)
        # Passes on demand (sample_now): counted as started and done under _edge.
        self._pass_lock = threading.Lock()
        self._edge = threading.Lock()
        self._wake = threading.Event()
        self._started = self._done = 0
        self._asked: set[str] | None = set()  # targets that asked for the next pass
        self._closed = False

    def run(self, stop: threading.Event) -> None:
        """Sample at a fixed cadence until ``stop`` is set (then call :meth:`wake`).
        Passes on demand (:meth:`sample_now`) run meanwhile in their callers' threads
        and leave the cadence as it was."""
        deadline = time.monotonic()
        try:
            while not stop.is_set():
                self._counted_pass(scheduled=True)
                deadline += self.interval
                if deadline < time.monotonic():
                    self._overruns += 1
                    deadline = time.monotonic()  # skip missed ticks rather than burst
                self._wake.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._pass_lock:  # a pass on demand in another thread ends first
                self.close()

    def wake(self) -> None:
        """End the wait between passes now: to stop."""
        self._wake.set()

    def sample_now(self, target_id: str | None = None, timeout_s: float = 2.0) -> Snapshot:
        """A pass that starts after this call, and its snapshot: the edge of a
        registration, a phase or a monitor's read is then a sample, not the nearest
        pass. It runs in the caller's thread (no hand-off to the sampling thread: a
        few hundred us for a few targets); asks that come together share one pass,
        which adds a row to the history of the targets that asked (``target_id``;
        None: every target) and leaves the others' to the regular passes."""
        with self._edge:
            if self._asked is not None:
                if target_id is None:
                    self._asked = None
                else:
                    self._asked.add(target_id)
            wanted = self._started + 1
        if not self._pass_lock.acquire(timeout=timeout_s):
            return self.snapshot  # a pass is stuck: the log says why; never block longer
        try:
            with self._edge:
                if self._done >= wanted or self._closed:  # a pass after the ask is done
                    return self.snapshot
            return self._pass(scheduled=False)
        finally:
            self._pass_lock.release()

    def _counted_pass(self, scheduled: bool) -> Snapshot:
        with self._pass_lock:  # one pass at a time, whoever runs it
            return self._pass(scheduled)

    def _pass(self, scheduled: bool) -> Snapshot:
        """One pass, with the pass lock held; a scheduled one records every target."""
        with self._edge:
            self._started += 1
            asked, self._asked = self._asked, set()
        try:
            return self.sample_once(None if scheduled else asked)
        except Exception:
            # A bug in one pass must not end sampling for good; the log says what.
            log.exception("sampling pass failed")
            return self.snapshot
        finally:
            with self._edge:
                self._done += 1

    def sample_once(self, record: set[str] | None = None) -> Snapshot:
        """One pass over every target; each gets a row in its history, or, with
        ``record``, only those targets (and any that exited)."""
        started = time.monotonic()
        if self.exits is not None:
            self.exits.update()
        self.membership.update()
        host = self._sample_host()
        power = None
        if self.power is not None:
            power = self.power.read(started, self._window_until(started))
        self.table.energy_period_s = power.period_s if power is not None else None
        children_of = self.platform.descendants(self._take_relist)
        running = self.table.running()
        readings = [(t, r) for t in running if (r := self._read_target(t, children_of)) is not None]
        self._attribute(started, power, readings)
        self._count_network(readings)
        samples = [self._sample(target, reading, power) for target, reading in readings]
        phases = self.table.record(
            samples, EXPORTED_PHASES, None if record is None else record | self._exited.keys()
        )
        for target_id in self._exited:  # their exit sample is taken: let them go
            self._drop(target_id)
        if phases:
            samples = [
                dataclasses.replace(s, phases=phases[s.target_id]) if s.target_id in phases else s
                for s in samples
            ]
        self._forget_missing({t.id for t in running})
        self.table.purge_exited(time.time())
        self._sequence += 1
        snapshot = Snapshot(
            time=time.time(),
            sequence=self._sequence,
            host=host,
            # An exit sample goes to the target's history only: its series leave the
            # exporters in the pass that finds the exit.
            processes=tuple(s for s in samples if s.target_id not in self._exited),
            exits=tuple(s for s in samples if s.target_id in self._exited),
            power=power,
            idle_power_w=self.attribution.idle_w_in_use if power is not None else None,
            energy_parts_j=dict(self.attribution.parts_j) if power is not None else {},
            carbon=self.carbon,
            host_name=self.host_name,
            stats=SamplerStats(
                duration_s=time.monotonic() - started,
                overruns=self._overruns,
                errors=self._errors,
                exits=self._exits,
                overflows=self._overflows(),
            ),
        )
        self.snapshot = snapshot
        try:
            if self._on_pass is not None:
                self._on_pass(snapshot)
        finally:
            # Marked only now, so a target the API calls exited is already gone from
            # what the exporters serve.
            network_exact = self.network is None or self.network.exact
            for target_id, when in self._exited.items():
                figures, rss_peak, teardowns = self._exit_modes.pop(target_id, (False, None, True))
                if figures and not network_exact:
                    log.info(
                        "target %s: a closed connection's final counts did not come (lost "
                        "notifications): its TCP bytes end at the last pass that saw it",
                        target_id,
                    )
                mode = "last-sample"
                if figures and network_exact:
                    mode = "exact" if teardowns else "exit-records"
                self.table.mark_exited(
                    target_id,
                    when,
                    exit_mode=mode,
                    rss_peak_bytes=rss_peak,
                    end_reason=self._end_reasons.pop(target_id, None),
                )
            self._exited.clear()
        return snapshot

    def _read_target(
        self, target: Target, children_of: Callable[[int], list[int]]
    ) -> TreeReading | None:
        tree = self._trees.get(target.id)
        if tree is None and target.cgroup_name is not None:
            tree = self._cgroup_tree(target)
            if tree is None:
                return None
            self._trees[target.id] = tree
        if tree is None:
            if target.handle is None:
                return None
            tree = self.platform.process_tree(
                target.handle,
                children=target.children,
                logical_cpus=self.logical_cpus,
                lineage=self.membership.track(target.id, target.pid) if target.children else None,
                exits=self.exits,
            )
            self._trees[target.id] = tree
        try:
            reading = tree.sample(children_of)
        except CgroupEnded as ended:
            self._relist = True
            self._exits += 1
            self._end(target, ended.reason)
            return self._exit_reading(target, tree)
        except procfs.NoSuchProcess:
            self._relist = True
            self._exited.setdefault(target.id, time.time())
            self._exits += 1
            log.info("target %s (pid %d) exited", target.id, target.pid)
            return self._exit_reading(target, tree)
        except (OSError, ValueError, CgroupGone) as exc:
            # One failing target never stops the others; say so once per target.
            self._errors += 1
            if target.id not in self._failed:
                self._failed.add(target.id)
                log.warning("sampling target %s (pid %d) failed: %s", target.id, target.pid, exc)
            return None
        self._failed.discard(target.id)
        self._relist = self._relist or tree.lost_members
        if (
            isinstance(tree, CgroupTree)
            and not reading.pids
            and tree.cgroup.run_is_gone(self._proc)
        ):
            # `edgewatt run --cgroup` was killed (SIGKILL) before it could unregister:
            # its emptied cgroup and target go, as it would have removed them.
            removed = "removed" if tree.cgroup.remove() else "left in place"
            self._exits += 1
            self._end(target, f"its edgewatt run is gone and its cgroup is empty ({removed})")
            return self._exit_reading(target, tree)
        return reading

    def _cgroup_tree(self, target: Target) -> CgroupTree | None:
        """A cgroup target's reader; None (and the target ends) when its cgroup is gone
        and its name names none of the registrant's."""
        if self._cgroup_mounts is None:
            self._cgroup_mounts = cgroups.mounts()
        mounts, name = self._cgroup_mounts, target.cgroup_name
        assert name is not None

        from edgewatt.core.sampling import cgroup_names  # the daemon's alone (grp)

        def locate() -> Cgroup | None:
            """The cgroup the name names now, if the registrant may have it (checked
            as at registration: NotTheirs says why not); None while its user's lookup
            bound holds it back (lookups.py)."""
            if not self.table.lookups.follow(target.uid):
                return None
            try:
                found = cgroup_names.locate(name, mounts, uid=target.uid)
            except (InvalidCgroup, OSError):
                return None
            refused = cgroup_names.refusal(name, found, target.uid, target.gids)
            if refused is not None:
                raise NotTheirs(refused)
            return found

        # A plain cgroup path ends with its cgroup; a container or service restarting
        # has none for a moment: its target waits for the next one.
        follow = locate if name.kind != "cgroup" else None
        try:
            cgroup: Cgroup | None = Cgroup(target.cgroup or "", mounts)
        except (InvalidCgroup, CgroupGone, OSError):
            try:
                cgroup = follow() if follow is not None else None
            except NotTheirs as refused:
                self._end(target, f"its name now names a cgroup not the registrant's: {refused}")
                return None
        if cgroup is None:
            self._end(target, f"its cgroup {target.cgroup} is gone")
            return None
        return CgroupTree(
            cgroup,
            self.logical_cpus,
            resolve=follow,
            proc=self._proc,
            restart_grace_s=RESTART_GRACE_S,
            lookup_every_s=FOLLOW_LOOKUP_EVERY_S,
        )

    def _end(self, target: Target, reason: str) -> None:
        """A cgroup target ends in this pass, for ``reason`` (its summary says it)."""
        self._exited.setdefault(target.id, time.time())
        self._end_reasons[target.id] = reason
        log.info("target %s (%s) ends: %s", target.id, target.executable, reason)

    def _overflows(self) -> dict[str, int]:
        counts = {}
        if self.exits is not None:
            counts["taskstats"] = self.exits.overflows
        if self.network is not None and self.network.destroyed is not None:
            counts["tcp_destroy"] = self.network.overflows
        if self.membership.events is not None:
            counts["proc_events"] = self.membership.overflows
        return counts

    def _exit_reading(self, target: Target, tree: Tree) -> TreeReading | None:
        """The target's last reading, at its exit: from the kernel's exit records where
        they are complete ("exact"), else as the last pass saw it ("last-sample").
        Recorded like any sample, so the summary ends at the exit, and the pass's
        network accounting and attribution count it (its sockets' final bytes, its
        share of the energy up to the exit)."""
        last = tree.last
        if last is None:
            log.info("target %s (pid %d) exited before its first sample", target.id, target.pid)
            return None
        figures = None
        if self.exits is not None:
            figures = tree.exit_figures()
            if figures is None and target.cgroup_name is None:
                log.info(
                    "target %s (pid %d): the kernel's exit records are incomplete "
                    "(it started before the listener, or records were lost): its "
                    "figures end at the last pass",
                    target.id,
                    target.pid,
                )
        # Whether its sockets' final counts all came is known after this pass's network
        # accounting: the mode is settled when the exit is recorded (sample_once). A
        # cgroup's counters are final once it is empty: its last reading then is exact.
        self._exit_modes[target.id] = (
            figures is not None or (target.cgroup_name is not None and not last.pids),
            figures.rss_peak_bytes if figures is not None else None,
            figures is None or figures.teardowns_counted,
        )
        if figures is None:
            return dataclasses.replace(last, cpu_utilization=None, pids=(), idle_pids=frozenset())
        read, write = last.read_bytes, last.write_bytes
        user, system = _final_cpu(
            (last.cpu_user_s, last.cpu_system_s), (figures.cpu_user_s, figures.cpu_system_s)
        )
        return dataclasses.replace(
            last,
            time=max(last.time, figures.time),
            cpu_user_s=user,
            cpu_system_s=system,
            cpu_utilization=None,
            read_bytes=None if read is None else max(read, figures.read_bytes),
            write_bytes=None if write is None else max(write, figures.write_bytes),
            pids=(),
            idle_pids=frozenset(),
        )

    def _attribute(
        self,
        now: float,
        power: PowerSnapshot | None,
        readings: list[tuple[Target, TreeReading]],
    ) -> None:
        """Share the energy measured since the last pass among the targets."""
        cpu_now = {t.id: r.cpu_user_s + r.cpu_system_s for t, r in readings}
        cpu_before, self._last_target_cpu = self._last_target_cpu, cpu_now
        if power is None or power.host_energy_j is None:
            return
        gpu_energy = {
            rail.id: rail.energy_j
            for rail in power.rails
            if rail.energy_j is not None and any(g.id == rail.id for g in power.gpus)
        }
        # A board's GPU rail (Jetson): its dynamic part goes to the targets holding the
        # GPU, by their CPU time (docs/attribution.md).
        gpu_rails = {
            rail.id: rail.energy_j
            for rail in power.rails
            if rail.energy_j is not None and rail.source in BOARD_SOURCES and gpu_only(rail.name)
        }
        gpu_energy.update(gpu_rails)
        measured_at = power.measured_at if power.measured_at is not None else now
        if self._last_energy is not None and measured_at <= self._last_energy[0]:
            return  # no new power reading since the last pass
        before, self._last_energy = (
            self._last_energy,
            (measured_at, power.host_energy_j, gpu_energy),
        )
        if before is None or self._host_busy_delta is None:
            return
        measured = PassEnergy(
            seconds=measured_at - before[0],
            device_j=max(0.0, power.host_energy_j - before[1]),
            host_busy_cpu_s=self._host_busy_delta,
            gpu_j={k: max(0.0, j - before[2].get(k, j)) for k, j in gpu_energy.items()},
            gpu_load={g.id: g.utilization or 0.0 for g in power.gpus if g.id in gpu_energy},
        )
        # Only while the GPU is busy (GR3D above 0 at the pass's edge, where known):
        # the rail's dynamic part while it idles is no holder's work (unattributed).
        holders = self._gpu_holders(readings) if gpu_rails and _gpu_busy(power) else set()
        usage = {}
        for t, r in readings:
            cpu_s = max(0.0, cpu_now[t.id] - cpu_before.get(t.id, cpu_now[t.id]))
            gpu = {g.id: load for g, load, _ in _gpu_use(power, r) if g.id in gpu_energy}
            if t.id in holders:
                gpu.update(dict.fromkeys(gpu_rails, cpu_s))  # shared by CPU time
            usage[t.id] = Usage(cpu_s=cpu_s, gpu=gpu)
        self.attribution.update(measured_at, measured, usage)

    def _gpu_holders(self, readings: list[tuple[Target, TreeReading]]) -> set[str]:
        """Targets with a member holding a GPU device open. A process that opened one
        keeps it (a CUDA context): a pid found once is not scanned again."""
        known, self._gpu_pids = self._gpu_pids, set()
        holders = set()
        for target, reading in readings:
            for pid in reading.pids:
                if pid in known or self.platform.holds_gpu(pid):
                    self._gpu_pids.add(pid)
                    holders.add(target.id)
        return holders

    def _count_network(self, readings: list[tuple[Target, TreeReading]]) -> None:
        self._network_bytes = {}
        processes = [(t, r) for t, r in readings if t.cgroup_name is None]
        if self.cgroup_traffic is not None and len(processes) < len(readings):
            self._count_cgroup_traffic(self.cgroup_traffic, readings)
        if self.network is None:
            return
        try:
            self._network_bytes.update(
                self.network.sample(
                    {t.id: r.pids for t, r in processes},
                    idle=frozenset().union(*(r.idle_pids for _, r in processes)),
                )
            )
        except OSError as exc:  # netlink refused this pass: figures absent, retried next
            self._errors += 1
            log.warning("reading TCP socket counters failed: %s", exc)

    def _count_cgroup_traffic(
        self, traffic: CgroupTraffic, readings: list[tuple[Target, TreeReading]]
    ) -> None:
        for target, reading in readings:
            tree = self._trees.get(target.id)
            if isinstance(tree, CgroupTree):
                traffic.watch(
                    target.id, tree.cgroup.path, tree.cgroup.level, reading.pids, target.uid
                )
        for target_id, counts in traffic.sample().items():
            if target_id in self._trees:
                self._network_bytes[target_id] = (counts.sent_bytes, counts.received_bytes)
                self._network_packets[target_id] = (counts.sent_packets, counts.received_packets)
                self._network_counts[target_id] = traffic.kind(target_id)

    def _network_unknown(self, target_id: str) -> str | None:
        """Why a cgroup target has no network figures (None: it has them)."""
        if target_id in self._network_bytes:
            return None
        if self.cgroup_traffic is None:
            return self.cgroup_traffic_problem
        return self.cgroup_traffic.problem(target_id) or "not counted yet"

    def _sample(
        self, target: Target, reading: TreeReading, power: PowerSnapshot | None
    ) -> ProcessSample:
        attributes = self._attributes.get(target.id)
        if attributes is None:
            attributes = self._target_attributes(target)
            self._attributes[target.id] = attributes
        tree = self._trees.get(target.id)
        usage = tree.usage if isinstance(tree, CgroupTree) else None
        network = self._network_bytes.get(target.id) or (None, None)
        gpu = _gpu_totals(power, reading)
        return ProcessSample(
            target_id=target.id,
            pid=target.pid,
            executable=target.executable,
            attributes=attributes,
            time=reading.time,
            cpu_user_s=reading.cpu_user_s,
            cpu_system_s=reading.cpu_system_s,
            cpu_utilization=reading.cpu_utilization,
            cpu_mode_utilization=reading.cpu_mode_utilization,
            memory_rss_bytes=reading.rss_bytes,
            memory_virtual_bytes=reading.vms_bytes,
            disk_read_bytes=reading.read_bytes,
            disk_write_bytes=reading.write_bytes,
            threads=reading.threads,
            open_fds=reading.open_fds,
            processes=reading.processes,
            power_w=self.attribution.power_w.get(target.id) if self.power else None,
            energy_j=self.attribution.energy_j.get(target.id, 0.0) if self.power else None,
            device_energy_j=self._device_energy(target, reading, power),
            network_transmit_bytes=network[0],
            network_receive_bytes=network[1],
            gpu_utilization=gpu[0],
            gpu_memory_bytes=gpu[1],
            members=reading.pids,
            cgroup=tree.cgroup.path if isinstance(tree, CgroupTree) else None,
            cgroup_memory=(usage.memory_bytes, usage.memory_peak_bytes) if usage else (None, None),
            cgroup_packets=self._network_packets.get(target.id),
            network_counts=self._network_counts.get(target.id),
            network_unknown=self._network_unknown(target.id)
            if isinstance(tree, CgroupTree)
            else None,
        )

    def _target_attributes(self, target: Target) -> dict[str, str | int]:
        name = target.cgroup_name
        if name is None:
            identity: dict[str, str | int] = {
                "process.pid": target.pid,
                "process.executable.name": target.executable,
            }
        elif name.kind == "container":  # OpenTelemetry's container attributes
            identity = {"container.name": name.name, "container.runtime.name": name.runtime}
        elif name.kind == "unit":
            identity = {"edgewatt.target.unit": name.name}
        else:
            identity = {"edgewatt.target.cgroup": name.name}
        return {
            **identity,
            "edgewatt.target.id": target.id,
            "host.name": self.host_name,
            **target.labels,
        }

    def _device_energy(
        self, target: Target, reading: TreeReading, power: PowerSnapshot | None
    ) -> float | None:
        """The device's energy at the sample's own instant: the pass's, or, for an exit
        sample (dated at the exit by the kernel's records), the energy up to the exit."""
        if power is None or self.power is None:
            return None
        if target.id in self._exited:
            exited_at = time.monotonic() - max(0.0, time.time() - reading.time)
            at_exit = self.power.energy_at(exited_at)
            if at_exit is not None:
                return at_exit
        return power.host_energy_j

    def _window_until(self, started: float) -> float | None:
        """Until when (monotonic) the youngest running phase (a ``track`` call, an FL
        round) is young enough for the power reader's window rate; None: none is."""
        age = self.table.youngest_phase_age()
        if age is None or age >= WINDOW_BOOST_S:
            return None
        return started + WINDOW_BOOST_S - max(0.0, age)

    def _sample_host(self) -> HostSample | None:
        try:
            cpu, memory, network = self.platform.read_host()
        except (OSError, ValueError, KeyError) as exc:
            log.warning("reading host figures failed: %s", exc)
            return None
        utilization = None
        self._host_busy_delta = None
        last, self._last_cpu = self._last_cpu, cpu
        if last is not None and cpu.total_seconds > last.total_seconds:
            busy = max(0.0, cpu.busy_seconds - last.busy_seconds)
            self._host_busy_delta = busy
            utilization = min(1.0, busy / (cpu.total_seconds - last.total_seconds))
        cores: tuple[float, ...] = ()
        if last is not None and len(last.per_cpu) == len(cpu.per_cpu):  # none hot-plugged
            cores = tuple(
                min(1.0, max(0.0, b1 - b0) / (t1 - t0)) if t1 > t0 else 0.0
                for (b0, t0), (b1, t1) in zip(last.per_cpu, cpu.per_cpu)
            )
        return HostSample(cpu, utilization, memory, network, core_utilization=cores)

    def _take_relist(self) -> bool:
        relist, self._relist = self._relist, False
        return relist

    def _forget_missing(self, running_ids: set[str]) -> None:
        for target_id in list(self._trees):
            if target_id not in running_ids:
                self._drop(target_id)

    def _drop(self, target_id: str) -> None:
        tree = self._trees.pop(target_id, None)
        if tree is not None:
            tree.close()
        self._attributes.pop(target_id, None)
        self._failed.discard(target_id)
        self._last_target_cpu.pop(target_id, None)
        self._network_packets.pop(target_id, None)
        self._network_counts.pop(target_id, None)
        self.membership.forget(target_id)
        self.attribution.forget(target_id)
        if self.network is not None:
            self.network.forget(target_id)
        if self.cgroup_traffic is not None:
            self.cgroup_traffic.forget(target_id)

    def close(self) -> None:
        self._closed = True
        for target_id in list(self._trees):
            self._drop(target_id)
        if self.power is not None:
            self.power.close()
        if self.network is not None:
            self.network.close()
        if self.cgroup_traffic is not None:
            self.cgroup_traffic.close()
        if self.exits is not None:
            self.exits.close()
        self.membership.close()
        self.platform.close()


def _gpu_use(power: PowerSnapshot, reading: TreeReading) -> list[tuple[Gpu, float, int | None]]:
    """(GPU, SM load 0..1, memory bytes) of a target's processes on each GPU that
    reports per-process figures."""
    result = []
    for gpu in power.gpus:
        if not gpu.processes:
            continue
        mine = [gpu.processes[pid] for pid in reading.pids if pid in gpu.processes]
        load = sum(p.utilization or 0.0 for p in mine)
        sizes = [p.memory_bytes for p in mine if p.memory_bytes is not None]
        result.append((gpu, load, sum(sizes) if sizes else None))
    return result


def _gpu_totals(
    power: PowerSnapshot | None, reading: TreeReading
) -> tuple[float | None, int | None]:
    """A target's GPU load (summed over GPUs) and memory bytes, where some GPU reports
    per-process figures."""
    if power is None or not any(g.processes for g in power.gpus):
        return None, None
    use = _gpu_use(power, reading)
    sizes = [m for _, _, m in use if m is not None]
    return sum(load for _, load, _ in use), sum(sizes) if sizes else 0


def _gpu_busy(power: PowerSnapshot) -> bool:
    """Whether the board's GPU is busy at the edge: its load (GR3D) above 0, or unknown."""
    loads = [g.utilization for g in power.gpus if g.id in BOARD_GPU_LOADS]
    known = [load for load in loads if load is not None]
    return not known or max(known) > 0


def _final_cpu(last: tuple[float, float], final: tuple[float, float]) -> tuple[float, float]:
    """(user, system) at a target's exit: the larger CPU time of the last reading and
    the exit figures, whole, split as the exit figures split it where neither mode then
    goes below the last reading (both are counters). /proc and the exit records split
    the same runtime between user and system differently, so a maximum per mode
    over-counts: by 33 ms once, in a CI run."""
    total = max(sum(last), sum(final))
    user = max(last[0], min(final[0], total - last[1]))
    return user, total - user
