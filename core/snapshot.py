"""Immutable results of one sampling pass: what exporters and the API read.

The sampler builds a new :class:`Snapshot` every interval and swaps it in whole;
readers (OTel callbacks, /v1 handlers) never see a half-written one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.system import HostCpu, HostMemory, InterfaceBytes
from edgewatt.core.platforms.context import DeviceContext
from edgewatt.core.power.values import PowerSnapshot


class PhaseFigures(NamedTuple):
    """A phase as the sampler exports it each pass (ProcessSample.phases)."""

    name: str
    running: bool
    energy_j: float | None  # attributed in it
    duration_s: float  # edge to edge, so far while it runs
    power_max_w: float | None  # the device's highest power in it, at the sensor's rate

    @property
    def running_marker(self) -> int | None:
        """1 while it runs; None once ended (edgewatt.process.phase then has no point)."""
        return 1 if self.running else None


@dataclass(**SLOTS)
class ProcessSample:
    """One target (its descendants included unless registered with children=false).

    Not frozen, though nothing changes a sample once it is in a snapshot: one is built
    per target per pass, and a frozen dataclass's __init__ costs four times as much.
    """

    target_id: str
    pid: int
    executable: str
    attributes: Mapping[str, str | int]  # the series' identity: pid, names, user labels
    time: float  # unix seconds
    cpu_user_s: float  # cumulative, never decreasing
    cpu_system_s: float
    cpu_utilization: float | None  # share of all cores over the last interval, 0..1
    memory_rss_bytes: int  # RSS summed over the members: a shared page once per process
    memory_virtual_bytes: int
    disk_read_bytes: int | None  # None: the kernel does not show this process's I/O
    disk_write_bytes: int | None
    threads: int
    open_fds: int | None
    processes: int  # the target and its live descendants
    power_w: float | None = None  # attributed over the last pass (docs/attribution.md)
    energy_j: float | None = None  # attributed since registration, never decreasing
    device_energy_j: float | None = None  # the device's measured energy at this edge
    network_transmit_bytes: int | None = None  # TCP bytes acked by peers (sock_diag)
    network_receive_bytes: int | None = None  # TCP bytes received
    gpu_utilization: float | None = None  # SM load summed over GPUs (NVML), 0..n_gpus
    gpu_memory_bytes: int | None = None  # GPU memory held by its processes (NVML)
    phases: tuple[PhaseFigures, ...] = ()  # the last few
    members: tuple[int, ...] = ()  # pids of its live members (membership.py)
    # A cgroup target's cgroup now, and its memory (current, kernel's peak) bytes.
    cgroup: str | None = None
    cgroup_memory: tuple[int | None, int | None] = (None, None)
    cgroup_packets: tuple[int, int] | None = None  # IP packets sent, received (nftables)
    # What its network figures count where not TCP payload (cgroup_traffic.py's kinds).
    network_counts: str | None = None
    # A cgroup target's network figures the daemon cannot get: why (they are absent).
    network_unknown: str | None = None
    # cpu_utilization by mode (user, system), adding up to it; None where it is None.
    cpu_mode_utilization: tuple[float, float] | None = None
    # PSS summed over the members (shared pages split among their sharers: what the
    # work holds) and the largest member's RSS; None where not read (sampling/pss.py).
    memory_pss_bytes: int | None = None
    memory_rss_largest_bytes: int | None = None
    # The unix time those two were read at (``time`` then): a target whose reads cost
    # more is read less often (sampling/pss.py). None where not read.
    memory_pss_read_at: float | None = None
    root_execs: int = 0  # 1 once its first process, a held fork, exec'd (held_fork.py)
    # The channels (core/channels.py), each its declaration's name and in its order
    # (tests/test_channels.py); None where not read.
    # Context switches of its processes, cumulative: voluntary (they waited: I/O, a
    # lock, a sleep) and involuntary (preempted).
    context_switches_voluntary: int | None = None
    context_switches_involuntary: int | None = None
    page_faults_minor: int | None = None  # pages mapped without a read from storage
    # ``time`` on the monotonic clock (None: not known): the instant its device energy
    # is at, from which its history's durations come.
    monotonic: float | None = None

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_system_s

    @property
    def cpu_user_utilization(self) -> float | None:
        """The user mode's share of cpu_utilization; None where that is None (a
        target's last sample keeps its split, not its rate)."""
        return self._mode_share(0)

    @property
    def cpu_system_utilization(self) -> float | None:
        return self._mode_share(1)

    def _mode_share(self, mode: int) -> float | None:
        by_mode = self.cpu_mode_utilization
        return None if self.cpu_utilization is None or by_mode is None else by_mode[mode]

    def redated(
        self, time: float, monotonic: float | None, device_energy_j: float | None
    ) -> ProcessSample:
        """A copy at another instant: the same figures, read again unchanged (a target
        that did not run), where the device's energy moved on."""
        copy = _copy_sample(self)
        copy.time, copy.monotonic, copy.device_energy_j = time, monotonic, device_energy_j
        return copy


def _copier(cls: type) -> Callable[[Any], Any]:
    """A function copying an instance of dataclass ``cls`` field by field, written out as
    dataclasses writes an __init__: a third of what calling the __init__ costs (0.4
    against 1.2 us for ProcessSample's 34 fields), for every waiting target each pass."""
    body = "".join(f"\n    c.{f.name} = s.{f.name}" for f in fields(cls))
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    exec(f"def copy(s):\n    c = new(cls){body}\n    return c", namespace)
    return namespace["copy"]


_copy_sample = _copier(ProcessSample)


@dataclass(frozen=True, **SLOTS)
class HostSample:
    cpu: HostCpu
    cpu_utilization: float | None  # share of all cores busy over the last interval
    memory: HostMemory
    network: Mapping[str, InterfaceBytes]
    # Each online logical CPU's by its number, 0..1, same interval; None: came online
    # since the last pass.
    core_utilization: Mapping[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True, **SLOTS)
class SamplerStats:
    duration_s: float  # wall time the last pass took
    overruns: int  # passes that took longer than the interval, since start
    errors: int  # per-target read failures other than exit, since start
    exits: int = 0  # targets that exited while registered, since start
    # Netlink listeners for exact exits (absent: not running): drains that found
    # notifications lost to a full socket buffer, since start.
    overflows: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, **SLOTS)
class Snapshot:
    time: float  # unix seconds at the end of the pass
    sequence: int
    host: HostSample | None
    processes: tuple[ProcessSample, ...] = ()
    # The final samples of targets found exited this pass: in no live series (the
    # exporters drop them), but a store that keeps history writes them as last points.
    exits: tuple[ProcessSample, ...] = ()
    power: PowerSnapshot | None = None
    idle_power_w: float | None = None  # the attribution baseline in use
    # The measured energy since start by part (attributed, idle, unattributed): they
    # add up to what the attribution measured (power/attribution.py).
    energy_parts_j: Mapping[str, float] = field(default_factory=dict)
    carbon: CarbonIntensity | None = None  # None: no carbon figure anywhere
    stats: SamplerStats = field(default_factory=lambda: SamplerStats(0.0, 0, 0))
    host_name: str = ""  # the device's host.name, on every series ("": tests without one)
    # Per target id: the pass (its sequence) whose figures its sample still carries,
    # all but the time and device energy (a target that waits gets a copy of its last
    # sample): a renderer that kept its lines from that pass on need not look again.
    # Absent: not known (look).
    figures_since: Mapping[str, int] = field(default_factory=dict)
    context: DeviceContext | None = None  # the device's latest read (None: not read yet)
