"""Every power source's energy, kept for the edges: one trace per rail and per source's
total (trace.py), each source's latest reading, under one lock that the reader's
threads and the edges share.

Host totals: when a board source (INA3221, tegrastats) is present, its board input
is the device's power and nothing else is added (RAPL or NVML, if any, are inside
it). Otherwise the host total is the sum of the other sources' totals (RAPL
packages + dram, or psys; NVML GPUs).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence

from edgewatt.core.power.provenance import MEASURED, Provenance, Sensor, unknown
from edgewatt.core.power.source import Gpu, PowerReading, PowerSource
from edgewatt.core.power.trace import Trace
from edgewatt.core.power.values import PowerSnapshot, RailState

log = logging.getLogger(__name__)


class Traces:
    def __init__(self, sources: Sequence[PowerSource], max_gap_s: float) -> None:
        self.sources = list(sources)
        self.max_gap_s = max_gap_s
        boards = [s.name for s in self.sources if s.board]
        # The sources whose totals make the device's (not overlapping).
        self.contributing = set(boards[:1] or [s.name for s in self.sources])
        # Pull sources without a counter: a reader streams them between the edges.
        self.streamed: set[str] = set()
        self.totals: dict[str, Trace] = {}
        self.readings = 0  # taken, edges included, since start
        self.lock = threading.Lock()
        self._rails: dict[str, Trace] = {}
        self._latest: dict[str, PowerReading] = {}
        self._failing: set[str] = set()
        # Push sources started and silent so far, and since when (begin).
        self._silent_since: dict[str, float] = {}
        self._host_energy = 0.0  # as last reported: never backwards
        self._reported_at = float("-inf")  # the instant of the latest energy reported

    def latest(self, source: str) -> PowerReading | None:
        return self._latest.get(source)

    def begin(self, source: PowerSource, t: float) -> None:
        """``source``, a push source, runs from ``t`` (monotonic): while it has printed
        nothing (for max_gap_s at most) an edge's energy is not known yet, and its
        first reading's power is held back to ``t`` once it comes, as the last is held
        past its last reading (lock held; a source that has spoken: nothing to do)."""
        if source.name in self.contributing and source.name not in self.totals:
            self._silent_since[source.name] = t

    def take(self, source: PowerSource) -> None:
        """Read ``source`` (its lines since the last take, for a push source) into the
        traces (lock held). A failing source is logged once and retried at the next
        take."""
        try:
            if source.pushed:
                readings = source.arrived()
            else:
                reading = source.read()
                readings = [reading] if reading is not None else []
        except Exception as exc:  # a sensor failing at runtime must never stop sampling
            if source.name not in self._failing:
                self._failing.add(source.name)
                log.warning("power source %s failed, retrying: %s", source.name, exc)
            return
        if readings and source.name in self._failing:
            self._failing.discard(source.name)
            log.info("power source %s is back", source.name)
        for reading in readings:
            self._feed(source, reading)

    def _feed(self, source: PowerSource, reading: PowerReading) -> None:
        t = reading.monotonic
        # A push source's first line (begin): its power held back to the source's start,
        # in its total and each of its rails alike, so that the rails add up to it.
        since = self._silent_since.pop(source.name, None)
        for rail in reading.rails:
            trace = self._rails.get(rail.id)
            if trace is None:
                trace = self._rails[rail.id] = Trace(
                    self.max_gap_s, counter=rail.energy_j is not None
                )
                _hold_back(trace, since, t, rail.power_w, rail.energy_j)
            trace.add(t, rail.power_w, rail.energy_j)
        if source.name in self.contributing:
            trace = self.totals.get(source.name)
            if trace is None:
                counter = reading.total_energy_j is not None
                trace = self.totals[source.name] = Trace(self.max_gap_s, counter=counter)
                if not counter and not source.pushed:
                    self.streamed.add(source.name)
                _hold_back(trace, since, t, reading.total_w, reading.total_energy_j)
            trace.add(t, reading.total_w, reading.total_energy_j)
        self._latest[source.name] = reading
        self.readings += 1

    def stream(self, source: PowerSource) -> None:
        """One reading of a streamed source's total: its cheap path where it has one."""
        with self.lock:
            try:
                total = source.read_total()
            except Exception:  # the next edge's whole reading logs it
                return
            if total is None:
                self.take(source)
                return
            self.totals[source.name].add(total[0], total[1])
            self.readings += 1

    def snapshot(
        self, now: float, period_s: float | None, sensors: tuple[Sensor, ...]
    ) -> PowerSnapshot:
        """The device at ``now`` (lock held), energies interpolated to it; ``sensors``:
        what the device's energy is measured by (its provenance)."""
        # A source whose last read failed, or silent beyond the gap, is left out.
        fresh = [
            (s, r)
            for s in self.sources
            if (r := self._latest.get(s.name)) is not None
            and s.name not in self._failing
            and now - r.monotonic <= self.max_gap_s
        ]
        rails: list[RailState] = []
        gpus: list[Gpu] = []
        temperatures: dict[tuple[str, str], float] = {}
        for _, r in fresh:
            for rail in r.rails:
                trace = self._rails.get(rail.id)
                energy = trace.at(now) if trace is not None else None
                rails.append(
                    RailState(rail.id, rail.name, rail.type, r.source, rail.power_w, energy)
                )
            gpus.extend(r.gpus)
            temperatures.update({(r.source, name): c for name, c in r.temperatures_c.items()})
        powers = [r.total_w for s, r in fresh if s.name in self.contributing]
        # A partial sum would understate the device: no figure rather than a wrong one.
        complete = len(powers) == len(self.contributing) and None not in powers
        host_power = sum(p for p in powers if p is not None) if complete else None
        # Summed over every contributing trace, read this edge or not: a source missing
        # one edge must not make the host's energy go backwards. A power held past the
        # last reading (a push source's line not yet come) may come in lower once the
        # line comes, so the total is held where it was until it catches up.
        counted = self._energy_at(now)
        low, high = self._power_range()
        host_energy = None
        if counted is not None:
            host_energy = self._host_energy = max(self._host_energy, counted)
            self._reported_at = max(self._reported_at, now)
        return PowerSnapshot(
            host_power_w=host_power,
            host_energy_j=host_energy,
            rails=tuple(rails),
            gpus=tuple(gpus),
            temperatures_c=temperatures,
            sources=tuple(s.name for s, _ in fresh),
            measured_at=now if host_energy is not None else None,
            period_s=period_s,
            power_min_w=low if complete else None,
            power_max_w=high if complete else None,
            provenance=Provenance(MEASURED, sensors)
            if host_energy is not None and sensors  # none: a source's first line to come
            else unknown(f"no reading from {', '.join(sorted(self.contributing))} yet"),
        )

    def _power_range(self) -> tuple[float | None, float | None]:
        """The device's lowest and highest power since the last snapshot, from every
        reading in between (lock held; each trace's range begins anew). One board
        source: its own; several (RAPL and NVML, read at the edges): their sums, the
        sum of each one's highest an upper bound where they peak apart."""
        taken = {name: trace.take_range() for name, trace in self.totals.items()}
        ranges = [taken.get(name) for name in self.contributing]
        if not ranges or None in ranges:
            return None, None
        return sum(r[0] for r in ranges if r), sum(r[1] for r in ranges if r)

    def energy_at(self, t: float) -> float | None:
        """The device's energy up to instant ``t`` (monotonic, not in the future) within
        the readings kept: before the latest energy reported (an exit the kernel dates
        back), never above it; after it (a target read after its pass's edge), never
        below it, and what the next snapshot reports starts from there."""
        with self.lock:
            counted = self._energy_at(t)
            if counted is None or t <= self._reported_at:
                return None if counted is None else min(self._host_energy, counted)
            self._host_energy = max(self._host_energy, counted)
            self._reported_at = t
            return self._host_energy

    def settled_at(self, t: float, now: float) -> float | None:
        """The contributing traces' joules up to ``t`` once final in every one of them
        (Trace.settled_at; lock held); None while one may still change, or none yet."""
        if not self.totals or self._silent(now):
            return None
        total = 0.0
        for trace in self.totals.values():
            joules = trace.settled_at(t, now)
            if joules is None:
                return None
            total += joules
        return total

    def settled_until(self, now: float) -> float | None:
        """The newest instant :meth:`settled_at` gives joules for at ``now`` (lock held):
        every later one gives None; None: none settles (no trace yet, or a push source
        that may still count back)."""
        if not self.totals or self._silent(now):
            return None
        until = math.inf
        for trace in self.totals.values():
            settled = trace.settled_until(now)
            if settled is None:
                return None
            until = min(until, settled)
        return until

    def _energy_at(self, t: float) -> float | None:
        """The contributing traces' joules up to ``t``, summed (None: no trace yet, nor
        a push source started and silent within the gap limit: then what the others
        have, its own counted once it speaks)."""
        if not self.totals and not self._silent(t):
            return None
        return sum(trace.at(t) for trace in self.totals.values())

    def _silent(self, t: float) -> bool:
        """A push source begun no longer than max_gap_s before ``t`` has not spoken
        yet: its first reading may still count back to ``t``."""
        return any(t - since <= self.max_gap_s for since in self._silent_since.values())


def _hold_back(
    trace: Trace, since: float | None, t: float, watts: float | None, raw: float | None
) -> None:
    """A new trace whose first reading, at ``t``, came from a source started at
    ``since``: that power from the start (a counter's count back by as much); a start
    beyond the gap limit is not bridged (Trace.add)."""
    if since is None or since >= t or watts is None:
        return
    back = watts * (t - since)
    trace.add(since, watts, None if raw is None else raw - back)
