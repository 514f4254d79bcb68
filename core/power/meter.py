"""The power reader: the sources read at the sensor's rate, apart from the pass, and
one power snapshot per edge, with energy counters measured up to that edge.

Reading: a source that reports power only (INA3221 sysfs) is read by the reader's
thread ``sample_hz`` times a second; one that prints on its own (tegrastats, run at
the same rate) hands over every line it printed; one with a hardware energy counter
(RAPL, NVML) needs no stream and is read at every edge. Each signal's energy is kept
in a :class:`~edgewatt.core.power.trace.Trace`, so an edge (a pass, a phase edge, a
``track`` edge: :meth:`PowerMeter.read`) takes the energy up to its own instant,
interpolated between the two readings around it: a pull source is read at the edge
itself, and a push source's next line is waited for, within bounds.

Windows: while a window is young (a phase, a ``track`` call or an FL round opened
less than WINDOW_BOOST_S ago, as the sampler tells each edge), a second thread reads
the streamed sources at ``window_hz`` too. It blocks without a timeout between
windows, so it costs nothing then; while it runs, its CPU comes out of an allowance
that refills at what the budget leaves beside the steady rate (which, automatic,
makes room for what windows spent lately, down to half the budget), so a short
window is read finely and the average stays within AUTO_BUDGET. A window
opened when the allowance is spent gets the steady rate, and its snapshot's
``period_s`` says so.

A source silent for longer than ``max_gap_s`` drops out of the snapshot until it
speaks again, and that time is not bridged.

Host totals: when a board source (INA3221, tegrastats) is present, its board input
is the device's power and nothing else is added (RAPL or NVML, if any, are inside
it). Otherwise the host total is the sum of the other sources' totals (RAPL
packages + dram, or psys; NVML GPUs).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgewatt.core import options
from edgewatt.core.compat import SLOTS
from edgewatt.core.power import native
from edgewatt.core.power.source import (
    AUTO_BUDGET,
    AUTO_RATES_HZ,
    AUTO_START_HZ,
    MAX_SAMPLE_HZ,
    WINDOW_HZ,
    Gpu,
    PowerOptions,
    PowerReading,
    PowerSource,
)
from edgewatt.core.power.trace import Trace

log = logging.getLogger(__name__)


def sample_hz_from_environment() -> float | None:
    """In-process sampling's rate: EDGEWATT_POWER_SAMPLE_HZ as the daemon reads it, else
    None, the rate chosen on the device (a bad value is logged and ignored: monitoring
    never raises)."""
    return _rate_from_environment("sample_hz", 1.0, "auto or a rate")


def window_hz_from_environment() -> float:
    """In-process sampling's window rate: EDGEWATT_POWER_WINDOW_HZ as the daemon reads
    it (0: none), else WINDOW_HZ."""
    return _rate_from_environment("window_hz", 0.0, "a rate (0: none)") or 0.0


def _rate_from_environment(name: str, lowest: float, accepted: str) -> float | None:
    """PowerOptions' field ``name`` from its variable, checked by its declared parser."""
    spec = options.lookup(PowerOptions, name)
    default = getattr(PowerOptions(), name)
    text = os.environ.get(spec.variable, "").strip()
    if text.lower() in ("", "auto"):
        return default
    try:
        return spec.parse(text)
    except ValueError:
        log.warning(
            "%s=%r is not %s from %g to %g Hz: %s used",
            spec.variable,
            text[:40],
            accepted,
            lowest,
            MAX_SAMPLE_HZ,
            "auto" if default is None else f"{default:g} Hz",
        )
        return default


def auto_rate(cost_s: float, budget: float = AUTO_BUDGET) -> float:
    """The highest automatic rate whose cost (``cost_s`` of the reader thread's CPU per
    reading, wake included) stays within ``budget`` of one core; the lowest else."""
    within = [hz for hz in AUTO_RATES_HZ if hz * cost_s <= budget]
    return max(within) if within else AUTO_RATES_HZ[0]


