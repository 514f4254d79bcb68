"""The API's CPU per person: what one user's requests may make the root daemon spend.

Answers from memory are cheap, but not free: 2,200 failing lookups a second over 4
connections would keep a core of the daemon busy, at Nice -10, above the sender's
own priority. So each person (core/persons.py) has a bucket of CPU seconds,
refilled at ``SHARE`` of one core up to ``BURST_S``; each request's handling is
charged to it (the connection thread's own CPU time, from reading the request to the
answer sent); a person whose bucket is empty has her connections read later, once it
has refilled above zero, never anyone else's. Root and the daemon's own uid are not counted.

Over any window of T seconds a person's requests thus cost at most
``BURST_S + SHARE * T`` plus one request per connection she holds (a request is
charged once handled: up to ``MAX_CONNECTIONS_PER_PERSON`` of them run at once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SHARE = 0.05  # of one core, per person, sustained
BURST_S = 0.25  # CPU seconds one person may spend at once after a quiet spell
# Buckets kept for persons not seen since they filled (those are forgotten past this).
MAX_IDLE_BUCKETS = 1024


class CpuBudget:
    """Buckets of CPU seconds by person, refilled at ``share`` of a core."""

    def __init__(
        self,
        share: float = SHARE,
        burst_s: float = BURST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share = share
        self.burst_s = burst_s
        self._clock = clock
        self._lock = threading.Lock()
        # person -> [CPU seconds left (< 0: overspent), when last refilled]
        self._buckets: dict[int, list[float]] = {}

    def _refilled(self, person: int, now: float) -> list[float]:
        bucket = self._buckets.get(person)
        if bucket is None:
            if len(self._buckets) >= MAX_IDLE_BUCKETS:
                self._forget_full(now)
            bucket = self._buckets[person] = [self.burst_s, now]
        else:
            bucket[0] = min(self.burst_s, bucket[0] + (now - bucket[1]) * self.share)
            bucket[1] = now
        return bucket

    def _forget_full(self, now: float) -> None:
        """Let go of the buckets that would be full by now: they hold nothing."""
        for person, (left, at) in list(self._buckets.items()):
            if left + (now - at) * self.share >= self.burst_s:
                del self._buckets[person]

    def delay(self, person: int) -> float:
        """Seconds until ``person`` may be served again (0: now)."""
        with self._lock:
            left = self._refilled(person, self._clock())[0]
        return 0.0 if left > 0 else -left / self.share + 0.001

    def charge(self, person: int, cpu_s: float) -> None:
        with self._lock:
            self._refilled(person, self._clock())[0] -= cpu_s

    def wait(self, person: int) -> float:
        """Sleep until ``person`` may be served again; the seconds slept."""
        slept = 0.0
        while (delay := self.delay(person)) > 0:
            time.sleep(delay)
            slept += delay
        return slept
