"""Bounds on the name lookups one user may make the daemon run.

Looking a container or unit up runs the runtime's CLI as root (`podman inspect`, tens
of ms of CPU) or walks the whole cgroup tree; a registration costs the user nothing.
So each user other than root (a person: her subordinate uids are hers, persons.py)
gets a token bucket (``rate_per_s``, ``burst``) shared by their registrations and by
the follows of their targets' names whose cgroup is gone, one lookup at a time, and a failed name is
answered from memory for ``failed_ttl_s``. Beyond the bound a registration is refused
at once (429), before anything runs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.uids import alone


class LookupRefused(Exception):
    """Over the user's bound; ``retry_s``: when a token comes (0: when theirs ends)."""

    def __init__(self, detail: str, retry_s: float) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_s = retry_s


class RememberedFailure(ValueError):
    """A name that failed a moment ago, answered without looking again."""


@dataclass(frozen=True, **SLOTS)
class LookupLimits:
    rate_per_s: float = 1.0  # sustained lookups a second, per user
    burst: int = 5  # lookups at once after a quiet while
    failed_ttl_s: float = 10.0  # a failed name is answered from memory this long
    remembered: int = 4096  # failed names kept, all users together (oldest go first)


class Lookups:
    """Per-user lookup bounds; root's lookups are not bounded."""

    def __init__(
        self,
        limits: LookupLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        person: Callable[[int], int] = alone,
    ) -> None:
        """``person``: whose bucket a uid's lookups take (core/persons.py)."""
        self.limits = limits or LookupLimits()
        self._clock = clock
        self._person = person
        self._lock = threading.Lock()
        self._tokens: dict[int, tuple[float, float]] = {}  # person -> (tokens, at)
        self._running: Counter[int] = Counter()
        self._failed: OrderedDict[tuple[int, str], tuple[float, str]] = OrderedDict()
        self.refused = 0  # lookups refused over a bound, since the start

    @contextmanager
    def bounded(self, uid: int, name: str) -> Iterator[None]:
        """Around one lookup of ``name`` for ``uid``: LookupRefused over the bound,
        RememberedFailure when it failed a moment ago; a ValueError out of the lookup
        (the name names nothing) is remembered."""
        if uid == 0:
            yield
            return
        person = self._person(uid)
        with self._lock:
            now = self._clock()
            failed = self._failed.get((person, name))
            if failed is not None and failed[0] > now:
                ttl = self.limits.failed_ttl_s
                raise RememberedFailure(f"{failed[1]} (failed within the last {ttl:g} s)")
            if self._running[person]:
                self.refused += 1
                raise LookupRefused("one name lookup of yours is already running", 0.0)
            self._take(person, now)
            self._running[person] += 1
        try:
            yield
        except ValueError as exc:
            self._remember(person, name, str(exc))
            raise
        finally:
            with self._lock:
                self._running[person] -= 1
                if self._running[person] <= 0:
                    del self._running[person]

    def follow(self, uid: int) -> bool:
        """Whether the name of a target whose cgroup is gone may be looked up now (a token
        of its user's: the same bucket as their registrations); the next pass tries again."""
        if uid == 0:
            return True
        person = self._person(uid)
        with self._lock:
            try:
                self._take(person, self._clock())
            except LookupRefused:
                return False
        return True

    def _take(self, person: int, now: float) -> None:
        limits = self.limits
        tokens, at = self._tokens.get(person, (float(limits.burst), now))
        tokens = min(float(limits.burst), tokens + (now - at) * limits.rate_per_s)
        if tokens < 1.0:
            self._tokens[person] = (tokens, now)
            self.refused += 1
            retry = (1.0 - tokens) / limits.rate_per_s
            raise LookupRefused(
                f"at most {limits.rate_per_s:g} name lookups a second per user "
                f"({limits.burst} at once); retry in {retry:.1f} s",
                retry,
            )
        self._tokens[person] = (tokens - 1.0, now)
        if len(self._tokens) > limits.remembered:  # a full bucket needs no entry
            refill = limits.burst / limits.rate_per_s
            for user in [u for u, (_, at) in self._tokens.items() if now - at >= refill]:
                del self._tokens[user]

    def _remember(self, person: int, name: str, detail: str) -> None:
        with self._lock:
            self._failed[(person, name)] = (self._clock() + self.limits.failed_ttl_s, detail)
            self._failed.move_to_end((person, name))
            while len(self._failed) > self.limits.remembered:
                self._failed.popitem(last=False)