# An edge waits for a push source's next line at most this many of its periods (and
# never longer than MAX_EDGE_WAIT_S): a line late beyond that is not waited for, and
# the edge holds the last power instead.
EDGE_WAIT_PERIODS = 1.5
MAX_EDGE_WAIT_S = 0.25
# The automatic rate is chosen again from each window of this many seconds of the
# reader thread's own CPU clock (its cost varies with the machine's load and clocks).
CALIBRATION_S = 10.0
# Windows within the budget before a higher rate is tried, at first; each failed try
# doubles it, up to MAX_PROBE_WAIT (30 min of 10 s windows).
PROBE_EVERY = 6
MAX_PROBE_WAIT = 180
# At start, a push source's first line is waited for this long at most: a target
# registered at once (the client's own, in-process) has the device's energy from its
# first sample on, not from the second pass.
FIRST_LINE_WAIT_S = 2.0
# Windows (phases, ``track`` calls, FL rounds) are read at WINDOW_HZ (source.py) for
# their first WINDOW_BOOST_S: a step of the power inside a window of a few hundred ms
# is interpolated across a whole period of the rate (12 % off at 50 Hz, 1.3 % at
# 200 Hz: docs/performance.md); a longer window spreads the same error over more
# energy.
WINDOW_BOOST_S = 2.0
# Under the automatic rate the steady stream keeps within AUTO_BUDGET less what the
# windows spent in the last calibration window, and gets at least this share of it;
# what it leaves refills the windows' allowance, which holds at most
# WINDOW_ALLOWANCE_S seconds of the whole budget (50 ms of CPU: a few seconds of
# windows at once).
STEADY_SHARE = 0.5
WINDOW_ALLOWANCE_S = 10.0
# The native streams are drained at every edge and, where edges are further apart
# (a long pass interval), this often: a quarter of what a ring holds at 1 kHz.
NATIVE_DRAIN_S = native.RING_READINGS / 1000.0 / 4


def _sleep_until(deadline: float, period: float) -> float:
    """Sleep until the next reading is due; the deadline, moved past readings missed
    (a busy machine): those are skipped, never read in a burst."""
    delay = deadline - time.monotonic()
    if delay < -period:
        return deadline - delay // period * period
    if delay > 0:
        time.sleep(delay)
    return deadline


@dataclass(frozen=True, **SLOTS)
class RailState:
    id: str
    name: str
    type: str
    source: str
    power_w: float | None
    energy_j: float | None


