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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


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

    def update(self, t: float, measured: PassEnergy, usage: Mapping[str, Usage]) -> None:
        if measured.seconds <= 0:
            return
        idle = self._baseline.observe(t, measured.device_j / measured.seconds)
        gpu_idle = {
            k: self._gpu_baselines.setdefault(k, Baseline(None, self.window_s)).observe(
                t, j / measured.seconds
            )
            for k, j in measured.gpu_j.items()
        }
        shares = split(measured, idle, gpu_idle, usage)
        for target, joules in shares.items():
            self.energy_j[target] = self.energy_j.get(target, 0.0) + joules
            self.power_w[target] = joules / measured.seconds
        for part, joules in accounted(measured, idle, shares).items():
            self.parts_j[part] += joules

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
