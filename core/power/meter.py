"""The power reader: the sources read at the sensor's rate, apart from the pass, and
one power snapshot per edge, with energy counters measured up to that edge.

Reading: a source that reports power only (INA3221 sysfs) is streamed by a reader
(reader.py: Python threads or the native one) ``sample_hz`` times a second; one that
prints on its own (tegrastats, run at the same rate) hands over every line it
printed; one with a hardware energy counter (RAPL, NVML) needs no stream and is read
at every edge. Each signal's energy is kept in a trace (traces.py), so an edge (a
pass, a phase edge, a ``track`` edge: :meth:`PowerMeter.read`) takes the energy up
to its own instant, interpolated between the two readings around it. No edge waits
for a reading: a pull source is read at the edge itself, and past a push source's
last line the edge holds its last power. A window's energy at each edge is settled
later, once the reading after the edge has come (:meth:`PowerMeter.settled_energy`):
until then its figures say they are not final (targets/edges.py).

Rates: ``sample_hz``, where not configured, is chosen on the device from the reader's
measured cost (rate.py). While a window is young (a phase, a ``track`` call or an FL
round opened less than WINDOW_BOOST_S ago, as the sampler tells each edge), the
reader reads at ``window_hz`` too, paid from an allowance of CPU (allowance.py); a
window opened when the allowance is spent gets the steady rate, and its snapshot's
``period_s`` says so.

A source silent for longer than ``max_gap_s`` drops out of the snapshot until it
speaks again, and that time is not bridged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from edgewatt.core import options
from edgewatt.core.power import native
from edgewatt.core.power.allowance import WindowAllowance
from edgewatt.core.power.provenance import COUNTER, PRINTED, STREAM, Sensor, total_rail
from edgewatt.core.power.python_reader import PythonReader
from edgewatt.core.power.rate import CALIBRATION_S, RateController
from edgewatt.core.power.reader import Pacing, StreamReader
from edgewatt.core.power.source import MAX_SAMPLE_HZ, WINDOW_HZ, PowerOptions, PowerSource
from edgewatt.core.power.traces import Traces
from edgewatt.core.power.values import PowerSnapshot, PowerStatus

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


# At the daemon's start, a push source's first line is waited for this long at most,
# so its first pass has the device's power; the in-process client waits for none (its
# first registration is an edge).
FIRST_LINE_WAIT_S = 2.0
# Windows (phases, ``track`` calls, FL rounds) are read at WINDOW_HZ (source.py) for
# their first WINDOW_BOOST_S: a step of the power inside a window of a few hundred ms
# is interpolated across a whole period of the rate (12 % off at 50 Hz, 1.3 % at
# 200 Hz: docs/performance.md); a longer window spreads the same error over more
# energy.
WINDOW_BOOST_S = 2.0
# A window rate read when the last window ends (an edge says none is young) goes on
# this long, within that window's youth: a window opened meanwhile (a loop of phases
# or ``track`` calls) finds it, so the reader's rate does not change at each edge. A
# change to a faster rate wakes the native reader's real-time thread, which preempts
# the edge's own thread, and the kernel may run another task before that resumes
# (1 to 4 ms at p99, docs/performance.md). The reader ends the rate by itself.
WINDOW_LINGER_S = 0.25
# The native streams are drained at every edge and, where edges are further apart
# (a long pass interval), this often: a quarter of what a ring holds at 1 kHz.
NATIVE_DRAIN_S = native.RING_READINGS / 1000.0 / 4


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
        self.traces = Traces(self.sources, max_gap_s)
        # sample_hz None: chosen on the device (rate.py); window_hz 0: no window rate,
        # else windows are read at it where it is above the steady rate.
        self.rate = RateController(sample_hz, calibration_s)
        self.windows = WindowAllowance(window_hz, time.monotonic())
        self._pacing = Pacing(self.rate, self.windows, self.traces.lock)
        self._reader: StreamReader | None = None
        self._last_edge: float | None = None
        self._young_until = 0.0  # the last window's youth, as its edges said

    def start(self, first_line_wait_s: float = FIRST_LINE_WAIT_S) -> PowerMeter:
        """The reader of the streamed sources at ``sample_hz``, after the push sources'
        first lines (within ``first_line_wait_s``; 0: none waited for). A push source
        still silent counts from now: its first line's power is held back to now
        (Traces.begin), so an edge before that line settles once it comes."""
        began = time.monotonic()
        deadline = began + first_line_wait_s
        for source in self.sources:
            if source.pushed and first_line_wait_s > 0:
                source.wait_newer(0.0, max(0.0, deadline - time.monotonic()))
        with self.traces.lock:
            for source in self.sources:
                self.traces.take(source)
                if source.pushed:
                    self.traces.begin(source, began)
        streamed = [s for s in self.sources if s.name in self.traces.streamed]
        if streamed and self._reader is None:
            self._reader = self._start_reader(streamed)
        return self

    def _start_reader(self, streamed: list[PowerSource]) -> StreamReader:
        """The native reader where every streamed source has a native stream (one reader
        for the stream), else Python's."""
        streams = [n for s in streamed if (n := native.stream(s, self.rate.hz)) is not None]
        if len(streams) == len(streamed):
            return native.NativeReader(streams, self.traces, self._pacing, NATIVE_DRAIN_S)
        for stream in streams:
            stream.close()
        return PythonReader(streamed, self.traces, self._pacing)

    def read(self, now: float, window_until: float | None = None) -> PowerSnapshot | None:
        """The snapshot at the edge ``now`` (monotonic): every pull source read at the
        edge, the push sources' lines so far taken, energies interpolated to ``now``
        (past a push source's last line, its last power held: settled_energy gives
        the final figure later). ``window_until``: a window is young until then
        (monotonic), and is read at the window rate meanwhile; None: none is, and the
        window rate stops within WINDOW_LINGER_S."""
        if not self.sources:
            return None
        reader = self._reader
        with self.traces.lock:
            if reader is not None:
                reader.at_edge(now)
            for source in self.sources:
                self.traces.take(source)
            # The stream's period since the last edge: the window rate's where it was
            # read all along, from that edge or before (the reader ends it at its
            # until by itself; ended so, it starts anew at the next window).
            self.windows.reading(now)
            fine = self.windows.fine_since(self._last_edge)
            snapshot = self.traces.snapshot(now, self._period(fine), self._sensors())
            self._last_edge = now
            until = self._lingering(now, window_until)
            opened = reader is not None and self._pacing.open(now, until)
        if reader is not None:  # outside the lock, as the reader's threads calibrate
            reader.after_edge(now, opened)
        return snapshot

    def _lingering(self, now: float, window_until: float | None) -> float | None:
        """Until when the window rate is read from the edge ``now`` (lock held): while
        a window is young, its youth; where none is, WINDOW_LINGER_S more of the last
        one's where the rate is read now."""
        if window_until is not None:
            self._young_until = window_until
            return window_until
        if self.windows.since is None or self._young_until <= now:
            return None
        self._young_until = min(self._young_until, now + WINDOW_LINGER_S)
        return self._young_until

    def settled_energy(self, t: float) -> float | None:
        """The device's energy up to the past instant ``t`` (monotonic) as the traces
        integrate it once final: the readings around ``t`` have come (a push source's
        line after it) or the source has been silent beyond the gap limit. None: not
        yet (or no trace). Unlike the snapshots' energy, never held monotonic: a
        window's difference of two settled figures is the trace's integral over it."""
        with self.traces.lock:
            return self.traces.settled_at(t, time.monotonic())

    def settled_until(self) -> float | None:
        """The newest instant :meth:`settled_energy` gives joules for now, None for
        every later one (the reading after it has not come); None while none settles
        (no reading yet, or a push source that may still count back)."""
        with self.traces.lock:
            return self.traces.settled_until(time.monotonic())

    def wait_settled(self, t: float, timeout_s: float) -> None:
        """Until every push source has a reading measured after ``t`` (monotonic), or
        ``timeout_s`` passed; the lines come by then are taken into the traces. For a
        caller that asks for final figures: the edges never wait."""
        deadline = time.monotonic() + timeout_s
        pushed = [s for s in self.sources if s.pushed]
        for source in pushed:
            source.wait_newer(t, max(0.0, deadline - time.monotonic()))
        with self.traces.lock:
            for source in pushed:
                self.traces.take(source)

    def energy_at(self, t: float) -> float | None:
        """The device's energy up to instant ``t`` (monotonic, past or now) within the
        readings kept: a sample's own instant, when its target was read (after the
        pass's edge) or when it exited (which the kernel dates before the pass that
        finds it)."""
        return self.traces.energy_at(t)

    @property
    def period_s(self) -> float | None:
        """The coarsest period of the sources the device's energy comes from."""
        return self._period(fine=False)

    def _period(self, fine: bool) -> float | None:
        """As period_s; ``fine``: the streamed sources read at the window rate."""
        periods = []
        stream_hz = max(self.rate.hz, self.windows.hz) if fine else self.rate.hz
        for source in self.sources:
            if source.name not in self.traces.contributing:
                continue
            period = source.period_s
            if source.name in self.traces.streamed:
                period = max(period or 0.0, 1.0 / stream_hz)
            if period is not None:
                periods.append(period)
        return max(periods) if periods else None

    def _sensors(self) -> tuple[Sensor, ...]:
        """What the device's energy is measured by, at the steady rate (lock held; a
        young window's faster rate is not the run's)."""
        sensors = []
        for source in self.sources:
            latest = self.traces.latest(source.name)
            if source.name not in self.traces.contributing or latest is None:
                continue
            if source.name in self.traces.streamed:
                # Read faster than the monitors convert, a reading repeats the last.
                slowest = 1.0 / source.period_s if source.period_s else self.rate.hz
                read, hz = STREAM, round(min(self.rate.hz, slowest), 3)
            elif source.pushed:
                read, hz = PRINTED, (round(1.0 / source.period_s, 3) if source.period_s else None)
            else:
                read, hz = COUNTER, None
            sensors.append(Sensor(source.name, total_rail(latest), read, hz))
        return tuple(sensors)

    @property
    def sample_hz(self) -> float:
        """The steady rate now."""
        return self.rate.hz

    @property
    def readings(self) -> int:
        """Taken by the reader, edges included, since start."""
        return self.traces.readings

    @property
    def window_readings(self) -> int:
        """Of those, at the window rate."""
        return self._reader.window_readings if self._reader is not None else 0

    @property
    def windows_refused(self) -> int:
        """Windows opened with the allowance spent: read at the steady rate."""
        return self.windows.refused

    @property
    def reader(self) -> str:
        """Which reads the stream: "native" (power/native.py), "python" or "none"."""
        return self._reader.name if self._reader is not None else "none"

    def reader_cpu_s(self) -> float:
        """The CPU the reader's threads (native or Python) have used since they started,
        their wakes included; not the drains at the edges (the caller's thread)."""
        return self._reader.cpu_s() if self._reader is not None else 0.0

    def reader_lateness(self) -> list[float]:
        """How late each of the reader's steady readings since the last call was (s),
        against when it was due; none without a reader."""
        return self._reader.lateness() if self._reader is not None else []

    def reader_ahead(self) -> str:
        """How the reader runs ahead of the process's work: "fifo" or "nice -N" (the
        native reader, where it may), else "" (as its process)."""
        return self._reader.ahead() if self._reader is not None else ""

    def status(self) -> PowerStatus:
        """The reader now, as /healthz shows it."""
        return PowerStatus(
            sources=tuple(s.name for s in self.sources),
            reader=self.reader,
            reader_priority=(self.reader_ahead() or "process") if self._reader else None,
            sample_hz=self.rate.hz,
            reading_cpu_s=self.rate.cost_s,
            window_hz=self.windows.hz,
            window_readings=self.window_readings,
            windows_refused=self.windows.refused,
        )

    def child_pids(self) -> set[int]:
        """The processes the sources run for their readings (tegrastats, powermetrics)."""
        return {pid for source in self.sources if (pid := source.child_pid()) is not None}

    def close(self) -> None:
        if self._reader is not None:  # before the sources close the files it reads
            self._reader.close()
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:  # closing must go on for the others
                log.warning("closing power source %s: %s", source.name, exc)
