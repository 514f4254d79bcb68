"""Energy of one power signal, answerable at any instant of its recent past.

The power reader feeds readings at the sensor's rate; a pass, a phase edge or a
``track`` edge then asks for the energy up to its own instant, interpolated between
the two readings around it (docs/attribution.md): a window is as fine as the sensor,
not as the pass.

Two kinds of signal:
- power in W (INA3221, tegrastats): integrated by the trapezoid rule; inside an
  interval the power is taken as linear between its two readings. A gap longer than
  ``max_gap_s`` (the sensor stopped, tegrastats restarts) is not bridged: nothing is
  invented for a time nothing was measured.
- a hardware energy counter in J (RAPL, NVML, powermetrics' sum): made monotonic
  across source restarts (a counter that goes back restarted from zero), linear in
  between, and past its last reading at that reading's power where it had one.
"""

from __future__ import annotations

import math
from collections import deque

# Readings kept for interpolation: edges ask about the last moments only (a pass
# takes a reading at its own edge), so a few seconds at the highest rate is plenty.
KEEP_POINTS = 4096
_EMPTY = (float("inf"), float("-inf"))  # a power range no reading has widened yet


class Trace:
    def __init__(self, max_gap_s: float, *, counter: bool = False) -> None:
        self.max_gap_s = max_gap_s
        self.counter = counter
        self.joules = 0.0  # up to the last reading
        self._raw: float | None = None  # a counter's last raw value
        self._points: deque[tuple[float, float, float]] = deque(maxlen=KEEP_POINTS)
        # The power's lowest and highest since the last edge took them (take_range),
        # kept as readings arrive so that no edge scans the trace; a counter's are its
        # intervals' mean powers. Empty (low above high) until a reading comes.
        self._low, self._high = _EMPTY

    def add(self, t: float, watts: float | None, raw_joules: float | None = None) -> bool:
        """One reading (power, or the counter's raw joules); False when it is not newer
        than the last one (the same reading again) and was not taken."""
        points = self._points
        if points and t <= points[-1][0]:
            return False
        if self.counter:
            if raw_joules is None:
                return False
            if self._raw is not None:
                added = raw_joules - self._raw if raw_joules >= self._raw else raw_joules
                self.joules += added
                if points and t - points[-1][0] <= self.max_gap_s:
                    mean = added / (t - points[-1][0])
                    self._low, self._high = min(self._low, mean), max(self._high, mean)
            self._raw = raw_joules
        elif watts is None:
            return False
        else:
            if points and t - points[-1][0] <= self.max_gap_s:
                self.joules += (points[-1][1] + watts) / 2 * (t - points[-1][0])
            # Inline, as this runs for every reading (up to 1 kHz).
            if watts < self._low:
                self._low = watts
            if watts > self._high:
                self._high = watts
        points.append((t, watts if watts is not None else 0.0, self.joules))
        return True

    def take_range(self) -> tuple[float, float] | None:
        """The lowest and highest power read since the last take (None: none read), and
        a new range begun at the last reading: the power at the edge between two
        intervals is in both. A power trace's is exact between its readings (linear
        there); a counter's is of its intervals' means, and begins empty."""
        taken = (self._low, self._high) if self._low <= self._high else None
        if self._points and not self.counter:
            self._low = self._high = self._points[-1][1]
        else:
            self._low, self._high = _EMPTY
        return taken

    def settled_at(self, t: float, now: float) -> float | None:
        """Joules up to instant ``t`` once no reading to come can change them: a reading
        at or after ``t`` has come (interpolated between the two around it), or the
        signal has been silent beyond the gap limit at ``now`` (nothing will be bridged
        to ``t``: the count at its last reading). None: not yet, or ``t`` is older than
        the readings kept (an edge is settled within a pass or two of it)."""
        points = self._points
        if not points:
            return None
        if t < points[0][0] and len(points) == points.maxlen:
            return None
        t_last, _, j_last = points[-1]
        if t_last >= t:
            return self.at(t)
        return j_last if now - t_last > self.max_gap_s else None

    def settled_until(self, now: float) -> float | None:
        """The newest instant :meth:`settled_at` can give joules for at ``now``: None
        for every later one (the reading after it has not come); inf once the signal
        is silent beyond the gap limit; None where it has no reading (none settles)."""
        points = self._points
        if not points:
            return None
        t_last = points[-1][0]
        return math.inf if now - t_last > self.max_gap_s else t_last

    def at(self, t: float) -> float:
        """Joules up to instant ``t``. After the last reading, the last power is held
        (within the gap limit): a counter's too, where its reading had one (a
        powermetrics sample whose successor has not come yet), else it stays where it
        was. Before the oldest reading kept, the oldest count."""
        points = self._points
        if not points:
            return self.joules
        t_last, w_last, j_last = points[-1]
        if t >= t_last:
            if t - t_last > self.max_gap_s:
                return j_last
            return j_last + w_last * (t - t_last)  # a counter without a power: w_last 0
        # Edges ask about the newest readings: search from the right.
        i = len(points) - 1
        while i > 0 and points[i - 1][0] > t:
            i -= 1
        if i == 0:
            return points[0][2]
        t0, w0, j0 = points[i - 1]
        t1, w1, j1 = points[i]
        share = (t - t0) / (t1 - t0)
        if self.counter:
            return j0 + (j1 - j0) * share
        if t1 - t0 > self.max_gap_s:
            return j0
        w_t = w0 + (w1 - w0) * share
        return j0 + (w0 + w_t) / 2 * (t - t0)