@dataclass(frozen=True, **SLOTS)
class PowerSnapshot:
    host_power_w: float | None
    host_energy_j: float | None  # since the reader started, up to measured_at
    rails: tuple[RailState, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    temperatures_c: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (source, name)
    sources: tuple[str, ...] = ()
    # Monotonic time the energies are measured to: the edge's own instant.
    measured_at: float | None = None
    # The coarsest period at which the device's energy is resolved (None: unknown): a
    # window shorter than this is not resolved by the sensor, and says so.
    period_s: float | None = None


class PowerMeter:
    def __init__(
        self,
        sources: Sequence[PowerSource],
        *,
        max_gap_s: float,
        sample_hz: float | None = None,
        window_hz: float = WINDOW_HZ,
        calibration_s: float = CALIBRATION_S,
    ) -> None:
        self.sources = list(sources)
        self.max_gap_s = max_gap_s
        # None: chosen here, from the reader thread's measured cost (auto_rate).
        self.auto = sample_hz is None
        self.sample_hz = sample_hz if sample_hz is not None else AUTO_START_HZ
        # 0: no window rate; else windows are read at it where it is above sample_hz.
        self.window_hz = window_hz
        # The steady rate's budget: AUTO_BUDGET less what the windows spent in the last
        # calibration window, at least STEADY_SHARE of it (whole where none opened).
        self._budget = AUTO_BUDGET
        self.calibration_s = calibration_s
        self.cost_s: float | None = None  # the reader thread's CPU per reading, measured
        self.usage: float | None = None  # its share of one core in the last window
        self._windows = 0  # since the last change of rate
        self._probing = False  # the rate was just raised, to be measured
        self._probe_wait = PROBE_EVERY  # windows within the budget before trying higher
        boards = [s.name for s in self.sources if s.board]
        self._contributing = set(boards[:1] or [s.name for s in self.sources])
        self._rails: dict[str, Trace] = {}
        self._totals: dict[str, Trace] = {}
        self._latest: dict[str, PowerReading] = {}
        self._streamed: set[str] = set()  # pull sources without a counter: the thread reads them
        self._failing: set[str] = set()
        self._host_energy = 0.0  # as last reported: never backwards
        self.readings = 0  # taken by the reader, edges included, since start
        self.window_readings = 0  # of those, by the window thread
        self.window_cpu_s = 0.0  # the window thread's CPU, wakes included, since start
        self._window_cpu_seen = 0.0  # as of the last calibration
        self.windows_refused = 0  # windows opened with the allowance spent
        self._allowance = AUTO_BUDGET * WINDOW_ALLOWANCE_S  # CPU s; starts full
        self._refilled_at = time.monotonic()
        self._window_until = 0.0  # monotonic: the window thread reads until then
        self._window_since: float | None = None  # since when it has read (None: idle)
        self._last_edge: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._window_wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._window_thread: threading.Thread | None = None
        # The native reader's streams, where it reads (power/native.py); as of the last
        # edge: (their CPU, when); the steady rate's calibration window so far.
        self._natives: list[native.NativeStream] = []
        self._native_seen = (0.0, 0.0)
        self._native_moved = 0  # readings drained since the last edge
        self._steady_window = (0.0, 0.0, 0)
        self._drain_thread: threading.Thread | None = None

    def start(self) -> PowerMeter:
        """The reader's thread: the streamed sources at ``sample_hz``, after the push
        sources' first lines (within FIRST_LINE_WAIT_S)."""
        deadline = time.monotonic() + FIRST_LINE_WAIT_S
        for source in self.sources:
            if source.pushed:
                source.wait_newer(0.0, max(0.0, deadline - time.monotonic()))
        with self._lock:
            for source in self.sources:
                self._take(source)
        if self._streamed and not self._natives:
            streams = [
                native.stream(s, self.sample_hz) for s in self.sources if s.name in self._streamed
            ]
            if all(streams):  # all natively, or none: one reader for the stream
                self._natives = streams  # type: ignore[assignment]
                self._native_seen = (self._native_cpu(), time.monotonic())
                self._drain_thread = threading.Thread(
                    target=self._run_drains, name="edgewatt-power-drain", daemon=True
                )
                self._drain_thread.start()
            else:
                for n in streams:
                    if n is not None:
                        n.close()
        if self._streamed and not self._natives and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="edgewatt-power", daemon=True)
            self._thread.start()
            if self.window_hz:
                self._window_thread = threading.Thread(
                    target=self._run_windows, name="edgewatt-power-windows", daemon=True
                )
                self._window_thread.start()
        return self

    def _run(self) -> None:
        period = 1.0 / self.sample_hz
        deadline = time.monotonic()
        streamed = [s for s in self.sources if s.name in self._streamed]
        window = (time.thread_time(), deadline, 0)  # CPU, start, readings
        # A reading costs little (two preads); this thread's wake per reading is most
        # of the reader's cost (benchmarks/power_reader.py). time.sleep, not an Event:
        # a wait on a lock with a timeout costs more per wake; close() waits one
        # period at most. The stream carries the device's total; rails are read at
        # the edges.
        while not self._stop.is_set():
            for source in streamed:
                self._stream(source)
            cpu, started, count = window
            window = (cpu, started, count + 1)
            if deadline - started >= self.calibration_s:
                self._calibrate(time.thread_time() - cpu, deadline - started, count + 1)
                period = 1.0 / self.sample_hz
                window = (time.thread_time(), deadline, 0)
            deadline = _sleep_until(deadline + period, period)

    def _calibrate(self, cpu_s: float, wall_s: float, readings: int) -> None:
        """One window's measured cost. Under the automatic rate: over the budget, one
        rate down (or lower, where the cost per reading says so); within it, a rate up
        is tried now and then (a wake costs more per reading at a lower rate here, so
        the cost at another rate is measured there, not extrapolated), each failed try
        doubling the wait before the next."""
        self.cost_s = cpu_s / readings
        self.usage = cpu_s / wall_s if wall_s > 0 else None
        with self._lock:
            spent, self._window_cpu_seen = (
                self.window_cpu_s - self._window_cpu_seen,
                self.window_cpu_s,
            )
        if wall_s > 0:
            self._budget = max(AUTO_BUDGET * STEADY_SHARE, AUTO_BUDGET - spent / wall_s)
        if not self.auto or self.usage is None:
            return
        level = AUTO_RATES_HZ.index(self.sample_hz)
        if self.usage > self._budget and level > 0:
            if self._probing:  # the try failed: wait longer before the next
                self._probing = False
                self._probe_wait = min(2 * self._probe_wait, MAX_PROBE_WAIT)
            rate = min(AUTO_RATES_HZ[level - 1], auto_rate(self.cost_s, self._budget))
            self._set_rate(rate, "over")
        elif self._probing:
            self._probing = False
            self._probe_wait = PROBE_EVERY
            self._set_rate(self.sample_hz, "within")  # the try holds: logged as chosen
        elif level + 1 < len(AUTO_RATES_HZ) and self._windows >= self._probe_wait:
            self._probing = True
            self._set_rate(AUTO_RATES_HZ[level + 1], "try")
        else:
            self._windows += 1

    def _set_rate(self, hz: float, why: str) -> None:
        self._windows = 0
        if why == "try":
            log.debug("power reader: trying %g Hz", hz)
        else:
            log.info(
                "power reader: %g Hz (%.0f us of CPU a reading, %.2f %% of one core at %g Hz; "
                "the budget is %g %%)",
                hz,
                (self.cost_s or 0.0) * 1e6,
                (self.usage or 0.0) * 100,
                self.sample_hz,
                self._budget * 100,
            )
        self.sample_hz = hz

    def _run_windows(self) -> None:
        """The window thread: blocked (no wakes) until an edge opens a window, then the
        streamed sources at ``window_hz`` until the window is no longer young or the
        allowance is spent. Its CPU is its own thread clock, wake included."""
        streamed = [s for s in self.sources if s.name in self._streamed]
        while True:
            self._window_wake.wait()
            self._window_wake.clear()
            if self._stop.is_set():
                return
            period = 1.0 / self.window_hz
            deadline = time.monotonic()
            cpu = time.thread_time()
            while not self._stop.is_set():
                with self._lock:
                    self._refill(time.monotonic())
                    now = time.thread_time()
                    self._allowance -= now - cpu
                    self.window_cpu_s += now - cpu
                    cpu = now
                    if deadline >= self._window_until or self._allowance <= 0:
                        self._window_since = None
                        break
                for source in streamed:
                    self._stream(source)
                self.window_readings += 1
                deadline = _sleep_until(deadline + period, period)

    def _refill(self, now: float) -> None:
        """The windows' allowance (lock held): what the budget leaves beside the steady
        stream's measured usage (half of it before the first measure), since the last
        refill, up to WINDOW_ALLOWANCE_S of the whole budget. The steady rate leaves
        none where no window opened lately: the allowance, full then, funds the first
        windows, and the next calibration lowers the steady rate to make room."""
        steady = self.usage if self.usage is not None else AUTO_BUDGET * STEADY_SHARE
        spare = max(0.0, AUTO_BUDGET - steady)
        self._allowance = min(
            AUTO_BUDGET * WINDOW_ALLOWANCE_S,
            self._allowance + spare * (now - self._refilled_at),
        )
        self._refilled_at = now

    def _open_window(self, now: float, until: float | None) -> None:
        """At an edge (lock held): the window thread reads until ``until``, or stops at
        its next reading where no window is young (None)."""
        self._window_until = 0.0 if until is None else until
        if until is None or until <= now or not (self._window_thread or self._natives):
            return
        if self.window_hz <= self.sample_hz:
            return  # the steady stream is as fine already
        self._refill(now)
        if self._allowance <= 0:
            self.windows_refused += 1
            return
        if self._window_since is None:
            self._window_since = now
            self._window_wake.set()  # the natives are steered after the edge instead

    def _stream(self, source: PowerSource) -> None:
        """One reading of a streamed source's total: its cheap path where it has one."""
        with self._lock:
            try:
                total = source.read_total()
            except Exception:  # the next edge's whole reading logs it
                return
            if total is None:
                self._take(source)
                return
            self._totals[source.name].add(total[0], total[1])
            self.readings += 1

    def _take(self, source: PowerSource) -> None:
        """Read ``source`` (its lines since the last take, for a push source) into the
        traces. A failing source is logged once and retried at the next take."""
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
        for rail in reading.rails:
            trace = self._rails.get(rail.id)
            if trace is None:
                trace = self._rails[rail.id] = Trace(
                    self.max_gap_s, counter=rail.energy_j is not None
                )
            trace.add(t, rail.power_w, rail.energy_j)
        if source.name in self._contributing:
            trace = self._totals.get(source.name)
            if trace is None:
                counter = reading.total_energy_j is not None
                trace = self._totals[source.name] = Trace(self.max_gap_s, counter=counter)
                if not counter and not source.pushed:
                    self._streamed.add(source.name)
            trace.add(t, reading.total_w, reading.total_energy_j)
        self._latest[source.name] = reading
        self.readings += 1

    def _wait_s(self, source: PowerSource, now: float) -> float:
        """How long an edge waits for a push source's next line: only while it prints."""
        latest = self._latest.get(source.name)
        if not source.pushed or source.period_s is None or latest is None:
            return 0.0
        if now - latest.monotonic > EDGE_WAIT_PERIODS * source.period_s + MAX_EDGE_WAIT_S:
            return 0.0  # silent: it restarts or died, and the log says so
        return min(EDGE_WAIT_PERIODS * source.period_s, MAX_EDGE_WAIT_S)

    def read(self, now: float, window_until: float | None = None) -> PowerSnapshot | None:
        """The snapshot at the edge ``now`` (monotonic): every source read at the edge
        (a push source's next line waited for), energies interpolated to ``now``.
        ``window_until``: a window is young until then (monotonic), and is read at the
        window rate meanwhile; None: none is, and the window rate stops."""
        if not self.sources:
            return None
        waited = False
        for source in self.sources:
            wait = self._wait_s(source, now)
            if wait > 0:
                # Outside the lock: the reader goes on meanwhile. Nothing is taken
                # here: the lines stay pending for the take below.
                source.wait_newer(now, wait)
                waited = True
        if waited:
            # The edge is now, right after the line: what the caller reads next (its
            # targets' CPU) is read at the same instant as the energy, not a wait later.
            now = max(now, time.monotonic())
        with self._lock:
            steady = self._drain_natives(now) if self._natives else None
            for source in self.sources:
                self._take(source)
            # The stream's period since the last edge: the window rate's where the
            # window thread read all along, from that edge or before.
            since = self._window_since
            fine = since is not None and self._last_edge is not None and since <= self._last_edge
            snapshot = self._snapshot(now, self._period(fine))
            self._last_edge = now
            self._open_window(now, window_until)
        if steady is not None:  # outside the lock, as the reader thread calibrates
            self._calibrate(*steady)
        if self._natives:
            self._steer_natives(now)
        return snapshot

    def _native_cpu(self) -> float:
        return sum(n.cpu_s() for n in self._natives)

    def _run_drains(self) -> None:
        """Between edges further apart than NATIVE_DRAIN_S: the rings into the traces
        (its own CPU is not counted: one drain in 8 s)."""
        while not self._stop.wait(NATIVE_DRAIN_S):
            with self._lock:
                self._move_natives()

    def _move_natives(self) -> None:
        """The native streams' readings since the last drain into the traces (lock
        held)."""
        for stream in self._natives:
            trace = self._totals[stream.source.name]
            for t, watts in stream.drain():
                self._native_moved += trace.add(t, watts)

    def _drain_natives(self, now: float) -> tuple[float, float, int] | None:
        """At an edge (lock held): the native streams' readings into the traces, and
        their CPU (their threads' clocks, and this drain's) counted to the windows'
        allowance where the window rate read since the last edge, else to the steady
        rate's calibration window; that window when it is complete (cpu, wall, readings)."""
        started = time.thread_time()
        self._move_natives()
        drained, self._native_moved = self._native_moved, 0
        self.readings += drained
        cpu = self._native_cpu()
        seen_cpu, seen_at = self._native_seen
        spent = cpu - seen_cpu + time.thread_time() - started
        self._native_seen = (cpu, now)
        if self._window_since is not None:
            self._refill(now)
            self._allowance -= spent
            self.window_cpu_s += spent
            self.window_readings += drained
            return None
        cpu_s, wall_s, count = self._steady_window
        cpu_s, wall_s, count = cpu_s + spent, wall_s + now - seen_at, count + drained
        if wall_s < self.calibration_s or count == 0:
            self._steady_window = (cpu_s, wall_s, count)
            return None
        self._steady_window = (0.0, 0.0, 0)
        return cpu_s, wall_s, count

    def _steer_natives(self, now: float) -> None:
        """The native streams at the window rate while a window is young and the
        allowance lasts (switched at the edges: one interval's overrun at most), else
        at the steady rate."""
        with self._lock:
            if self._window_since is not None and (
                now >= self._window_until or self._allowance <= 0
            ):
                self._window_since = None
            hz = self.window_hz if self._window_since is not None else self.sample_hz
        for stream in self._natives:
            stream.set_hz(hz)

    def _snapshot(self, now: float, period_s: float | None) -> PowerSnapshot:
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
        powers = [r.total_w for s, r in fresh if s.name in self._contributing]
        # A partial sum would understate the device: no figure rather than a wrong one.
        complete = len(powers) == len(self._contributing) and None not in powers
        host_power = sum(p for p in powers if p is not None) if complete else None
        # Summed over every contributing trace, read this edge or not: a source missing
        # one edge must not make the host's energy go backwards. A power held past the
        # last reading (a push source's line not yet come) may come in lower once the
        # line comes, so the total is held where it was until it catches up.
        counted = self._energy_at(now)
        host_energy = None
        if counted is not None:
            host_energy = self._host_energy = max(self._host_energy, counted)
        return PowerSnapshot(
            host_power_w=host_power,
            host_energy_j=host_energy,
            rails=tuple(rails),
            gpus=tuple(gpus),
            temperatures_c=temperatures,
            sources=tuple(s.name for s, _ in fresh),
            measured_at=now if host_energy is not None else None,
            period_s=period_s,
        )

    def energy_at(self, t: float) -> float | None:
        """The device's energy up to a past instant ``t`` (monotonic) within the
        readings kept: a target's exit, which the kernel dates before the pass that
        finds it."""
        with self._lock:
            counted = self._energy_at(t)
            return None if counted is None else min(self._host_energy, counted)

    def _energy_at(self, t: float) -> float | None:
        """The contributing traces' joules up to ``t``, summed (None: no trace yet)."""
        if not self._totals:
            return None
        return sum(trace.at(t) for trace in self._totals.values())

    @property
    def period_s(self) -> float | None:
        """The coarsest period of the sources the device's energy comes from."""
        return self._period(fine=False)

    def _period(self, fine: bool) -> float | None:
        """As period_s; ``fine``: the streamed sources read at the window rate."""
        periods = []
        stream_hz = max(self.sample_hz, self.window_hz) if fine else self.sample_hz
        for source in self.sources:
            if source.name not in self._contributing:
                continue
            period = source.period_s
            if source.name in self._streamed:
                period = max(period or 0.0, 1.0 / stream_hz)
            if period is not None:
                periods.append(period)
        return max(periods) if periods else None

    def child_pids(self) -> set[int]:
        """The processes the sources run for their readings (tegrastats, powermetrics)."""
        return {pid for source in self.sources if (pid := source.child_pid()) is not None}

    def reader_cpu_s(self) -> float:
        """The CPU the reader's threads (native or Python) have used since they started,
        their wakes included; not the drains at the edges (the caller's thread)."""
        if self._natives:
            return self._native_cpu()
        threads = [t for t in (self._thread, self._window_thread) if t and t.ident]
        return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads)  # type: ignore[arg-type]

    @property
    def reader(self) -> str:
        """Which reads the stream: "native" (power/native.py), "python" or "none"."""
        return "native" if self._natives else "python" if self._thread else "none"

    def close(self) -> None:
        self._stop.set()
        self._window_wake.set()
        for stream in self._natives:  # before the sources close the files it reads
            stream.close()
        for thread in (self._thread, self._window_thread, self._drain_thread):
            if thread is not None:
                thread.join(timeout=2)
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:  # closing must go on for the others
                log.warning("closing power source %s: %s", source.name, exc)
