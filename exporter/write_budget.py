"""The state directory's write budget: bytes per hour, a token bucket that holds half
an hour's worth, so bytes written in any hour stay under 1.5 times the budget, plus
one write larger than the bucket that a full bucket lets go into debt (a snapshot of
a large live set: it never waits forever; the hours after pay for it)."""

from __future__ import annotations

import time
from collections.abc import Callable


class WriteBudget:
    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = per_hour
        self.capacity = per_hour / 2
        self._rate = per_hour / 3600.0
        self.clock = clock
        self._tokens = self.capacity
        self._at = clock()

    def allows(self, size: int) -> bool:
        """Whether ``size`` bytes may be written now: the bucket holds them, or is full
        (a record larger than the bucket goes alone, into debt)."""
        tokens = self._refill()
        return tokens >= size or tokens >= self.capacity

    def spend(self, size: int) -> None:
        self._tokens = self._refill() - size

    def wait_s(self, size: int) -> float:
        """Seconds until ``allows(size)``."""
        missing = min(size, self.capacity) - self._refill()
        return max(0.0, missing / self._rate)

    def _refill(self) -> float:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        return self._tokens
