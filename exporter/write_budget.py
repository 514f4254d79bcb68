"""The state directory's write budget, per person: bytes per hour, each from token
buckets that hold half an hour's worth, so bytes written in any hour stay under 1.5
times a bucket's rate, plus one write larger than a bucket that a full bucket lets go
into debt (a snapshot of a large live set: it never waits forever; the hours after
pay for it).

Three buckets pay a user's change: her person's (core/persons.py: her subordinate
uids are hers), at ``PERSON_SHARE`` of the budget; all users' together, at the
budget less ``RESERVE``; and the budget's own. Root's and the daemon's own uid's
changes (the administrator's) and the snapshots the daemon writes on its own pay
the budget's alone. So a person past her share waits, and nobody else (the users'
bucket holds six persons' full shares); and whatever the users do, the administrator
keeps ``RESERVE`` of the budget.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

PERSON_SHARE = 1 / 8  # of the budget, one person's (2 MiB an hour at the default 16 MiB)
RESERVE = 1 / 4  # of the budget, the administrator's: users together get the rest
# Buckets kept for persons not seen since they filled (those are forgotten past this).
MAX_IDLE_BUCKETS = 1024


class Bucket:
    """Bytes refilled at ``per_hour`` up to half an hour's worth."""

    def __init__(self, per_hour: float, now: float) -> None:
        self.per_hour = per_hour
        self.capacity = per_hour / 2
        self._rate = per_hour / 3600.0
        self._tokens = self.capacity
        self._at = now

    def allows(self, size: float, now: float) -> bool:
        """The bucket holds ``size``, or is full (a record larger than the bucket goes
        alone, into debt)."""
        tokens = self._refill(now)
        return tokens >= size or tokens >= self.capacity

    def spend(self, size: float, now: float) -> None:
        self._tokens = self._refill(now) - size

    def wait_s(self, size: float, now: float) -> float:
        """Seconds until ``allows(size)``."""
        return max(0.0, (min(size, self.capacity) - self._refill(now)) / self._rate)

    def full(self, now: float) -> bool:
        return self._refill(now) >= self.capacity

    def _refill(self, now: float) -> float:
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        return self._tokens


class WriteBudget:
    """The buckets each write pays, by its payer (``payer``)."""

    def __init__(
        self,
        per_hour: int,
        clock: Callable[[], float] = time.monotonic,
        person: Callable[[int], int] = int,
    ) -> None:
        self.per_hour = per_hour
        self.users_per_hour = int(per_hour * (1 - RESERVE))
        self.person_per_hour = int(per_hour * PERSON_SHARE)
        self.clock = clock
        self.person = person
        self._administrators = frozenset({0, os.geteuid()})
        now = clock()
        self._all = Bucket(per_hour, now)
        self._users = Bucket(self.users_per_hour, now)
        self._persons: dict[int, Bucket] = {}

    def payer(self, uid: object) -> int | None:
        """Whose buckets a write for ``uid`` pays: its person's, or None for the
        administrator's (root, the daemon's own uid) and the daemon's own writes
        (``uid`` None). A uid that is not a number is a person of its own."""
        if uid is None:
            return None
        if not isinstance(uid, int):
            return -1
        return None if uid in self._administrators else self.person(uid)

    def allows(self, payer: int | None, size: float) -> bool:
        """Whether ``size`` bytes ``payer`` pays may be written now."""
        now = self.clock()
        return all(b.allows(size, now) for b in self._buckets(payer, now))

    def spend(self, payer: int | None, size: float) -> None:
        now = self.clock()
        for bucket in self._buckets(payer, now):
            bucket.spend(size, now)

    def wait_s(self, payer: int | None, size: float) -> float:
        """Seconds until ``allows(payer, size)``."""
        now = self.clock()
        return max(b.wait_s(size, now) for b in self._buckets(payer, now))

    def _buckets(self, payer: int | None, now: float) -> list[Bucket]:
        if payer is None:
            return [self._all]
        bucket = self._persons.get(payer)
        if bucket is None:
            if len(self._persons) >= MAX_IDLE_BUCKETS:
                # A full bucket is what a new one would be: forgetting it loses nothing.
                self._persons = {p: b for p, b in self._persons.items() if not b.full(now)}
            bucket = self._persons[payer] = Bucket(self.person_per_hour, now)
        return [bucket, self._users, self._all]
