"""Young windows read at the window rate, paid from an allowance of the reader's CPU.

While a window is young (a phase, a ``track`` call or an FL round opened less than
meter.WINDOW_BOOST_S ago, as the edges say), the streamed sources are read at
``window_hz``. What that costs comes out of an allowance that refills at what the
budget leaves beside the steady rate's measured usage, so a short window is read
finely and the reader's average stays within AUTO_BUDGET; a window opened when the
allowance is spent gets the steady rate, and is counted.

A plain object: every instant (monotonic) and every CPU figure is passed in by the
reader that reads the windows (python_reader.py, native.py), under the meter's lock.
"""

from __future__ import annotations

from edgewatt.core.power.rate import STEADY_SHARE
from edgewatt.core.power.source import AUTO_BUDGET

# The allowance holds at most this many seconds of the whole budget (50 ms of CPU: a
# few seconds of windows at once).
WINDOW_ALLOWANCE_S = 10.0


class WindowAllowance:
    def __init__(self, hz: float, now: float, budget: float = AUTO_BUDGET) -> None:
        self.hz = hz  # the window rate (0: none)
        self.budget = budget  # of one core, the steady rate's and the windows' together
        self.left_s = budget * WINDOW_ALLOWANCE_S  # CPU s; starts full
        self.cpu_s = 0.0  # what the windows spent, wakes included, since start
        self.refused = 0  # windows opened with the allowance spent
        self.until = 0.0  # the window rate is read until then
        self.since: float | None = None  # since when it has been read (None: not now)
        self._refilled_at = now
        self._cpu_taken = 0.0  # cpu_s as of the last take_spent

    def refill(self, now: float, steady_usage: float | None) -> None:
        """What the budget leaves beside the steady stream's measured usage (half of it
        before the first measure), since the last refill, up to WINDOW_ALLOWANCE_S of
        the whole budget. The steady rate leaves none where no window opened lately:
        the allowance, full then, funds the first windows, and the next calibration
        lowers the steady rate to make room (rate.py)."""
        steady = steady_usage if steady_usage is not None else self.budget * STEADY_SHARE
        spare = max(0.0, self.budget - steady)
        self.left_s = min(
            self.budget * WINDOW_ALLOWANCE_S, self.left_s + spare * (now - self._refilled_at)
        )
        self._refilled_at = now

    def open(
        self, now: float, until: float | None, steady_hz: float, steady_usage: float | None
    ) -> bool:
        """At an edge: a window is young until ``until`` (None: none is, and the window
        rate stops at its next reading). True where the window rate starts now; not
        where it is no finer than ``steady_hz`` or the allowance is spent (refused)."""
        self.until = 0.0 if until is None else until
        if until is None or until <= now or self.hz <= steady_hz:
            return False
        self.refill(now, steady_usage)
        if self.left_s <= 0:
            self.refused += 1
            return False
        if self.since is not None:
            return False  # read at the window rate already, now for longer
        self.since = now
        return True

    def charge(self, now: float, cpu_s: float, steady_usage: float | None) -> None:
        """``cpu_s`` spent reading at the window rate, up to ``now``."""
        self.refill(now, steady_usage)
        self.left_s -= cpu_s
        self.cpu_s += cpu_s

    def reading(self, t: float) -> bool:
        """Whether the window rate is read at ``t``: not past the window's youth, nor
        with the allowance spent (then it stops until an edge opens another)."""
        if self.since is not None and (t >= self.until or self.left_s <= 0):
            self.since = None
        return self.since is not None

    def fine_since(self, edge: float | None) -> bool:
        """Whether the window rate has been read since ``edge`` (or before) all along."""
        return self.since is not None and edge is not None and self.since <= edge

    def take_spent(self) -> float:
        """What the windows spent since the last take: the steady rate makes room for
        it (RateController.calibrate)."""
        spent, self._cpu_taken = self.cpu_s - self._cpu_taken, self.cpu_s
        return spent
