"""A window's device energy at its two edges, as the power trace settles it.

An edge never waits for a reading: the row taken at it holds the device's energy as
its pass saw it, past a push source's last line (tegrastats, powermetrics) the last
power held. Once the reading after the edge has come, the trace's integral up to the
edge is final (PowerMeter.settled_energy), and is kept here, since the trace keeps
only its last readings: a window's device energy is then exactly the trace's integral
between its edges, and says it is final.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.targets.row import SampleRow

# The device's energy up to a past monotonic instant once final, else None.
Settle = typing.Callable[[float], "float | None"]  # 3.8: abc.Callable takes no [...]


class Settlement(typing.Protocol):
    """The device's energy as the power trace settles it (PowerMeter)."""

    def settled_energy(self, t: float) -> float | None:
        """Joules up to the past instant ``t`` once final, else None."""

    def settled_until(self) -> float | None:
        """The newest instant that settles now: every later one gives None (None:
        none does)."""


def settler(settlement: Settlement) -> tuple[float | None, Settle]:
    """``settlement``'s horizon now, and its Settle for the many instants of one look
    at the windows: an instant past the horizon (an edge whose next reading has not
    come: with a 1 Hz push source, every window of the last second) costs a
    comparison, not a trip through the trace's lock (~1 us, ~90 a pass at 90 edges a
    second)."""
    until = settlement.settled_until()
    energy = settlement.settled_energy
    if until is None:
        return None, _unsettled
    return until, lambda t: None if t > until else energy(t)


def _unsettled(t: float) -> float | None:
    return None


@dataclass(**SLOTS)
class EdgeEnergy:
    """The settled energy at a window's first row, and at its last row so far (the
    instant it is for: the last row moves while the window runs)."""

    start_j: float | None = None
    end_at: float | None = None
    end_j: float | None = None

    def settle(self, first: SampleRow | None, last: SampleRow | None, settle: Settle) -> None:
        """Settle the edges not yet final by ``settle`` (cheap where they are)."""
        if first is None or last is None or first.device_energy_j is None:
            return
        if self.start_j is None:
            self.start_j = settle(first.monotonic)
        if self.end_at != last.monotonic:
            end = settle(last.monotonic)
            if end is not None:
                self.end_at, self.end_j = last.monotonic, end

    def final(self, first: SampleRow | None, last: SampleRow | None) -> bool:
        """Whether the device's energy between ``first`` and ``last`` is settled (no
        sensor, or no row yet: nothing to settle)."""
        if first is None or last is None or first.device_energy_j is None:
            return True
        return self.start_j is not None and self.end_at == last.monotonic

    def device_energy(self, first: SampleRow | None, last: SampleRow | None) -> float | None:
        """The device's joules between the two rows: the trace's integral where both
        edges are settled, else the rows' own difference (not final)."""
        if first is None or last is None:
            return None
        if self.final(first, last) and self.start_j is not None and self.end_j is not None:
            return self.end_j - self.start_j
        if first.device_energy_j is None or last.device_energy_j is None:
            return None
        return last.device_energy_j - first.device_energy_j
