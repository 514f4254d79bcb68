"""The streamed sources read by Python threads: one at the steady rate, measuring its
own cost for the rate controller (rate.py), and one at the window rate while a window
is young, blocked without a timeout between windows (it costs nothing then), its CPU
charged to the windows' allowance (allowance.py)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from edgewatt.core.power.reader import LATE_KEEP, Pacing
from edgewatt.core.power.source import PowerSource
from edgewatt.core.power.traces import Traces


def sleep_until(deadline: float, period: float) -> float:
    """Sleep until the next reading is due; the deadline, moved past readings missed
    (a busy machine): those are skipped, never read in a burst."""
    delay = deadline - time.monotonic()
    if delay < -period:
        return deadline - delay // period * period
    if delay > 0:
        time.sleep(delay)
    return deadline


class PythonReader:
    name = "python"

    def __init__(self, sources: Sequence[PowerSource], traces: Traces, pacing: Pacing) -> None:
        self._sources = list(sources)
        self._traces = traces
        self._pacing = pacing
        self.window_readings = 0
        self._late: deque[float] = deque(maxlen=LATE_KEEP)  # appended by _run only
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads = [threading.Thread(target=self._run, name="edgewatt-power", daemon=True)]
        if pacing.windows.hz:
            self._threads.append(
                threading.Thread(
                    target=self._run_windows, name="edgewatt-power-windows", daemon=True
                )
            )
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        rate = self._pacing.rate
        period = 1.0 / rate.hz
        deadline = due = time.monotonic()  # due: before readings missed are skipped
        window = (time.thread_time(), deadline, 0)  # CPU, start, readings
        # A reading costs little (two preads); this thread's wake per reading is most
        # of the reader's cost (benchmarks/power_reader.py). time.sleep, not an Event:
        # a wait on a lock with a timeout costs more per wake; close() waits one
        # period at most. The stream carries the device's total; rails are read at
        # the edges.
        while not self._stop.is_set():
            for source in self._sources:
                self._traces.stream(source)
            self._late.append(time.monotonic() - due)
            cpu, started, count = window
            window = (cpu, started, count + 1)
            if deadline - started >= rate.calibration_s:
                self._pacing.calibrate(time.thread_time() - cpu, deadline - started, count + 1)
                period = 1.0 / rate.hz
                window = (time.thread_time(), deadline, 0)
            due = deadline + period
            deadline = sleep_until(due, period)

    def _run_windows(self) -> None:
        """Blocked (no wakes) until an edge opens a window, then the streamed sources at
        the window rate until the window is no longer young or the allowance is spent.
        Its CPU is its own thread clock, wake included."""
        pacing = self._pacing
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            period = 1.0 / pacing.windows.hz
            deadline = time.monotonic()
            cpu = time.thread_time()
            while not self._stop.is_set():
                with self._traces.lock:
                    now, clock = time.monotonic(), time.thread_time()
                    pacing.charge(now, clock - cpu)
                    cpu = clock
                    if not pacing.windows.reading(deadline):
                        break
                for source in self._sources:
                    self._traces.stream(source)
                self.window_readings += 1
                deadline = sleep_until(deadline + period, period)

    def at_edge(self, now: float) -> None:
        pass  # the threads feed the traces as they read

    def after_edge(self, now: float, opened: bool) -> None:
        if opened:
            self._wake.set()

    def ahead(self) -> str:
        return ""  # a thread's priority would not win it the GIL

    def lateness(self) -> list[float]:
        late = self._late
        return [late.popleft() for _ in range(len(late))]

    def cpu_s(self) -> float:
        clocks = [time.pthread_getcpuclockid(t.ident) for t in self._threads if t.ident]
        return sum(time.clock_gettime(clock) for clock in clocks)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=2)
