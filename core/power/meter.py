"""Turns the sources' readings into one power snapshot per pass, with energy counters.

Energy: a hardware counter (RAPL, NVML) is used as is, made monotonic across source
restarts; otherwise power is integrated over the monotonic clock with the trapezoid
rule, between readings of distinct timestamps. A gap longer than ``max_gap_s`` (the
sensor stopped, tegrastats crashed and restarts) is not bridged: nothing is invented
for a time nothing was measured, and a source silent that long drops out of the
snapshot until it speaks again.

Host totals: when a board source (INA3221, tegrastats) is present, its board input
is the device's power and nothing else is added (RAPL or NVML, if any, are inside
it). Otherwise the host total is the sum of the other sources' totals (RAPL
packages + dram, or psys; NVML GPUs).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgewatt.core.power.source import Gpu, PowerReading, PowerSource

log = logging.getLogger(__name__)


class Integrator:
    """Joules from a power trace, by the trapezoid rule on the monotonic clock."""

    def __init__(self, max_gap_s: float) -> None:
        self.max_gap_s = max_gap_s
        self.joules = 0.0
        self._last: tuple[float, float] | None = None

    def add(self, t: float, watts: float) -> float:
        last = self._last
        if last is not None and t <= last[0]:
            return self.joules  # the same reading again
        if last is not None and t - last[0] <= self.max_gap_s:
            self.joules += (last[1] + watts) / 2 * (t - last[0])
        self._last = (t, watts)
        return self.joules

    def at(self, now: float) -> float:
        """Joules up to ``now``: the last power held since the last reading (within the
        gap limit). A pass between two sensor readings, a phase edge, gets the energy
        up to its own time rather than the last reading's."""
        last = self._last
        if last is None or not 0 < now - last[0] <= self.max_gap_s:
            return self.joules
        return self.joules + last[1] * (now - last[0])


class Counter:
    """A hardware energy counter made monotonic: a restart of its source adds on."""

    def __init__(self) -> None:
        self.joules = 0.0
        self._last: float | None = None

    def add(self, raw_joules: float) -> float:
        if self._last is not None:
            self.joules += raw_joules - self._last if raw_joules >= self._last else raw_joules
        self._last = raw_joules
        return self.joules


@dataclass(frozen=True, slots=True)
class RailState:
    id: str
    name: str
    type: str
    source: str
    power_w: float | None
    energy_j: float | None


@dataclass(frozen=True, slots=True)
class PowerSnapshot:
    host_power_w: float | None
    host_energy_j: float | None  # since the daemon started
    rails: tuple[RailState, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    temperatures_c: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (source, name)
    sources: tuple[str, ...] = ()
    # Monotonic time host_energy_j is measured to (see Integrator.at): rates over passes
    # must divide by the span the energy was measured over, not by the pass times.
    measured_at: float | None = None


class PowerMeter:
    def __init__(self, sources: Sequence[PowerSource], *, max_gap_s: float) -> None:
        self.sources = list(sources)
        self.max_gap_s = max_gap_s
        boards = [s.name for s in self.sources if s.board]
        self._contributing = set(boards[:1] or [s.name for s in self.sources])
        self._rail_energy: dict[str, Integrator | Counter] = {}
        self._total_energy: dict[str, Integrator | Counter] = {}
        self._failing: set[str] = set()
        self._host_energy = 0.0  # as last reported: never backwards

    def _read(self, source: PowerSource, now: float) -> PowerReading | None:
        try:
            reading = source.read()
        except Exception as exc:  # a sensor failing at runtime must never stop sampling
            if source.name not in self._failing:
                self._failing.add(source.name)
                log.warning("power source %s failed, retrying each pass: %s", source.name, exc)
            return None
        if reading is None or now - reading.monotonic > self.max_gap_s:
            return None
        if source.name in self._failing:
            self._failing.discard(source.name)
            log.info("power source %s is back", source.name)
        return reading

    def _energy(
        self,
        table: dict[str, Integrator | Counter],
        key: str,
        t: float,
        watts: float | None,
        joules: float | None,
    ) -> float | None:
        if joules is not None:
            meter = table.setdefault(key, Counter())
            return meter.add(joules) if isinstance(meter, Counter) else None
        if watts is None:
            existing = table.get(key)
            return existing.joules if existing is not None else None
        meter = table.setdefault(key, Integrator(self.max_gap_s))
        return meter.add(t, watts) if isinstance(meter, Integrator) else None

    def read(self, now: float) -> PowerSnapshot | None:
        if not self.sources:
            return None
        readings = [(s, r) for s in self.sources if (r := self._read(s, now)) is not None]
        rails: list[RailState] = []
        gpus: list[Gpu] = []
        temperatures: dict[tuple[str, str], float] = {}
        for _, r in readings:
            for rail in r.rails:
                energy = self._energy(
                    self._rail_energy, rail.id, r.monotonic, rail.power_w, rail.energy_j
                )
                rails.append(
                    RailState(rail.id, rail.name, rail.type, r.source, rail.power_w, energy)
                )
            gpus.extend(r.gpus)
            temperatures.update({(r.source, name): c for name, c in r.temperatures_c.items()})
        powers = []
        measured_at = None
        for s, r in readings:
            if s.name in self._contributing:
                self._energy(self._total_energy, s.name, r.monotonic, r.total_w, r.total_energy_j)
                powers.append(r.total_w)
                measured_at = max(measured_at or r.monotonic, r.monotonic)
        # A partial sum would understate the device: no figure rather than a wrong one.
        complete = len(powers) == len(self._contributing) and None not in powers
        host_power = sum(p for p in powers if p is not None) if complete else None
        # Summed over every contributing counter, read this pass or not: a source
        # missing one pass must not make the host's energy go backwards. Integrated
        # ones count up to now (see Integrator.at), so the energy is measured to the
        # pass's own time; a later reading's trapezoid may come in lower than that
        # estimate, so the total is held where it was until it catches up.
        counters = [
            c.at(now) if isinstance(c, Integrator) else c.joules
            for n, c in self._total_energy.items()
            if n in self._contributing
        ]
        host_energy = None
        if counters:
            host_energy = self._host_energy = max(self._host_energy, sum(counters))
            if any(isinstance(c, Integrator) for c in self._total_energy.values()):
                measured_at = now
        return PowerSnapshot(
            host_power_w=host_power,
            host_energy_j=host_energy,
            rails=tuple(rails),
            gpus=tuple(gpus),
            temperatures_c=temperatures,
            sources=tuple(s.name for s, _ in readings),
            measured_at=measured_at,
        )

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:  # closing must go on for the others
                log.warning("closing power source %s: %s", source.name, exc)
