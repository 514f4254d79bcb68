"""The /healthz document, built from the parts' public status: the last snapshot, the
power reader's ``PowerMeter.status()``, the outputs' statuses by name (output.py), and
the daemon's other facts: what the collectors could start, the table's membership, the
state file's last error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgewatt.core import __version__
from edgewatt.core.power.values import PowerStatus
from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter.collectors import Collectors
from edgewatt.exporter.output import OutputStatus

# Outputs /healthz shows under their name, null where the config turns them off.
SHOWN_OUTPUTS = ("influx",)


@dataclass(frozen=True)
class Facts:
    """What /healthz says of the daemon beside its power reader and outputs."""

    started: float  # epoch seconds
    interval_s: float
    min_interval_s: float
    exited_retention_s: float
    logical_cpus: int
    collectors: Collectors
    membership: str
    other_namespaces: bool
    state_error: str | None
    state_deferred: int = 0
    power_aside: Mapping[str, str] = field(default_factory=dict)


def document(
    snapshot: Snapshot,
    power: PowerStatus,
    outputs: Mapping[str, OutputStatus],
    facts: Facts,
    now: float,
) -> dict[str, Any]:
    """GET /healthz at ``now`` (epoch seconds); ``power`` is ``PowerStatus()`` where no
    power source runs; ``outputs`` holds the statuses of the outputs that report one."""
    speaking = list(snapshot.power.sources) if snapshot.power else []
    # A source found at startup that no longer speaks (a tegrastats restarting,
    # a sensor gone): its hw_* series are absent meanwhile, so health says so.
    silent = [name for name in power.sources if name not in speaking]
    return {
        "status": "degraded" if silent or facts.state_error else "ok",
        "version": __version__,
        "uptime_s": round(now - facts.started, 3),
        "targets": len(snapshot.processes),
        "last_sample_age_s": round(now - snapshot.time, 3),
        "interval_s": facts.interval_s,
        "min_interval_s": facts.min_interval_s,
        # How long an ended target stays readable (`edgewatt status` says so).
        "exited_retention_s": facts.exited_retention_s,
        "logical_cpus": facts.logical_cpus,
        "power_sources": speaking,
        "power_sources_silent": silent,
        # Sources that loaded but cannot measure here, and why: the next were used.
        "power_sources_aside": dict(facts.power_aside),
        # The power reader's rate now (chosen on the device unless configured), and
        # what a reading costs its thread in CPU, wake included (None: not yet known).
        "power_sample_hz": power.sample_hz,
        # What reads the stream: "native" (built at install), "python" or "none".
        "power_reader": power.reader,
        # Its thread's priority: "fifo", "nice -N" (run ahead of the work it measures,
        # where the daemon may: the unit's LimitRTPRIO=1) or "process".
        "power_reader_priority": power.reader_priority,
        "power_reading_cpu_us": round(power.reading_cpu_s * 1e6, 1)
        if power.reading_cpu_s
        else None,
        # Young windows' rate (0: none), the readings taken at it since start, and
        # the windows opened when its allowance was spent (read at the steady rate).
        "power_window_hz": power.window_hz,
        "power_window_readings": power.window_readings,
        "power_windows_refused": power.windows_refused,
        # Whether a target's figures end at its exit (the kernel's exit records and
        # TCP destroy notifications, CAP_NET_ADMIN) or at the last pass before it.
        "exit_figures": "exact" if facts.collectors.exact_exits else "last-sample",
        # How a target's descendants are learnt (facts/membership.py).
        "membership": facts.membership,
        # Cgroup targets' network figures: None where counted, else why not.
        "cgroup_traffic": facts.collectors.cgroup_traffic_problem,
        "cgroup_other_namespaces": facts.other_namespaces,
        # Why the registrations could not be saved (null: the last save worked).
        "state_error": facts.state_error,
        # Changes the state write budget holds back: persisted as it refills.
        "state_deferred": facts.state_deferred,
        # The InfluxDB push (null where none is configured): lines waiting in the
        # buffer, written, dropped from a full buffer, refused by the server.
        **{n: dict(outputs[n].shown) if n in outputs else None for n in SHOWN_OUTPUTS},
    }
