"""Monitor samples and the heflwr-compatible stats()/summary() computed from them.

Units, once (the README repeats them): ``cpu_usage`` is percent of one core (psutil's
``cpu_percent``, as heflwr), ``memory_usage`` percent of host memory (RSS), network
bytes are per interval and host-wide (every interface but loopback), ``power_vdd_*``
are milliwatts and ``total_power_vdd_*`` millijoules (heflwr's units; its docs said
mV), integrated over the real elapsed time. Keys ending in ``_s``, ``_bytes``, ``_w``
and ``_j`` say their unit. A metric that is off, or that the device lacks, is absent:
never a 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgewatt.core import compat
from edgewatt.core.carbon import CarbonIntensity

# heflwr's rail keys and the tegrastats / INA3221 rails they are read from. The
# board input has a different name per board: the device total stands for it.
HEFLWR_RAILS = {"power_vdd_cpu_gpu_cv": "VDD_CPU_GPU_CV", "power_vdd_soc": "VDD_SOC"}

UNITS = {
    "timestamp": "unix seconds",
    "cpu_usage": "percent of one core",
    "memory_usage": "percent of host memory",
    "memory_rss_bytes": "bytes",
    "network_bytes_sent": "bytes in the interval, host-wide, loopback excluded",
    "network_bytes_recv": "bytes in the interval, host-wide, loopback excluded",
    "power_vdd_in": "milliwatts (device input)",
    "power_vdd_cpu_gpu_cv": "milliwatts",
    "power_vdd_soc": "milliwatts",
    "power_w": "watts (device input)",
}


@dataclass(frozen=True)
class Reading:
    """One raw reading from a source: cumulative counters, instantaneous gauges."""

    time: float
    cpu_user_s: float
    cpu_system_s: float
    memory_rss_bytes: int
    memory_total_bytes: int
    net_sent_total: int | None
    net_recv_total: int | None
    power_w: float | None = None  # the device's input power
    energy_j: float | None = None  # the device's energy counter
    rails_w: dict[str, float] = field(default_factory=dict)
    process_energy_j: float | None = None  # attributed to the monitored process
    carbon: CarbonIntensity | None = None  # the grid intensity, only when one is configured

    @property
    def cpu_time_s(self) -> float:
        return self.cpu_user_s + self.cpu_system_s


def sample_from(previous: Reading, current: Reading, metrics: dict[str, bool]) -> dict[str, Any]:
    """The sample recorded for the interval between two readings (heflwr keys)."""
    elapsed = current.time - previous.time
    sample: dict[str, Any] = {"timestamp": current.time}
    if metrics["cpu"] and elapsed > 0:
        sample["cpu_usage"] = max(0.0, current.cpu_time_s - previous.cpu_time_s) / elapsed * 100
    if metrics["memory"]:
        sample["memory_usage"] = current.memory_rss_bytes / current.memory_total_bytes * 100
        sample["memory_rss_bytes"] = current.memory_rss_bytes
    if (
        metrics["network"]
        and current.net_sent_total is not None
        and previous.net_sent_total is not None
    ):
        sample["network_bytes_sent"] = max(0, current.net_sent_total - previous.net_sent_total)
        sample["network_bytes_recv"] = max(
            0, (current.net_recv_total or 0) - (previous.net_recv_total or 0)
        )
    if metrics["power"] and current.power_w is not None:
        sample["power_vdd_in"] = current.power_w * 1000
        for key, rail in HEFLWR_RAILS.items():
            if rail in current.rails_w:
                sample[key] = current.rails_w[rail] * 1000
        sample["power_w"] = current.power_w
        if current.energy_j is not None and previous.energy_j is not None:
            sample["energy_j"] = current.energy_j - previous.energy_j
    return sample


class Recorder:
    """Turns readings into samples, kept in order; stats() and summary() in heflwr's
    shapes plus explicit units. The first reading is a baseline, not a sample: no
    meaningless first 0 % (heflwr's psutil.cpu_percent() first call)."""

    def __init__(self, metrics: dict[str, bool]) -> None:
        self.metrics = metrics
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.first: Reading | None = None
        self.last: Reading | None = None

    def observe(self, reading: Reading) -> dict[str, Any] | None:
        if self.last is not None and reading.time <= self.last.time:
            return None  # the daemon has not sampled again yet
        previous, self.last = self.last, reading
        if previous is None:
            self.first = reading
            return None
        sample = sample_from(previous, reading, self.metrics)
        self.samples.append(sample)
        return sample

    def stats(self) -> dict[str, list[Any]]:
        keys: list[str] = []
        for sample in self.samples:
            keys.extend(k for k in sample if k not in keys)
        return {k: [s[k] for s in self.samples if k in s] for k in keys}

    def summary(self) -> dict[str, Any]:
        stats = self.stats()
        result: dict[str, Any] = {"samples": len(self.samples)}
        if self.phases:
            result["phases"] = list(self.phases)
        if self.first is None or self.last is None or not self.samples:
            return result
        first, last = self.first, self.last
        result.update(
            start_time=first.time, end_time=last.time, duration_s=round(last.time - first.time, 3)
        )
        if "cpu_usage" in stats:
            cpu_s = last.cpu_time_s - first.cpu_time_s
            # Weighted by time, not a mean of samples: the reading taken at stop()
            # closes a short interval whose percentage is dominated by clock-tick
            # rounding (one 10 ms tick over 20 ms reads 50 %).
            span = last.time - first.time
            result["avg_cpu_usage"] = cpu_s / span * 100 if span > 0 else 0.0
            result["cpu_time_s"] = round(cpu_s, 3)
        if "memory_usage" in stats:
            result["avg_memory_usage"] = _mean(stats["memory_usage"])
            result["memory_rss_peak_bytes"] = max(stats["memory_rss_bytes"])
        if "network_bytes_sent" in stats:
            result["total_network_bytes_sent"] = sum(stats["network_bytes_sent"])
            result["total_network_bytes_recv"] = sum(stats["network_bytes_recv"])
        if "energy_j" in stats:
            result["energy_j"] = math.fsum(stats["energy_j"])  # the device's own counter
        for key in ("power_vdd_in", *HEFLWR_RAILS):
            if key not in stats:
                continue
            name = compat.removeprefix(key, "power_")
            if key == "power_vdd_in" and "energy_j" in result:
                # The board input is the device: one energy, the device's counter, set
                # as the same float (a round trip through mJ can differ in the last digit).
                result[f"energy_{name}_j"] = result["energy_j"]
                result[f"total_{key}"] = result["energy_j"] * 1000
                continue
            # From the first reading on: the first interval counts too.
            rail = HEFLWR_RAILS.get(key)
            start = first.power_w if rail is None else first.rails_w.get(rail)
            times = [s["timestamp"] for s in self.samples if key in s]
            values = stats[key]
            if start is not None:
                times, values = [first.time, *times], [start * 1000, *values]
            millijoules = _trapezoid(times, values)
            result[f"total_{key}"] = millijoules
            result[f"energy_{name}_j"] = millijoules / 1000
        if "power_w" in stats:
            # Over the time the energy was measured: the device may start reporting
            # after the run began (a daemon that just started, a sensor's first line).
            times = [first.time] + [s["timestamp"] for s in self.samples]
            measured = (
                math.fsum(t1 - t0 for t0, t1, s in zip(times, times[1:], self.samples)
                          if "energy_j" in s)
                if "energy_j" in result
                else result["duration_s"]
            )  # fmt: skip
            energy = result.get("energy_j", result.get("energy_vdd_in_j", 0.0))
            if measured > 0:
                result["avg_power_w"] = energy / measured
        if (
            self.metrics["power"]
            and last.process_energy_j is not None
            and first.process_energy_j is not None
        ):
            result["process_energy_j"] = last.process_energy_j - first.process_energy_j
        energy = result.get("energy_j", result.get("energy_vdd_in_j"))
        if last.carbon is not None and energy is not None:
            # CodeCarbon's rule, on the device's energy over the run.
            result["carbon_intensity_g_per_kwh"] = last.carbon.g_per_kwh
            result["total_carbon_g"] = last.carbon.grams(energy)
        return result


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _trapezoid(times: list[float], values: list[float]) -> float:
    return math.fsum(
        (v0 + v1) / 2 * (t1 - t0) for t0, t1, v0, v1 in zip(times, times[1:], values, values[1:])
    )
