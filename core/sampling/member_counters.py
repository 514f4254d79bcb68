"""One member of a process tree, read: its counters by the target's counting rule.

``process.py`` says the two rules (by owner, by reaper); this module applies them to
one process at a time, so the walk (``tree_walk.py``) and the accounting of departed
members (``departures.py``) share one reading and one vector arithmetic.

Counters are a vector of four channels: user ticks, system ticks, read bytes, write
bytes. Ticks may be fractional: exit records are in microseconds.
"""

from __future__ import annotations

import typing  # runtime aliases: Python 3.8's builtins take no [...]
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.sampling.procfs import NoSuchProcess, ProcHandle, Stat

Vec = typing.Tuple[float, float, float, float]
ZERO: Vec = (0, 0, 0, 0)


def add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def sub_floor(a: Vec, b: Vec) -> Vec:
    return (max(0, a[0] - b[0]), max(0, a[1] - b[1]), max(0, a[2] - b[2]), max(0, a[3] - b[3]))


@dataclass(**SLOTS)
class Member:
    handle: ProcHandle
    ppid: int
    totals: Vec  # own + reaped-children figures, as last seen
    reaped: Vec  # the reaped-children part alone (where a reaped child's totals land)
    io: tuple[int, int] | None  # as last read
    fds: int | None
    activity: bytes | None  # scheduler counters when io and fds were read
    idle: bool  # did not run since the previous reading: io and fds carried over
    reaped_cpu: float  # its reaped children's CPU ticks (cutime + cstime)
    zombie: bool = False  # read after its exit, before its reaping: figures final


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
                io, fds = before.io, before.fds
            else:
                io, fds = handle.io(), handle.fd_count()
        except NoSuchProcess:
            if before is None and handle is not self._root:
                handle.close()  # opened this pass: no one else holds it
            return None
        if handle is self._root:
            self.io_visible = io is not None
        read, write = io if io is not None else (0, 0)
        reaped_cpu = stat.cutime + stat.cstime
        if self._own_cpu:  # every member counts its own time: reaped children count theirs
            reaped: Vec = (0, 0, read, write)
            totals: Vec = (stat.utime, stat.stime, read, write)
        elif self._children:
            reaped = (stat.cutime, stat.cstime, read, write)
            totals = (stat.utime + stat.cutime, stat.stime + stat.cstime, read, write)
        else:
            reaped = ZERO
            totals = (stat.utime, stat.stime, read, write)
        return Member(handle, stat.ppid, totals, reaped, io, fds, activity, idle, reaped_cpu)

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
            member.totals = (stat.utime, stat.stime, *member.totals[2:])
            member.reaped_cpu = stat.cutime + stat.cstime
            member.zombie = True
