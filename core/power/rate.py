"""The steady rate of the power reader's stream, chosen on the device from the reader's
own measured cost (source.py: AUTO_RATES_HZ within AUTO_BUDGET of one core).

A plain object, fed one calibration window at a time (the reader's CPU over it, its
length, its readings, what the young windows spent meanwhile); the reader that reads
at the rate (python_reader.py, native.py) measures and feeds it. A configured rate is
measured and kept.
"""

from __future__ import annotations

import logging

from edgewatt.core.power.source import AUTO_BUDGET, AUTO_RATES_HZ, AUTO_START_HZ

log = logging.getLogger(__name__)

# The automatic rate is chosen again from each window of this many seconds of the
# reader thread's own CPU clock (its cost varies with the machine's load and clocks).
CALIBRATION_S = 10.0
# Windows within the budget before a higher rate is tried, at first; each failed try
# doubles it, up to MAX_PROBE_WAIT (30 min of 10 s windows).
PROBE_EVERY = 6
MAX_PROBE_WAIT = 180
# The steady stream keeps within AUTO_BUDGET less what the young windows spent in the
# last calibration window, and gets at least this share of it.
STEADY_SHARE = 0.5


def auto_rate(
    cost_s: float, budget: float = AUTO_BUDGET, rates: tuple[float, ...] = AUTO_RATES_HZ
) -> float:
    """The highest of ``rates`` whose cost (``cost_s`` of the reader's CPU per reading,
    wake included) stays within ``budget`` of one core; the lowest else."""
    within = [hz for hz in rates if hz * cost_s <= budget]
    return max(within) if within else rates[0]


class RateController:
    def __init__(self, sample_hz: float | None, calibration_s: float = CALIBRATION_S) -> None:
        # None: chosen here, from the reader's measured cost (auto_rate).
        self.auto = sample_hz is None
        self.hz = sample_hz if sample_hz is not None else AUTO_START_HZ
        self.calibration_s = calibration_s
        # The steady rate's share of one core: AUTO_BUDGET less what the windows spent
        # in the last calibration window, at least STEADY_SHARE of it.
        self.budget = AUTO_BUDGET
        self.cost_s: float | None = None  # the reader's CPU per reading, measured
        self.usage: float | None = None  # its share of one core in the last window
        # Windows within the budget before a higher rate is tried (doubled by each
        # failed try, up to MAX_PROBE_WAIT).
        self.probe_wait = PROBE_EVERY
        self._windows = 0  # since the last change of rate
        self._probing = False  # the rate was just raised, to be measured

    def calibrate(
        self, cpu_s: float, wall_s: float, readings: int, windows_cpu_s: float = 0.0
    ) -> float:
        """One window's measured cost (``cpu_s`` over ``wall_s`` for ``readings``, and
        ``windows_cpu_s`` the young windows spent meanwhile); the rate now. Under the
        automatic rate: over the budget, one rate down (or lower, where the cost per
        reading says so); within it, a rate up is tried now and then (a wake costs more
        per reading at a lower rate, so the cost at another rate is measured there, not
        extrapolated), each failed try doubling the wait before the next."""
        self.cost_s = cpu_s / readings
        self.usage = cpu_s / wall_s if wall_s > 0 else None
        if wall_s > 0:
            self.budget = max(AUTO_BUDGET * STEADY_SHARE, AUTO_BUDGET - windows_cpu_s / wall_s)
        if not self.auto or self.usage is None:
            return self.hz
        level = AUTO_RATES_HZ.index(self.hz)
        if self.usage > self.budget and level > 0:
            if self._probing:  # the try failed: wait longer before the next
                self._probing = False
                self.probe_wait = min(2 * self.probe_wait, MAX_PROBE_WAIT)
            self._set(min(AUTO_RATES_HZ[level - 1], auto_rate(self.cost_s, self.budget)), "over")
        elif self._probing:
            self._probing = False
            self.probe_wait = PROBE_EVERY
            self._set(self.hz, "within")  # the try holds: logged as chosen
        elif level + 1 < len(AUTO_RATES_HZ) and self._windows >= self.probe_wait:
            self._probing = True
            self._set(AUTO_RATES_HZ[level + 1], "try")
        else:
            self._windows += 1
        return self.hz

    def _set(self, hz: float, why: str) -> None:
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
                self.hz,
                self.budget * 100,
            )
        self.hz = hz
