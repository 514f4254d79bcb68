"""The board input streamed by the native reader (_stream.c), where it was built.

A Python thread's wake is most of what a reading costs (docs/performance.md); the
native thread reads the same open sysfs files without the GIL, at a rate changed at
once (the window rate at an edge), and keeps the raw values, drained into the traces
at each edge. Where the extension is absent (no C compiler or Python headers at
install), or ``EDGEWATT_NATIVE_READER=0``, Python's threads read (python_reader.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from edgewatt.core.power.reader import Pacing
from edgewatt.core.power.traces import Traces

log = logging.getLogger(__name__)

# Readings a stream's ring holds between two drains: 33 s at the highest rate (1 kHz).
# The reader drains it at every edge and, between edges further apart, every
# meter.NATIVE_DRAIN_S, so none is dropped whatever the pass interval.
RING_READINGS = 32768

try:
    from edgewatt.core.power import _stream
except ImportError:  # built optionally: the Python reader then
    _stream = None


class Streamable(Protocol):
    """A source whose stream is a few value files (ina3221.Ina3221Source)."""

    name: str

    def stream_fds(self) -> tuple[int, ...] | None: ...

    def total_from(self, values: tuple[int, ...]) -> float | None: ...


def available() -> bool:
    return _stream is not None and os.environ.get("EDGEWATT_NATIVE_READER", "1") != "0"


class NativeStream:
    def __init__(self, source: Streamable, fds: tuple[int, ...], hz: float) -> None:
        self.source = source
        self._stream = _stream.Stream(fds, hz, RING_READINGS)  # type: ignore[union-attr]
        self.hz = hz
        self._rate = (hz, 0.0, hz)  # as last set: (hz, until, then_hz)
        self._lost = 0

    def set_rate(self, hz: float, until: float, then_hz: float) -> None:
        """At ``hz`` until the monotonic ``until`` (0: for good), then at ``then_hz``:
        the native thread changes by itself then, and is woken only to go faster."""
        if (hz, until, then_hz) != self._rate:
            self._stream.set_rate(hz, until, then_hz)
            self._rate = (hz, until, then_hz)
            self.hz = hz

    def drain(self) -> list[tuple[float, float]]:
        """(monotonic, W) of the board total at each reading since the last drain."""
        total_from = self.source.total_from
        lost = self._stream.stats()[1]
        if lost > self._lost:  # the drains came too seldom: a bug, say so
            log.warning(
                "native power reader of %s: %d readings dropped, its ring was full",
                self.source.name,
                lost - self._lost,
            )
            self._lost = lost
        return [
            (t, w) for t, values in self._stream.drain() if (w := total_from(values)) is not None
        ]

    def cpu_s(self) -> float:
        """The native thread's CPU clock (wakes included)."""
        return self._stream.cpu_s()

    def lateness(self) -> list[float]:
        """How late each reading since the last call was (s): its time against when it
        was due (the last 4096)."""
        return self._stream.lateness()

    def ahead(self) -> str:
        """ "fifo" or "nice -N": how its thread runs ahead of the process's work, where
        the process may (_stream.c's run_ahead); "": as its process."""
        return self._stream.ahead()

    def close(self) -> None:
        self._stream.close()


def stream(source: object, hz: float) -> NativeStream | None:
    """The native stream of ``source``, or None where it cannot have one."""
    if not available():
        return None
    fds = getattr(source, "stream_fds", lambda: None)()
    if not fds:
        return None
    try:
        return NativeStream(source, fds, hz)  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        log.warning("native power reader unavailable, the Python one reads: %s", exc)
        return None


class NativeReader:
    """The streams of every streamed source, steered at the edges: at the window rate
    while a window is young and the allowance lasts (one interval's overrun at most),
    else at the steady rate. Their CPU (their threads' clocks, and the drains at the
    edges) is counted at the edges: to the allowance where the window rate read since
    the last edge, else to the steady rate's calibration window."""

    name = "native"

    def __init__(
        self, streams: Sequence[NativeStream], traces: Traces, pacing: Pacing, drain_s: float
    ) -> None:
        self._streams = list(streams)
        self._traces = traces
        self._pacing = pacing
        self.window_readings = 0
        self._seen = (self.cpu_s(), time.monotonic())  # as of the last edge: CPU, when
        self._moved = 0  # readings drained since the last edge
        self._steady = (0.0, 0.0, 0)  # the calibration window so far: CPU, wall, readings
        self._complete: tuple[float, float, int] | None = None  # to calibrate after the edge
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run_drains, args=(drain_s,), name="edgewatt-power-drain", daemon=True
        )
        self._thread.start()

    def _run_drains(self, every_s: float) -> None:
        """Between edges further apart than ``every_s``: the rings into the traces (its
        own CPU is not counted: one drain in 8 s)."""
        while not self._stop.wait(every_s):
            with self._traces.lock:
                self._move()

    def _move(self) -> None:
        """The readings since the last drain into the traces (lock held)."""
        for stream in self._streams:
            trace = self._traces.totals[stream.source.name]
            for t, watts in stream.drain():
                self._moved += trace.add(t, watts)

    def at_edge(self, now: float) -> None:
        started = time.thread_time()
        self._move()
        drained, self._moved = self._moved, 0
        self._traces.readings += drained
        cpu = self.cpu_s()
        seen_cpu, seen_at = self._seen
        spent = cpu - seen_cpu + time.thread_time() - started
        self._seen = (cpu, now)
        if self._pacing.windows.since is not None:
            self._pacing.charge(now, spent)
            self.window_readings += drained
            return
        cpu_s, wall_s, count = self._steady
        cpu_s, wall_s, count = cpu_s + spent, wall_s + now - seen_at, count + drained
        if wall_s < self._pacing.rate.calibration_s or count == 0:
            self._steady = (cpu_s, wall_s, count)
            return
        self._steady = (0.0, 0.0, 0)
        self._complete = (cpu_s, wall_s, count)

    def after_edge(self, now: float, opened: bool) -> None:
        pacing = self._pacing
        if self._complete is not None:
            complete, self._complete = self._complete, None
            pacing.calibrate(*complete)
        with pacing.lock:
            windows = pacing.windows
            steady = pacing.rate.hz
            hz, until = (windows.hz, windows.until) if windows.reading(now) else (steady, 0.0)
        for stream in self._streams:
            stream.set_rate(hz, until, steady)

    def cpu_s(self) -> float:
        return sum(n.cpu_s() for n in self._streams)

    def lateness(self) -> list[float]:
        return [late for stream in self._streams for late in stream.lateness()]

    def ahead(self) -> str:
        return self._streams[0].ahead() if self._streams else ""

    def close(self) -> None:
        self._stop.set()
        for stream in self._streams:
            stream.close()
        self._thread.join(timeout=2)
