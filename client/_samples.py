"""Monitor samples and the heflwr-compatible stats()/summary() computed from them.

Units, once (the README repeats them): ``cpu_usage`` is percent of one core (psutil's
``cpu_percent``, as heflwr), ``memory_usage`` percent of host memory (RSS), network
bytes are per interval: the monitored process's own TCP bytes where the scope is
"process" (the heflwr drop-ins), else host-wide (every interface but loopback);
``power_vdd_*`` are milliwatts and ``total_power_vdd_*`` millijoules (heflwr's units;
its docs said mV), integrated over the real elapsed time. Keys ending in ``_s``,
``_bytes``, ``_w`` and ``_j`` say their unit. A metric that is off, or that the device
lacks, is absent from a sample: never a 0 (``heflwr/records.py`` gives heflwr's shapes).

A monitor keeps one Recorder for its life: each start() opens a segment whose first
reading is a baseline, so stats() and summary() accumulate over start()/stop() as
heflwr's do, and the time between two segments is not counted.
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

# A sample shorter than this share of the interval (the reading at stop() a few ms
# after the previous one) is merged into the previous sample: over a few clock ticks
# a rate is noise (one 10 ms tick in 20 ms reads 50 %).
SHORT_SHARE = 0.25

NETWORK_UNITS = {
    "host": "bytes in the interval, host-wide, loopback excluded",
    "process": "bytes in the interval, the process tree's TCP, loopback to other processes in",
    # `edgewatt run`'s: the command's own bytes; the host's apart, under host_ names.
    "command": "bytes in the interval, the command's own (what its summary's network row "
    "says they count)",
}
HOST_NETWORK_KEYS = ("host_network_bytes_sent", "host_network_bytes_recv")


def units(network: str = "host") -> dict[str, str]:
    """What each figure of a sample row is; ``network``: a key of NETWORK_UNITS."""
    return {
        "timestamp": "unix seconds",
        "cpu_usage": "percent of one core",
        "memory_usage": "percent of host memory",
        "memory_rss_bytes": "bytes",  # summed over the processes
        "memory_pss_bytes": "bytes",  # PSS summed over them: what they hold
        "network_bytes_sent": NETWORK_UNITS[network],
        "network_bytes_recv": NETWORK_UNITS[network],
        "power_vdd_in": "milliwatts (device input)",
        "power_vdd_cpu_gpu_cv": "milliwatts",
        "power_vdd_soc": "milliwatts",
        "power_w": "watts (device input)",
        **(dict.fromkeys(HOST_NETWORK_KEYS, NETWORK_UNITS["host"]) if network == "command" else {}),
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
    # The monitored process tree's own TCP bytes (sock_diag), loopback to processes
    # outside it included; None where they are not counted (no sock_diag, psutil).
    tcp_sent_total: int | None = None
    tcp_recv_total: int | None = None
    # The reading's instant on the monotonic clock (seconds, any origin): intervals and
    # order come from it, so a wall-clock step moves no duration. None: ``time`` serves.
    monotonic: float | None = None
    memory_pss_bytes: int | None = None  # PSS summed over the tree; None: not read
    # What sampled it: "daemon" or "in-process" (their counters of energy differ).
    source: str | None = None

    @property
    def cpu_time_s(self) -> float:
        return self.cpu_user_s + self.cpu_system_s

    @property
    def instant(self) -> float:
        return self.time if self.monotonic is None else self.monotonic


def _increase(
    before: tuple[int | None, int | None], after: tuple[int | None, int | None]
) -> tuple[int, int] | None:
    """(sent, received) bytes between two readings' (sent, received) totals; None
    where either reading has none."""
    if before[0] is None or after[0] is None:
        return None
    return max(0, after[0] - before[0]), max(0, (after[1] or 0) - (before[1] or 0))


def sample_from(
    previous: Reading, current: Reading, metrics: dict[str, bool], network: str = "host"
) -> dict[str, Any]:
    """The sample recorded for the interval between two readings (heflwr keys)."""
    elapsed = current.instant - previous.instant
    sample: dict[str, Any] = {"timestamp": current.time}
    if metrics["cpu"] and elapsed > 0:
        sample["cpu_usage"] = max(0.0, current.cpu_time_s - previous.cpu_time_s) / elapsed * 100
    if metrics["memory"]:
        sample["memory_usage"] = current.memory_rss_bytes / current.memory_total_bytes * 100
        sample["memory_rss_bytes"] = current.memory_rss_bytes
        if current.memory_pss_bytes is not None:
            sample["memory_pss_bytes"] = current.memory_pss_bytes
    if metrics["network"]:
        # The monitored tree's own bytes, and the whole host's.
        own = _increase(
            (previous.tcp_sent_total, previous.tcp_recv_total),
            (current.tcp_sent_total, current.tcp_recv_total),
        )
        host = _increase(
            (previous.net_sent_total, previous.net_recv_total),
            (current.net_sent_total, current.net_recv_total),
        )
        if network == "command":  # the command's own where counted; the host's apart
            if own is not None:
                sample["network_bytes_sent"], sample["network_bytes_recv"] = own
            if host is not None:
                sample[HOST_NETWORK_KEYS[0]], sample[HOST_NETWORK_KEYS[1]] = host
        else:  # heflwr's keys: a drop-in's own TCP ("process") where read, else the host's
            traffic = own if network == "process" and own is not None else host
            if traffic is not None:
                sample["network_bytes_sent"], sample["network_bytes_recv"] = traffic
    if metrics["power"] and current.power_w is not None:
        sample["power_vdd_in"] = current.power_w * 1000
        for key, rail in HEFLWR_RAILS.items():
            if rail in current.rails_w:
                sample[key] = current.rails_w[rail] * 1000
        sample["power_w"] = current.power_w
        if current.energy_j is not None and previous.energy_j is not None:
            sample["energy_j"] = current.energy_j - previous.energy_j
    return sample


@dataclass
class Segment:
    """One start()..stop() of a monitor: its baseline, its latest reading, its samples
    and each sample's monotonic instant (its ``timestamp`` is the wall clock's)."""

    first: Reading
    last: Reading
    samples: list[dict[str, Any]] = field(default_factory=list)
    instants: list[float] = field(default_factory=list)
    base: Reading | None = None  # where the latest sample's interval began (for merging)

    @property
    def span_s(self) -> float:
        return self.last.instant - self.first.instant


class Recorder:
    """Turns readings into samples, kept in order over every start()/stop() of a
    monitor; stats() and summary() with explicit units. The first reading of a segment
    is a baseline, not a sample: no meaningless first 0 % (heflwr's psutil
    cpu_percent() first call). A reading less than SHORT_SHARE of the interval after
    the previous one extends the previous sample instead of making one of its own."""

    def __init__(
        self, metrics: dict[str, bool], interval: float = 0.0, network: str = "host"
    ) -> None:
        self.metrics = metrics
        self.network = network
        self.short_s = interval * SHORT_SHARE
        self.segments: list[Segment] = []
        self.phases: list[dict[str, Any]] = []
        self._open = False  # whether the next reading continues the last segment
        # The last sample, where the latest observe() merged its reading into it.
        self.extended: dict[str, Any] | None = None

    def begin(self, interval: float, metrics: dict[str, bool]) -> None:
        """A new segment (start()): its first reading is a baseline."""
        self.short_s = interval * SHORT_SHARE
        self.metrics = dict(metrics)
        self._open = False

    @property
    def samples(self) -> list[dict[str, Any]]:
        return [s for segment in self.segments for s in segment.samples]

    @property
    def last(self) -> Reading | None:
        return self.segments[-1].last if self.segments and self._open else None

    def observe(self, reading: Reading, edge: bool = False) -> dict[str, Any] | None:
        """The new sample, or None (a baseline, a reading not newer than the last, or
        one merged into the previous sample: ``extended`` is then that sample). ``edge``:
        the reading at a phase's start, never merged, nor merged into after (a sample
        ends at it)."""
        self.extended = None
        if not self._open:
            self.segments.append(Segment(reading, reading))
            self._open = True
            return None
        segment = self.segments[-1]
        previous = segment.last
        if reading.time == previous.time or reading.instant <= previous.instant:
            return None  # the daemon has not sampled again yet
        if reading.source != previous.source:
            # Another sampler took over (the daemon was lost): its energy counters start
            # anew, so its readings are a segment of their own, and the interval between
            # the two is counted by neither (the summary's "covers" says so).
            self.segments.append(Segment(reading, reading))
            return None
        segment.last = reading
        short = reading.instant - previous.instant < self.short_s
        if segment.samples and segment.base and short and not edge:
            merged = sample_from(segment.base, reading, self.metrics, self.network)
            segment.samples[-1] = self.extended = merged
            segment.instants[-1] = reading.instant
            return None
        segment.base = None if edge else previous
        sample = sample_from(previous, reading, self.metrics, self.network)
        segment.samples.append(sample)
        segment.instants.append(reading.instant)
        return sample

    def stats(self) -> dict[str, list[Any]]:
        samples = self.samples
        keys: list[str] = []
        for sample in samples:
            keys.extend(k for k in sample if k not in keys)
        return {k: [s[k] for s in samples if k in s] for k in keys}

    def summary(self) -> dict[str, Any]:
        stats = self.stats()
        result: dict[str, Any] = {"samples": sum(len(s.samples) for s in self.segments)}
        if self.phases:
            result["phases"] = list(self.phases)
        switched = [
            (a.last.time, b.first.time)
            for a, b in zip(self.segments, self.segments[1:])
            if a.last.source != b.first.source
        ]
        if switched:
            result["covers"] = {
                "whole": False,
                "uncounted": [[round(a, 3), round(b, 3)] for a, b in switched],
                "why": "the daemon was lost and in-process sampling took over: the time "
                "between the daemon's last reading and its first is counted by neither",
            }
        segments = [s for s in self.segments if s.samples]
        if not segments:
            return result
        result.update(
            start_time=segments[0].first.time,
            end_time=segments[-1].last.time,
            duration_s=round(math.fsum(s.span_s for s in segments), 3),  # monitored time
        )
        with_cpu = [s for s in segments if any("cpu_usage" in x for x in s.samples)]
        if with_cpu:
            cpu_s = math.fsum(s.last.cpu_time_s - s.first.cpu_time_s for s in with_cpu)
            # Weighted by time, not a mean of samples: CPU seconds over wall seconds.
            span = math.fsum(s.span_s for s in with_cpu)
            result["avg_cpu_usage"] = cpu_s / span * 100 if span > 0 else 0.0
            result["cpu_time_s"] = round(cpu_s, 3)
        if "memory_usage" in stats:
            result["avg_memory_usage"] = _mean(stats["memory_usage"])
            result["memory_rss_peak_bytes"] = max(stats["memory_rss_bytes"])
        if "network_bytes_sent" in stats:
            result["total_network_bytes_sent"] = sum(stats["network_bytes_sent"])
            result["total_network_bytes_recv"] = sum(stats["network_bytes_recv"])
        for key in HOST_NETWORK_KEYS:
            if key in stats:
                result[key] = sum(stats[key])
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
            millijoules = math.fsum(_rail_millijoules(s, key) for s in segments)
            result[f"total_{key}"] = millijoules
            result[f"energy_{name}_j"] = millijoules / 1000
        if "power_w" in stats:
            # Over the time the energy was measured: the device may start reporting
            # after the run began (a daemon that just started, a sensor's first line).
            measured = (
                math.fsum(_measured_s(s) for s in segments)
                if "energy_j" in result
                else result["duration_s"]
            )
            energy = result.get("energy_j", result.get("energy_vdd_in_j", 0.0))
            if measured > 0:
                result["avg_power_w"] = energy / measured
        mine = [
            s.last.process_energy_j - s.first.process_energy_j
            for s in segments
            if s.last.process_energy_j is not None and s.first.process_energy_j is not None
        ]
        if self.metrics["power"] and mine:
            result["process_energy_j"] = math.fsum(mine)
        energy = result.get("energy_j", result.get("energy_vdd_in_j"))
        last = segments[-1].last
        if last.carbon is not None and energy is not None:
            # CodeCarbon's rule, on the device's energy over the run.
            result["carbon_intensity_g_per_kwh"] = last.carbon.g_per_kwh
            result["total_carbon_g"] = last.carbon.grams(energy)
        return result


def _rail_millijoules(segment: Segment, key: str) -> float:
    """A rail's energy over a segment, from its first reading on (the first interval
    counts too), by the trapezoid rule over the real (monotonic) elapsed time."""
    rail = HEFLWR_RAILS.get(key)
    first = segment.first
    start = first.power_w if rail is None else first.rails_w.get(rail)
    pairs = [(t, s[key]) for t, s in zip(segment.instants, segment.samples) if key in s]
    times, values = [t for t, _ in pairs], [v for _, v in pairs]
    if start is not None:
        times, values = [first.instant, *times], [start * 1000, *values]
    return _trapezoid(times, values)


def _measured_s(segment: Segment) -> float:
    times = [segment.first.instant, *segment.instants]
    return math.fsum(
        t1 - t0 for t0, t1, s in zip(times, times[1:], segment.samples) if "energy_j" in s
    )


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _trapezoid(times: list[float], values: list[float]) -> float:
    return math.fsum(
        (v0 + v1) / 2 * (t1 - t0) for t0, t1, v0, v1 in zip(times, times[1:], values, values[1:])
    )
