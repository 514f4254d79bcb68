"""Per-process power and energy from the device's measured energy (docs/attribution.md).

Per sampling pass of length dt, with E the device energy measured over it:
  dynamic = max(0, E - idle_w * dt)                       the energy above idle
  gpu     = min(dynamic, sum of each GPU's energy above its own idle)
  cpu     = dynamic - gpu
  target i gets  cpu * c_i / max(C, sum c)  +  sum over GPUs k of  gpu_k * u_ik / max(U_k, sum u_k)
where c_i is the CPU time target i spent in the pass, C the host's busy CPU time, u_ik
the SM load of target i's processes on GPU k and U_k that GPU's load. Both shares sum to
at most 1, so the targets together never get more than ``dynamic``, which never exceeds
E: attributed power never exceeds the measured device power. Idle power is configured
or estimated as the lowest pass-average power seen within a sliding window.

A pass on demand (an edge) reads only the targets that asked; the others wait. A
waiting target's interval runs from its last reading to its next: there it gets its
share of the dynamic energy of every pass in between (each pass's own dynamic, summed)
by its CPU time against the host's busy CPU time over that same span.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from edgewatt.core.power.source import BOARD_GPU_LOADS, BOARD_SOURCES, gpu_only

if TYPE_CHECKING:
    from edgewatt.core.power.meter import PowerSnapshot
    from edgewatt.core.power.source import Gpu


class Baseline:
    """Idle power: configured, or the lowest pass-average seen within a window."""

    def __init__(self, idle_w: float | None, window_s: float) -> None:
        self.configured = idle_w
        self.window_s = window_s
        self._mins: deque[tuple[float, float]] = deque()  # (time, watts), watts increasing

    @property
    def value(self) -> float | None:
        if self.configured is not None:
            return self.configured
        return self._mins[0][1] if self._mins else None

    def observe(self, t: float, watts: float) -> float:
        if self.configured is not None:
            return self.configured
        # A monotonic deque keeps the sliding minimum in O(1) amortised per pass.
        while self._mins and self._mins[-1][1] >= watts:
            self._mins.pop()
        self._mins.append((t, watts))
        while self._mins[0][0] < t - self.window_s:
            self._mins.popleft()
        return self._mins[0][1]


@dataclass(frozen=True)
class Usage:
    """What one target used during a pass."""

    cpu_s: float
    gpu: Mapping[str, float] = field(default_factory=dict)  # gpu id -> SM load 0..1


@dataclass(frozen=True)
class PassEnergy:
    """What was measured during a pass."""

    seconds: float
    device_j: float
    host_busy_cpu_s: float
    gpu_j: Mapping[str, float] = field(default_factory=dict)  # energy per GPU
    gpu_load: Mapping[str, float] = field(default_factory=dict)  # load per GPU, 0..1


def split(
    measured: PassEnergy,
    idle_w: float,
    gpu_idle_w: Mapping[str, float],
    usage: Mapping[str, Usage],
) -> dict[str, float]:
    """Joules per target for one pass; their sum never exceeds measured.device_j."""
    if measured.seconds <= 0 or not usage:
        return dict.fromkeys(usage, 0.0)
    dynamic = max(0.0, measured.device_j - idle_w * measured.seconds)
    gpu_dynamic = {
        k: max(0.0, j - gpu_idle_w.get(k, 0.0) * measured.seconds)
        for k, j in measured.gpu_j.items()
    }
    gpu_total = math.fsum(gpu_dynamic.values())
    gpu_part = min(dynamic, gpu_total)
    cpu_part = dynamic - gpu_part
    cpu_sum = math.fsum(max(0.0, u.cpu_s) for u in usage.values())
    cpu_denominator = max(measured.host_busy_cpu_s, cpu_sum)
    result = {}
    for target, u in usage.items():
        joules = cpu_part * max(0.0, u.cpu_s) / cpu_denominator if cpu_denominator > 0 else 0.0
        for k, share_of_gpu in gpu_dynamic.items():
            if gpu_total <= 0 or share_of_gpu <= 0:
                continue
            loads = math.fsum(max(0.0, v.gpu.get(k, 0.0)) for v in usage.values())
            denominator = max(measured.gpu_load.get(k, 0.0), loads)
            if denominator > 0:
                energy_k = gpu_part * share_of_gpu / gpu_total
                joules += energy_k * max(0.0, u.gpu.get(k, 0.0)) / denominator
        result[target] = joules
    # Float rounding must not break the invariant.
    total = math.fsum(result.values())
    if total > dynamic > 0:
        result = {t: j * dynamic / total for t, j in result.items()}
    return result


# The parts every measured joule is accounted as, per pass (conservation):
# measured = attributed + idle + unattributed.
ENERGY_PARTS = ("attributed", "idle", "unattributed")


def accounted(measured: PassEnergy, idle_w: float, shares: Mapping[str, float]) -> dict[str, float]:
    """One pass's measured energy as its three parts, which add up to it: idle (at
    most the measured), attributed (the targets' shares), unattributed (the rest)."""
    device = max(0.0, measured.device_j)
    idle = min(device, max(0.0, idle_w) * measured.seconds)
    attributed = min(device - idle, math.fsum(shares.values()))
    return {"attributed": attributed, "idle": idle, "unattributed": device - idle - attributed}


@dataclass(frozen=True)
class Totals:
    """The passes' figures summed since the start: seconds, dynamic joules (each pass's
    energy above its idle), the host's busy CPU seconds, each GPU's dynamic joules."""

    seconds: float = 0.0
    dynamic_j: float = 0.0
    busy_cpu_s: float = 0.0
    gpu_j: Mapping[str, float] = field(default_factory=dict)
    # The energy given to no target yet, as of the end of the last pass (parts_j's):
    # what a waiting group's span left unattributed is at most its growth since.
    unattributed_j: float = 0.0

    def plus(self, measured: PassEnergy, idle_w: float, gpu_idle_w: Mapping[str, float]) -> Totals:
        gpu = dict(self.gpu_j)
        for k, j in measured.gpu_j.items():
            gpu[k] = gpu.get(k, 0.0) + max(0.0, j - gpu_idle_w.get(k, 0.0) * measured.seconds)
        return Totals(
            self.seconds + measured.seconds,
            self.dynamic_j + max(0.0, measured.device_j - idle_w * measured.seconds),
            self.busy_cpu_s + measured.host_busy_cpu_s,
            gpu,
            self.unattributed_j,
        )

    def since(self, start: Totals, gpu_load: Mapping[str, float]) -> PassEnergy:
        """The span from ``start`` to these totals as one pass of idle 0 (its energy is
        all dynamic already); ``gpu_load``: the GPUs' load now."""
        return PassEnergy(
            seconds=self.seconds - start.seconds,
            device_j=self.dynamic_j - start.dynamic_j,
            host_busy_cpu_s=self.busy_cpu_s - start.busy_cpu_s,
            gpu_j={k: j - start.gpu_j.get(k, 0.0) for k, j in self.gpu_j.items()},
            gpu_load=gpu_load,
        )


class Attribution:
    """Keeps the baselines, each target's energy counter and the device's energy by
    part across passes."""

    def __init__(self, idle_w: float | None, window_s: float) -> None:
        self.idle_w = idle_w
        self.window_s = window_s
        self._baseline = Baseline(idle_w, window_s)
        self._gpu_baselines: dict[str, Baseline] = {}
        self.energy_j: dict[str, float] = {}
        self.power_w: dict[str, float] = {}
        # Cumulative joules by part: "unattributed" is what was measured above idle and
        # given to no target (no target's processes ran, or the GPU rail's dynamic
        # part while no target held the GPU): a user alerts when it grows.
        self.parts_j: dict[str, float] = dict.fromkeys(ENERGY_PARTS, 0.0)
        self._totals = Totals()
        # Targets a pass on demand did not read: the totals where their interval began.
        self._waiting: dict[str, Totals] = {}

    def update(
        self,
        t: float,
        measured: PassEnergy,
        usage: Mapping[str, Usage],
        waiting: Iterable[str] = (),
    ) -> None:
        """One pass: ``usage``, what each target read in it used since its last
        reading; ``waiting``, the targets it did not read (a pass on demand's others),
        whose interval runs on to their next reading."""
        if measured.seconds <= 0:
            return
        idle = self._baseline.observe(t, measured.device_j / measured.seconds)
        gpu_idle = {
            k: self._gpu_baselines.setdefault(k, Baseline(None, self.window_s)).observe(
                t, j / measured.seconds
            )
            for k, j in measured.gpu_j.items()
        }
        before, self._totals = self._totals, self._totals.plus(measured, idle, gpu_idle)
        for target in waiting:
            self._waiting.setdefault(target, before)
        # Targets that waited, by where their interval began: each such group shares
        # the dynamic energy of its own span.
        spans: dict[int, tuple[Totals, dict[str, Usage]]] = {}
        now = {}
        for target, use in usage.items():
            start = self._waiting.pop(target, None)
            if start is None:
                now[target] = use
            else:
                spans.setdefault(id(start), (start, {}))[1][target] = use
        shares = split(measured, idle, gpu_idle, now)
        self._add(shares, measured.seconds)
        for part, joules in accounted(measured, idle, shares).items():
            self.parts_j[part] += joules
        for start, group in spans.values():
            span = self._totals.since(start, measured.gpu_load)
            late = split(span, 0.0, {}, group)
            # Their share over the span comes out of what its passes left unattributed
            # (and no other group took): the span's ratio of sums may ask for more where
            # the targets read at the edges took the passes of most energy per CPU
            # second. Scaled down to it, the targets never get more than was measured.
            room = max(0.0, self.parts_j["unattributed"] - start.unattributed_j)
            asked = math.fsum(late.values())
            if asked > room:
                late = {target: j * room / asked for target, j in late.items()}
            self._add(late, span.seconds)
            given = min(asked, room)
            self.parts_j["attributed"] += given
            self.parts_j["unattributed"] -= given
        self._totals = replace(self._totals, unattributed_j=self.parts_j["unattributed"])

    def restart(self, targets: Iterable[str]) -> None:
        """``targets`` were read in a pass that shared nothing (no new power reading):
        their CPU time so far is spent, their interval begins anew."""
        for target in targets:
            self._waiting.pop(target, None)

    def _add(self, shares: Mapping[str, float], seconds: float) -> None:
        for target, joules in shares.items():
            self.energy_j[target] = self.energy_j.get(target, 0.0) + joules
            self.power_w[target] = joules / seconds

    def set_idle(self, idle_w: float | None) -> None:
        """A reload changed the configured idle power (None: estimate it again)."""
        self.idle_w = idle_w
        self._baseline.configured = idle_w

    def set_window(self, window_s: float) -> None:
        """A reload changed the window over which idle power is estimated."""
        self.window_s = window_s
        for baseline in (self._baseline, *self._gpu_baselines.values()):
            baseline.window_s = window_s

    @property
    def idle_w_in_use(self) -> float | None:
        return self._baseline.value

    def forget(self, target: str) -> None:
        self.energy_j.pop(target, None)
        self.power_w.pop(target, None)
        self._waiting.pop(target, None)


@dataclass(frozen=True)
class TargetUse:
    """A target's part of a pass, as the sampler read it."""

    cpu_s: float  # CPU seconds it spent in the pass
    pids: tuple[int, ...]  # its members


class PassInputs:
    """Attribution's inputs from one pass to the next: the device's and each GPU's
    energy at the last power reading, and the processes found holding a GPU."""

    def __init__(self, holds_gpu: Callable[[int], bool]) -> None:
        self._holds_gpu = holds_gpu  # whether a process has a GPU device open
        self._last_energy: tuple[float, float, dict[str, float]] | None = None
        self._gpu_pids: set[int] = set()  # members found holding a GPU device

    def measure(
        self,
        now: float,
        power: PowerSnapshot | None,
        host_busy_cpu_s: float | None,
        used: Mapping[str, TargetUse],
    ) -> tuple[float, PassEnergy, dict[str, Usage]] | None:
        """What :meth:`Attribution.update` shares out for this pass: (when, what was
        measured, what each target used); None where there is nothing new to share."""
        if power is None or power.host_energy_j is None:
            return None
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
            return None  # no new power reading since the last pass
        before, self._last_energy = (
            self._last_energy,
            (measured_at, power.host_energy_j, gpu_energy),
        )
        if before is None or host_busy_cpu_s is None:
            return None
        measured = PassEnergy(
            seconds=measured_at - before[0],
            device_j=max(0.0, power.host_energy_j - before[1]),
            host_busy_cpu_s=host_busy_cpu_s,
            gpu_j={k: max(0.0, j - before[2].get(k, j)) for k, j in gpu_energy.items()},
            gpu_load={g.id: g.utilization or 0.0 for g in power.gpus if g.id in gpu_energy},
        )
        # Only while the GPU is busy (GR3D above 0 at the pass's edge, where known):
        # the rail's dynamic part while it idles is no holder's work (unattributed).
        holders = self._gpu_holders(used) if gpu_rails and gpu_busy(power) else set()
        weights = rail_weights({t: used[t].cpu_s for t in holders})
        usage = {}
        for target_id, use in used.items():
            gpu = {g.id: load for g, load, _ in gpu_use(power, use.pids) if g.id in gpu_energy}
            if target_id in weights:
                gpu.update(dict.fromkeys(gpu_rails, weights[target_id]))
            usage[target_id] = Usage(cpu_s=use.cpu_s, gpu=gpu)
        return measured_at, measured, usage

    def _gpu_holders(self, used: Mapping[str, TargetUse]) -> set[str]:
        """Targets with a member holding a GPU device open. A process that opened one
        keeps it (a CUDA context): a pid found once is not scanned again."""
        known, self._gpu_pids = self._gpu_pids, set()
        holders = set()
        for target_id, use in used.items():
            for pid in use.pids:
                if pid in known or self._holds_gpu(pid):
                    self._gpu_pids.add(pid)
                    holders.add(target_id)
        return holders


def rail_weights(holders_cpu_s: Mapping[str, float]) -> dict[str, float]:
    """Each GPU holder's weight in the board GPU rail's dynamic part: its CPU seconds in
    the pass; equal weights where the holders' CPU time sums to 0. The kernel counts CPU
    time in ticks (10 ms): a holder waiting on its GPU work (a trainer blocked in a
    synchronize) reads 0 in many a 0.2 s pass, and the rail is still its work, not
    no one's."""
    if math.fsum(max(0.0, c) for c in holders_cpu_s.values()) > 0:
        return {t: max(0.0, c) for t, c in holders_cpu_s.items()}
    return dict.fromkeys(holders_cpu_s, 1.0)


def gpu_use(power: PowerSnapshot, pids: tuple[int, ...]) -> list[tuple[Gpu, float, int | None]]:
    """(GPU, SM load 0..1, memory bytes) of a target's processes on each GPU that
    reports per-process figures."""
    result = []
    for gpu in power.gpus:
        if not gpu.processes:
            continue
        mine = [gpu.processes[pid] for pid in pids if pid in gpu.processes]
        load = sum(p.utilization or 0.0 for p in mine)
        sizes = [p.memory_bytes for p in mine if p.memory_bytes is not None]
        result.append((gpu, load, sum(sizes) if sizes else None))
    return result


def gpu_totals(
    power: PowerSnapshot | None, pids: tuple[int, ...]
) -> tuple[float | None, int | None]:
    """A target's GPU load (summed over GPUs) and memory bytes, where some GPU reports
    per-process figures."""
    if power is None or not any(g.processes for g in power.gpus):
        return None, None
    use = gpu_use(power, pids)
    sizes = [m for _, _, m in use if m is not None]
    return sum(load for _, load, _ in use), sum(sizes) if sizes else 0


def gpu_busy(power: PowerSnapshot) -> bool:
    """Whether the board's GPU is busy at the edge: its load (GR3D) above 0, or unknown."""
    loads = [g.utilization for g in power.gpus if g.id in BOARD_GPU_LOADS]
    known = [load for load in loads if load is not None]
    return not known or max(known) > 0
