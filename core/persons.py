"""Who a uid is: the person every per-user share is counted against.

A user is not one uid. ``useradd`` gives each user a range of subordinate uids in
/etc/subuid (65,536 by default), and inside a user namespace of her own (``unshare
--map-auto`` needs no privilege: newuidmap is setuid) she runs as any of them; the
kernel then reports those uids (SO_PEERCRED, sock_diag, /proc). Counted by uid, one
user would hold 65,536 shares. So a uid in a range belongs to the range's owner, and
any other uid is a person of its own. Exemptions go by the real uid, never by the
person: root's subordinate uids are held to the shares like anyone's.

The file is re-read when it changes (its inode, size or modification time), looked
at no more than once every ``RECHECK_S``; a lookup is then a binary search.

Ranges handed out otherwise (libsubid's nss sources, a mapping root wrote for a
user) are learned from the peers that connect: a peer in a user namespace is its
owner's (user_namespaces.py), and so, from then on, is its uid, wherever the daemon
meets it (the targets it registers, a TCP peer's uid from socket diagnostics). What
is learned is bounded: ``MAX_LEARNED_PER_PERSON`` uids a person, ``MAX_LEARNED`` in
all; a uid not seen for ``LEARNED_IDLE_S`` and holding nothing (``in_use``) is
forgotten when room is needed. A uid that cannot be learned for want of room is
still its owner's on its connections; what it would register is refused (api.py).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS

SUBUID = "/etc/subuid"
RECHECK_S = 1.0  # an edited file holds from the next lookup at most this much later
MAX_LEARNED_PER_PERSON = 2048  # above the targets (running and kept) one person can hold
MAX_LEARNED = 16384  # 3.1 MiB of the daemon's memory when full (tracemalloc)
LEARNED_IDLE_S = 3600.0


@dataclass(frozen=True, **SLOTS)
class Range:
    """One line of /etc/subuid: ``count`` uids from ``start`` are ``owner``'s."""

    owner: int
    start: int
    count: int


def user_id(name: str) -> int | None:
    """The uid a line's owner names: a number, or a user's name (None: no such user)."""
    if name.isdigit():
        return int(name)
    import pwd  # Unix only: the client, which imports this module, runs on Windows too

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def parse_ranges(text: str, uid_of: Callable[[str], int | None] = user_id) -> list[Range]:
    """The ranges of a subuid file (``owner:start:count`` a line, the owner by name or
    uid, as newuidmap reads it), by start and made disjoint (where two overlap, the
    uids they share stay the one that starts first's); lines newuidmap would not use
    are left out."""
    found = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or not (fields[1].isdigit() and fields[2].isdigit()):
            continue  # blank, a comment, or malformed
        name, start, count = fields
        uid = uid_of(name)
        if uid is not None:
            found.append(Range(uid, int(start), int(count)))
    ranges: list[Range] = []
    end = 0  # the first uid past the ranges kept so far
    for r in sorted(found, key=lambda r: r.start):
        start = max(r.start, end)
        if start < r.start + r.count:
            ranges.append(Range(r.owner, start, r.start + r.count - start))
            end = r.start + r.count
    return ranges


def owner(ranges: list[Range], starts: list[int], uid: int) -> int | None:
    """The owner of the range holding ``uid``, None where none does (``ranges``
    disjoint, by start; ``starts`` their starts)."""
    n = bisect.bisect_right(starts, uid) - 1
    if n >= 0 and uid < ranges[n].start + ranges[n].count:
        return ranges[n].owner
    return None


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # no file: every uid is its own person
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Persons:
    """The person of a uid, from the subuid file at ``path``."""

    def __init__(self, path: str = SUBUID, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()  # one re-read at a time; lookups read a tuple
        self._checked = -RECHECK_S
        self._signature: tuple[int, int, int] | None = None
        self._table: tuple[list[Range], list[int]] = ([], [])
        # uid -> [its person, when last seen], learned from peers' namespaces.
        self._learned: dict[int, list[float]] = {}
        self._learned_per_person: Counter[int] = Counter()
        # The uids the daemon holds something of (its targets'): never forgotten.
        self.in_use: Callable[[], Collection[int]] = frozenset

    def of(self, uid: int) -> int:
        """The uid of the person ``uid`` belongs to: the owner of the subuid range that
        holds it, else the owner of the namespace it was last seen in, else ``uid``."""
        if self._clock() - self._checked >= RECHECK_S:
            self._refresh()
        found = owner(*self._table, uid)
        if found is not None:
            return found
        learned = self._learned.get(uid)
        return uid if learned is None else int(learned[0])

    def of_peer(self, pid: int, uid: int, pidfd: int | None = None) -> int:
        """The person of a connected peer (``pid`` and ``uid`` from SO_PEERCRED, its
        pidfd where the kernel gives one): the owner of the user namespace it runs
        in (user_namespaces.py), else the person of its uid. Learns the uid as hers."""
        from edgewatt.core.user_namespaces import namespace_owner  # Unix only: fcntl

        by_uid = self.of(uid)
        found = namespace_owner(pid, uid, pidfd)
        if found is None:
            return by_uid
        person = self.of(found)
        if uid != person and owner(*self._table, uid) is None:
            self.learn(uid, person)  # or, known, seen again
        return person

    def learn(self, uid: int, person: int) -> bool:
        """Count ``uid`` as ``person``'s from now on; False where there is no room."""
        now = self._clock()
        with self._lock:
            known = self._learned.get(uid)
            if known is not None and known[0] == person:
                known[1] = now
                return True
            if known is not None:  # seen in another person's namespace since
                self._drop(uid)
            if (
                self._learned_per_person[person] >= MAX_LEARNED_PER_PERSON
                or len(self._learned) >= MAX_LEARNED
            ):
                self._forget_idle(now)
            if (
                self._learned_per_person[person] >= MAX_LEARNED_PER_PERSON
                or len(self._learned) >= MAX_LEARNED
            ):
                return False
            self._learned[uid] = [person, now]
            self._learned_per_person[person] += 1
            return True

    def learned(self, uid: int) -> bool:
        """Whether ``uid``'s person comes from the subuid file or was learned (not
        from ``uid`` alone)."""
        return uid in self._learned or owner(*self._table, uid) is not None

    def _drop(self, uid: int) -> None:
        person = int(self._learned.pop(uid)[0])
        self._learned_per_person[person] -= 1
        if self._learned_per_person[person] <= 0:
            del self._learned_per_person[person]

    def _forget_idle(self, now: float) -> None:
        held = set(self.in_use())
        for uid, (_, seen) in list(self._learned.items()):
            if now - seen >= LEARNED_IDLE_S and uid not in held:
                self._drop(uid)

    def _refresh(self) -> None:
        with self._lock:
            now = self._clock()
            if now - self._checked < RECHECK_S:
                return  # another thread just did
            self._checked = now
            signature = _signature(self.path)
            if signature == self._signature:
                return
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    ranges = parse_ranges(f.read())
            except OSError:
                ranges = []
            self._signature = signature
            self._table = (ranges, [r.start for r in ranges])
