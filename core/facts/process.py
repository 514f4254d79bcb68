"""Accounting for one target: the registered process and, by default, everything it
forked, until the last of them exits (who belongs: ``membership.py``).

Counters (CPU time, disk bytes) never go backwards although members come and go, and
each member's figures are counted once, whatever order exits and re-parentings come
in. Two rules, chosen per target:

- By owner (CPU time, where the daemon hears every fork and has the kernel's exit
  records): each member counts its own time, read live from /proc or, once it has
  exited, from its exit record (what it ran since the last pass included). Reaped
  children's counters only add what the records miss, each process's teardown
  (``teardowns.py``), so a zombie re-parented to a subreaper other than its parent's
  reaper cannot count twice.
- By reaper (CPU time otherwise; storage bytes always, since /proc/PID/io includes
  what reaped children did): a member's figures live in its own counters plus its
  reaped children's. When a member departs, its last figures (its exit record's where
  one came) are pending on the member that reaps it until that member's reaped-
  children counters show them, or carried when something outside the target reaps it
  (then, without a record, its last interval is lost: the total errs low, never high).

Most members of most trees wait (a launcher waiting on its child, idle workers). A
single-threaded member whose scheduler counters (/proc/PID/schedstat) have not moved
since the last reading has not run, so its storage bytes, descriptors and sockets are
as they were: they are carried over instead of read again (``TreeReading.idle_pids``
tells socket discovery). Its stat is still read each time in a tree of several: the
kernel can reclaim its pages, and its parent can change, without it running. A tree
that is its root alone and did not run gets its last reading back, re-dated, after
one read of its scheduler counters (``ProcessTree._quiet``; docs/performance.md says
what that leaves unread and why).

:class:`ProcessTree` is the wiring of one pass; each concern has a module of its own:
who is there and who departed (``tree_walk.py``), one member's counters by the rule
(``member_counters.py``), what departed members leave and the never-backwards total
(``departures.py``), CPU seconds as a utilization (``cpu_rate.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.channels import NO_COUNTS
from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.cpu_rate import CpuRate
from edgewatt.core.facts.departures import Departures, ExitFigures
from edgewatt.core.facts.held_fork import HeldFork
from edgewatt.core.facts.member_counters import Member, MemberReader, counters_of
from edgewatt.core.facts.membership import Lineage
from edgewatt.core.facts.procfs import CLOCK_TICKS, PAGE_SIZE, NoSuchProcess, ProcHandle, Stat
from edgewatt.core.facts.tree_walk import TreeWalk
from edgewatt.core.kernel.taskstats import TaskExits

# Every this many readings, idle members are read in full all the same: a safety net
# should a kernel show no scheduler activity for a thread that ran, and the bound on
# how old a waiting process's RSS may be (pages reclaimed without it running). 30, not
# 10: the re-reads were a fifth of a pass over 200 waiting targets (docs/changelog.md).
RECHECK_EVERY = 30


@dataclass(**SLOTS)  # not frozen: one per target per pass (see ProcessSample)
class TreeReading:
    time: float  # unix seconds when the target's own counters were read
    cpu_user_s: float
    cpu_system_s: float
    cpu_utilization: float | None
    rss_bytes: int
    vms_bytes: int
    read_bytes: int | None
    write_bytes: int | None
    threads: int
    open_fds: int | None
    pids: tuple[int, ...]  # the target and its live descendants
    # Members that did not run since the previous reading: their descriptors are as
    # they were then, so socket discovery may skip them.
    idle_pids: frozenset[int] = frozenset()
    # cpu_utilization by mode (user, system), adding up to it (cpu_shares).
    cpu_mode_utilization: tuple[float, float] | None = None
    # 1 once its first process, a fork held before its exec at the first reading
    # (`edgewatt run`'s), exec'd: memory read before was the registrant's (held_fork.py).
    root_execs: int = 0
    # Its channels' counts (core/channels.py), cumulative: each live member's own and
    # every departed member's whole count; an entry None: not on this platform (psutil).
    # None: not read (cgroups).
    counts: tuple[int | None, ...] | None = None

    @property
    def processes(self) -> int:
        return len(self.pids)


class ProcessTree:
    """Samples one target; :meth:`sample` raises NoSuchProcess once every member is gone
    (the figures at that end: :meth:`exit_figures`)."""

    def __init__(
        self,
        root: ProcHandle,
        *,
        children: bool,
        logical_cpus: int,
        proc: str = "/proc",
        lineage: Lineage | None = None,
        exits: TaskExits | None = None,
    ) -> None:
        self.root = root
        self.children = children
        self.proc = proc
        self.exits = exits
        # Who is in: the daemon's events-fed lineage, or one of the tree's own that
        # the parent links fill (see membership.py).
        self.lineage = lineage or Lineage({}, root.pid, events=False)
        # CPU time by owner: where every fork is heard and every exit has its record,
        # each member's own time, live or final, is counted once by construction, and
        # reaped-children counters are not needed (they double count when a zombie is
        # re-parented to a subreaper other than its parent's reaper). Else, and always
        # for storage bytes (which /proc shows only with reaped children's included),
        # by reaper: see departures.py.
        self.own_cpu = self.children and self.lineage.events and exits is not None
        self._reader = MemberReader(root, own_cpu=self.own_cpu, children=children)
        self._walk = TreeWalk(root, self.lineage, self._reader, children=children, proc=proc)
        self._departures = Departures(root.pid, exits, own_cpu=self.own_cpu)
        self._rate = CpuRate(logical_cpus)
        self._passes = 0
        self.lost_members = False  # in the last sample: its orphans may be re-parented
        self.last: TreeReading | None = None
        self._final: ExitFigures | None = None
        self._held = HeldFork(root.pid, proc)  # see TreeReading.root_execs
        self._alone = False  # the last full reading found the root alone

    @property
    def exact(self) -> bool:
        """Every departed member's last figures came from the kernel (none came and
        went unseen, none's record was missing)."""
        return self._walk.exact and self._departures.exact

    def sample(self, children_of: Callable[[int], list[int]]) -> TreeReading:
        # Rates divide by the time between two reads of the counters: stamp just before
        # the read. The thread holds the GIL until pread's syscall; after it, taking
        # the GIL back may wait a switch interval behind a busy thread.
        read_at, read_at_monotonic = time.time(), time.monotonic()
        self._passes += 1
        first = self._passes == 1
        recheck = self._passes % RECHECK_EVERY == 0
        if not first and not recheck:
            quiet = self._quiet(children_of, read_at, read_at_monotonic)
            if quiet is not None:
                return quiet
        walk = self._walk
        walked = walk.walk(children_of, first=first, recheck=recheck)
        if self.exits is not None and (walked.departed or walked.never_seen):
            self.exits.update()  # the records of exits since this pass drained them
        # Settled against the members as they were: the walk takes the new ones after.
        members = set(walked.live) | walked.unseen | self.lineage.pids
        self._departures.settle(walked, walk.members, walk.unseen, members, first=first)
        self.lost_members = bool(walked.departed)
        walk.done(walked)
        root = walked.live.get(self.root.pid)
        self._held.note(root[1] if root is not None else None)
        if not walked.live and not walked.unseen:
            alone = self.last is None or self.last.processes == 1
            self._final = self._departures.end(read_at, alone)
            raise NoSuchProcess(self.root.pid, "every member has exited")
        self._alone = len(walked.live) == 1 and self.root.pid in walked.live
        return self._reading(read_at, read_at_monotonic, walked.live)

    @property
    def root_execs(self) -> int:
        return self._held.execs

    def _quiet(
        self, children_of: Callable[[int], list[int]], read_at: float, read_at_monotonic: float
    ) -> TreeReading | None:
        """The last reading again, dated now, where the tree is its root alone and the
        root did not run since: the same scheduler counters of its only thread, so no
        CPU time, I/O, descriptor, socket, child or exit. One pread and no allocation,
        instead of a walk, the members' reads and the departures' bookkeeping. The stat
        file is not read: what can change there without the process running is its
        resident memory (pages reclaimed) and its parent (irrelevant to a root alone),
        and every RECHECK_EVERY-th pass reads it all the same (docs/changelog.md:
        the stat read was 25-30 % of a pass over 200 idle targets). None: a full
        reading is needed (also when anything is pending: a new or departed member,
        an exit record, lost events, a departed member's figures not yet shown)."""
        last, lineage, walk = self.last, self.lineage, self._walk
        if (
            last is None
            or not self._alone
            or lineage.exited
            or (lineage.events and lineage.lossy)
            or len(lineage.pids) != 1
            or walk.unseen
            or not self._departures.quiet
        ):
            return None
        member = walk.members.get(self.root.pid)
        if member is None or member.handle is not self.root or member.activity is None:
            return None
        try:
            if self.root.activity() != member.activity:
                return None
        except NoSuchProcess:
            return None  # the full reading finds it gone and says so
        if self.children and lineage.lossy and children_of(self.root.pid):
            return None
        by_mode = self._rate.update(read_at_monotonic, last.cpu_user_s, last.cpu_system_s)
        if by_mode != last.cpu_mode_utilization:  # the first quiet pass after a run
            last.cpu_mode_utilization = by_mode
            last.cpu_utilization = None if by_mode is None else by_mode[0] + by_mode[1]
        if not member.idle:
            member.idle = True
            last.idle_pids = frozenset(last.pids)
        last.time = read_at
        self.lost_members = False
        return last

    def _reading(
        self, read_at: float, read_at_monotonic: float, live: dict[int, tuple[Member, Stat]]
    ) -> TreeReading:
        user = system = read = write = rss = vms = threads = fds = 0
        fds_known = True
        counts: list[tuple[int, ...]] = []
        for member, stat in live.values():
            if member.counts is not None:
                counts.append(member.counts)
            totals = member.totals
            user += totals.user_ticks
            system += totals.system_ticks
            read += totals.read_bytes
            write += totals.write_bytes
            rss += stat.rss_pages
            vms += stat.vsize
            threads += stat.num_threads
            if member.fds is None:
                fds_known = False
            else:
                fds += member.fds
        value = self._departures.total(counters_of((user, system, read, write)))
        cpu_user = value.user_ticks / CLOCK_TICKS
        cpu_system = value.system_ticks / CLOCK_TICKS
        by_mode = self._rate.update(read_at_monotonic, cpu_user, cpu_system)
        io_visible = self._reader.io_visible
        self.last = TreeReading(
            time=read_at,
            cpu_user_s=cpu_user,
            cpu_system_s=cpu_system,
            cpu_utilization=None if by_mode is None else by_mode[0] + by_mode[1],
            cpu_mode_utilization=by_mode,
            rss_bytes=rss * PAGE_SIZE,
            vms_bytes=vms,
            read_bytes=value.read_bytes if io_visible else None,
            write_bytes=value.write_bytes if io_visible else None,
            threads=threads,
            open_fds=fds if fds_known else None,
            pids=tuple(live),
            idle_pids=frozenset(pid for pid, (m, _) in live.items() if m.idle),
            root_execs=self._held.execs,
            counts=self._departures.counts(_sum(counts)),
        )
        return self.last

    def exit_figures(self) -> ExitFigures | None:
        """The target's counters when its last member went, where every departed
        member's figures came from the kernel (its exit record, or a reaper in the
        target); None otherwise: its figures then end at the last pass."""
        return self._final if self.exact else None

    def close(self) -> None:
        self._walk.close()
        self.root.close()


def _sum(counts: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Each channel's count summed over the members (most targets: one)."""
    if len(counts) == 1:
        return counts[0]
    return tuple(map(sum, zip(*counts))) if counts else NO_COUNTS
