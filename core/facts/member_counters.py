"""One member of a process tree, read: its counters by the target's counting rule.

``process.py`` says the two rules (by owner, by reaper); this module applies them to
one process at a time, so the walk (``tree_walk.py``) and the accounting of departed
members (``departures.py``) share one reading and one vector arithmetic.

Counters (:class:`Counters`) are four named counters: user and system CPU time in
/proc's clock ticks, storage bytes read and written. Ticks may be fractional: exit
records are in microseconds. A member's channels (core/channels.py: context switches,
...) are its own counts, a tuple in the channels' order (``Member.counts``).
"""

from __future__ import annotations

import functools
import typing  # runtime aliases: Python 3.8's builtins take no [...]
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.procfs import NoSuchProcess, ProcHandle, Stat


class Counters(typing.NamedTuple):
    """Cumulative counters of a member, of departed members, or of a whole target.

    A NamedTuple, not a dataclass: built for each member read, and equal to the plain
    tuple of its figures."""

    user_ticks: float  # CPU time in user mode, in /proc's clock ticks
    system_ticks: float
    read_bytes: int  # storage bytes (/proc/PID/io's read_bytes, write_bytes)
    write_bytes: int

    @property
    def cpu_ticks(self) -> float:
        """User and system time together: /proc and the exit records split the same
        runtime between the two differently, so CPU time compares as a whole."""
        return self.user_ticks + self.system_ticks


ZERO = Counters(0, 0, 0, 0)


# Counters from the tuple of its four figures in order, as Counters(...) makes them at
# half the cost (NamedTuple's __new__ is Python): for the paths run for each member or
# target each pass.
counters_of: typing.Callable[[tuple[float, float, int, int]], Counters] = functools.partial(
    tuple.__new__, Counters
)


def add(a: Counters, b: Counters) -> Counters:
    return Counters(
        a.user_ticks + b.user_ticks,
        a.system_ticks + b.system_ticks,
        a.read_bytes + b.read_bytes,
        a.write_bytes + b.write_bytes,
    )


def sub_floor(a: Counters, b: Counters) -> Counters:
    """Each channel of ``a`` less ``b``'s, never below zero."""
    return Counters(
        max(0, a.user_ticks - b.user_ticks),
        max(0, a.system_ticks - b.system_ticks),
        max(0, a.read_bytes - b.read_bytes),
        max(0, a.write_bytes - b.write_bytes),
    )


@dataclass(**SLOTS)
class Member:
    handle: ProcHandle
    ppid: int
    totals: Counters  # own + reaped-children figures, as last seen
    reaped: Counters  # the reaped-children part alone (where a reaped child's totals land)
    io: tuple[int, int] | None  # as last read
    fds: int | None
    activity: bytes | None  # scheduler counters when io and fds were read
    idle: bool  # did not run since the previous reading: io and fds carried over
    reaped_cpu: float  # its reaped children's CPU ticks (cutime + cstime)
    zombie: bool = False  # read after its exit, before its reaping: figures final
    # Its channels' counts as last read (procfs.ProcHandle.counts; None: not shown):
    # its own, never in a reaper's, so a departed member's are carried at once.
    counts: tuple[int, ...] | None = None


class MemberReader:
    """Reads one member at a time, by the target's rule: ``own_cpu`` (by owner: every
    member counts its own time), else by reaper (reaped children's counters included
    where the target has ``children``)."""

    def __init__(self, root: ProcHandle, *, own_cpu: bool, children: bool) -> None:
        self._root = root
        self._own_cpu = own_cpu
        self._children = children
        self.io_visible = True  # the root's /proc/PID/io could be read at its last reading

    def read(
        self, handle: ProcHandle, stat: Stat, before: Member | None, recheck: bool
    ) -> Member | None:
        """One member's figures (None: gone meanwhile); io and the descriptor count are
        carried over from the previous reading (``before``) when its only thread has not
        run since (one read instead of three, and socket discovery skips it: most
        members of most trees wait)."""
        if before is not None and before.handle is not handle:
            before = None
        try:
            # Read before io and fds: a run after this read shows in the next one.
            activity = handle.activity() if stat.num_threads == 1 else None
            idle = (
                not recheck
                and activity is not None
                and before is not None
                and activity == before.activity
            )
            if idle:
                assert before is not None
                io, fds, counts = before.io, before.fds, before.counts
            else:
                io, fds = handle.io(), handle.fd_count()
                counts = handle.counts(stat)
                if before is not None and before.counts == counts:
                    counts = before.counts  # the same object: the target's sum is kept
        except NoSuchProcess:
            if before is None and handle is not self._root:
                handle.close()  # opened this pass: no one else holds it
            return None
        if handle is self._root:
            self.io_visible = io is not None
        read, write = io if io is not None else (0, 0)
        reaped_cpu = stat.cutime + stat.cstime
        if self._own_cpu:  # every member counts its own time: reaped children count theirs
            now = (stat.utime, stat.stime, read, write)
            now_reaped = (0, 0, read, write)
        elif self._children:
            now = (stat.utime + stat.cutime, stat.stime + stat.cstime, read, write)
            now_reaped = (stat.cutime, stat.cstime, read, write)
        else:
            now = (stat.utime, stat.stime, read, write)
            now_reaped = ZERO
        # Most members wait: their counters as they were, the same objects kept (a
        # comparison costs less than a new Counters).
        if before is not None and before.totals == now and before.reaped == now_reaped:
            totals, reaped = before.totals, before.reaped
        else:
            totals, reaped = counters_of(now), counters_of(now_reaped)
        return Member(
            handle, stat.ppid, totals, reaped, io, fds, activity, idle, reaped_cpu,
            counts=counts,
        )  # fmt: skip

    def read_zombie(self, member: Member) -> None:
        """A member the events say exited, read once more if it is not reaped yet (by
        owner): a zombie's counters are final, its own teardown included and every child
        it reaped (``edgewatt run`` holds its command so until a pass has read it)."""
        if not self._own_cpu:
            return
        try:
            stat = member.handle.stat()
        except NoSuchProcess:
            return
        if stat.state == "Z":
            totals = member.totals
            member.totals = Counters(stat.utime, stat.stime, totals.read_bytes, totals.write_bytes)
            member.reaped_cpu = stat.cutime + stat.cstime
            member.zombie = True
