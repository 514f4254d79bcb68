"""What reads the streamed sources between the edges: a pull source without an energy
counter (an INA3221's board input) is read ``sample_hz`` times a second, and at the
window rate while a window is young, into its trace (traces.py).

Two readers implement it: Python threads (python_reader.py) and, where it was built,
a native thread per stream (native.py over _stream.c), cheaper per reading. The meter
(meter.py) starts one and tells it each edge; both share a :class:`Pacing`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from edgewatt.core.power.allowance import WindowAllowance
from edgewatt.core.power.rate import RateController

# Readings whose lateness a reader keeps until it is asked (as _stream.c's LATE_KEEP).
LATE_KEEP = 4096


class StreamReader(Protocol):
    name: str  # "python" or "native", as /healthz says
    window_readings: int  # taken at the window rate since start

    def at_edge(self, now: float) -> None:
        """At an edge, before the sources are taken (the meter's lock held): what was
        read since the last edge into the traces."""
        ...

    def after_edge(self, now: float, opened: bool) -> None:
        """After the edge ``now`` (the lock free): ``opened``, a window's rate starts."""
        ...

    def cpu_s(self) -> float:
        """Its threads' CPU since they started, their wakes included."""
        ...

    def lateness(self) -> list[float]:
        """How late each steady-rate reading since the last call was, in s: its time
        against when it was due (the last LATE_KEEP; benchmarks/power_reader.py)."""
        ...

    def ahead(self) -> str:
        """How its thread runs ahead of the process's work: "fifo", "nice -N", or ""
        (as its process)."""
        ...

    def close(self) -> None:
        """Its threads stopped (before the sources close the files they read)."""
        ...


@dataclass
class Pacing:
    """The rates a reader reads at and the CPU they may cost: the steady rate's
    controller and the windows' allowance, both changed under ``lock`` (the traces')."""

    rate: RateController
    windows: WindowAllowance
    lock: threading.Lock

    def calibrate(self, cpu_s: float, wall_s: float, readings: int) -> None:
        """One calibration window of the steady rate, measured by the reader."""
        with self.lock:
            spent = self.windows.take_spent()
        self.rate.calibrate(cpu_s, wall_s, readings, spent)

    def charge(self, now: float, cpu_s: float) -> None:
        """What reading at the window rate cost (lock held)."""
        self.windows.charge(now, cpu_s, self.rate.usage)

    def open(self, now: float, until: float | None) -> bool:
        """At an edge (lock held): WindowAllowance.open beside the steady rate now."""
        return self.windows.open(now, until, self.rate.hz, self.rate.usage)
