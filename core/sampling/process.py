"""Accounting for one target: the registered process and, by default, its descendants.

Counters (CPU time, disk bytes) must never go backwards although descendants come and
go. The kernel helps: when a process reaps a child, the child's CPU time moves into
the parent's cutime/cstime and its I/O into the parent's /proc/PID/io. So the sum over
the live tree of (own + reaped-children) figures is exact as long as every descendant
is reaped inside the tree (DataLoader workers, spawned ranks). A descendant reaped
elsewhere (re-parented to init after its parent died, or one that stops being a
descendant) takes its figures away from that sum; :meth:`ProcessTree.sample` carries
what it last saw of it, minus whatever re-appeared in its nearest live ancestor's
reaped-children figures, so the carried amount can only err low: the total never
exceeds the kernel's own count. Work done by a descendant in the last interval before
it exits unreaped-by-the-tree is lost (at most one interval of it).

Most members of most trees wait (a launcher waiting on its child, idle workers). A
single-threaded member whose scheduler counters (/proc/PID/schedstat) have not moved
since the last reading has not run, so its storage bytes, descriptors and sockets are
as they were: they are carried over instead of read again (``TreeReading.idle_pids``
tells socket discovery). Its stat is still read each time: the kernel can reclaim its
pages, and its parent can change, without it running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.sampling.procfs import CLOCK_TICKS, PAGE_SIZE, NoSuchProcess, ProcHandle, Stat
from edgewatt.core.sampling.taskstats import TaskExits

# Channels accounted as counters: user ticks, system ticks, read bytes, write bytes.
_Vec = tuple[int, int, int, int]
_ZERO: _Vec = (0, 0, 0, 0)
# Every this many readings, idle members are read in full all the same: a safety net
# should a kernel show no scheduler activity for a thread that ran.
RECHECK_EVERY = 10


@dataclass(slots=True)  # not frozen: one per target per pass (see ProcessSample)
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

    @property
    def processes(self) -> int:
        return len(self.pids)


@dataclass(frozen=True, slots=True)
class ExitFigures:
    """A target's counters at its exit, as the kernel counted them."""

    cpu_user_s: float
    cpu_system_s: float
    read_bytes: int
    write_bytes: int
    time: float  # unix seconds of the root's exit
    rss_peak_bytes: int | None  # the kernel's peak RSS, for a target of one process


@dataclass(slots=True)
class _Member:
    handle: ProcHandle
    ppid: int
    totals: _Vec  # own + reaped-children figures, as last seen
    reaped: _Vec  # the reaped-children part alone (where a reaped child's totals land)
    io: tuple[int, int] | None  # as last read
    fds: int | None
    activity: bytes | None  # scheduler counters when io and fds were read
    idle: bool  # did not run since the previous reading: io and fds carried over


def _add(a: _Vec, b: _Vec) -> _Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _sub_floor(a: _Vec, b: _Vec) -> _Vec:
    return (max(0, a[0] - b[0]), max(0, a[1] - b[1]), max(0, a[2] - b[2]), max(0, a[3] - b[3]))


class CpuRate:
    """CPU seconds over wall seconds between two reads, as a share of all logical CPUs."""

    def __init__(self, logical_cpus: int) -> None:
        self._cpus = max(logical_cpus, 1)
        self._last: tuple[float, float] | None = None  # (monotonic, cpu seconds)

    def update(self, now: float, cpu_seconds: float) -> float | None:
        last, self._last = self._last, (now, cpu_seconds)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (cpu_seconds - last[1]) / ((now - last[0]) * self._cpus))


class ProcessTree:
    """Samples one target; :meth:`sample` raises NoSuchProcess once the target is gone."""

    def __init__(
        self, root: ProcHandle, *, children: bool, logical_cpus: int, proc: str = "/proc"
    ) -> None:
        self.root = root
        self.children = children
        self.proc = proc
        self._rate = CpuRate(logical_cpus)
        self._members: dict[int, _Member] = {}
        self._carried: _Vec = _ZERO
        self._value: _Vec = _ZERO
        self._passes = 0
        self.io_visible = True
        self.lost_members = False  # in the last sample: its orphans may be re-parented
        # For exits between passes (exit_figures): the last reading, and the exit
        # records' update number at that time.
        self.last: TreeReading | None = None
        self.generation = 0

    def sample(self, children_of: Callable[[int], list[int]]) -> TreeReading:
        # Rates divide by the time between two reads of the counters: stamp just before
        # the read. The thread holds the GIL until pread's syscall; after it, taking
        # the GIL back may wait a switch interval behind a busy thread.
        read_at, read_at_monotonic = time.time(), time.monotonic()
        root = self.root
        root_stat = root.stat()  # raises NoSuchProcess: the target has exited
        self._passes += 1
        recheck = self._passes % RECHECK_EVERY == 0
        members = self._members
        root_children = children_of(root.pid) if self.children else []
        if not root_children and (not members or (len(members) == 1 and root.pid in members)):
            # Alone, as before: most targets, and every pass's bookkeeping of departed
            # members is moot. (_read_member raises NoSuchProcess for the root.)
            member = self._read_member(root, root_stat, recheck)
            assert member is not None
            self._members = {root.pid: member}
            self.lost_members = False
            return self._reading(read_at, read_at_monotonic, {root.pid: (member, root_stat)})

        live: dict[int, tuple[_Member, Stat]] = {}
        queue: list[tuple[ProcHandle, Stat]] = [(root, root_stat)]
        while queue:
            handle, stat = queue.pop()
            member = self._read_member(handle, stat, recheck)
            if member is None:
                continue  # a descendant that exited since its stat was read
            live[handle.pid] = (member, stat)
            if self.children:
                for pid in root_children if handle is root else children_of(handle.pid):
                    if pid not in live:
                        child = self._child_handle(pid, handle.pid)
                        if child is not None:
                            queue.append(child)

        departed = {
            pid: m
            for pid, m in members.items()
            if pid not in live or live[pid][0].handle is not m.handle
        }
        self.lost_members = bool(departed)
        self._carry_departed(departed, live)
        for member in departed.values():
            member.handle.close()
        self._members = {pid: m for pid, (m, _) in live.items()}
        return self._reading(read_at, read_at_monotonic, live)

    def _reading(
        self, read_at: float, read_at_monotonic: float, live: dict[int, tuple[_Member, Stat]]
    ) -> TreeReading:
        user = system = read = write = rss = vms = threads = fds = 0
        fds_known = True
        for member, stat in live.values():
            totals = member.totals
            user += totals[0]
            system += totals[1]
            read += totals[2]
            write += totals[3]
            rss += stat.rss_pages
            vms += stat.vsize
            threads += stat.num_threads
            if member.fds is None:
                fds_known = False
            else:
                fds += member.fds
        carried, value = self._carried, self._value
        self._value = value = (
            max(value[0], user + carried[0]),
            max(value[1], system + carried[1]),
            max(value[2], read + carried[2]),
            max(value[3], write + carried[3]),
        )
        cpu_user = value[0] / CLOCK_TICKS
        cpu_system = value[1] / CLOCK_TICKS
        self.last = TreeReading(
            time=read_at,
            cpu_user_s=cpu_user,
            cpu_system_s=cpu_system,
            cpu_utilization=self._rate.update(read_at_monotonic, cpu_user + cpu_system),
            rss_bytes=rss * PAGE_SIZE,
            vms_bytes=vms,
            read_bytes=value[2] if self.io_visible else None,
            write_bytes=value[3] if self.io_visible else None,
            threads=threads,
            open_fds=fds if fds_known else None,
            pids=tuple(live),
            idle_pids=frozenset(pid for pid, (m, _) in live.items() if m.idle),
        )
        return self.last

    def _read_member(self, handle: ProcHandle, stat: Stat, recheck: bool) -> _Member | None:
        """One member's figures; io and the descriptor count are carried over from the
        previous reading when its only thread has not run since (one read instead of
        three, and socket discovery skips it: most members of most trees wait)."""
        before = self._members.get(handle.pid)
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
            if handle is self.root:
                raise
            if before is None:
                handle.close()  # opened this pass: no one else holds it
            return None
        if handle is self.root:
            self.io_visible = io is not None
        read, write = io if io is not None else (0, 0)
        if self.children:
            reaped: _Vec = (stat.cutime, stat.cstime, read, write)
            totals: _Vec = (stat.utime + stat.cutime, stat.stime + stat.cstime, read, write)
        else:
            reaped = _ZERO
            totals = (stat.utime, stat.stime, read, write)
        return _Member(handle, stat.ppid, totals, reaped, io, fds, activity, idle)

    def _child_handle(self, pid: int, parent: int) -> tuple[ProcHandle, Stat] | None:
        known = self._members.get(pid)
        if known is not None:
            try:
                stat = known.handle.stat()
            except NoSuchProcess:
                pass  # the pid now names a new child: open it afresh below
            else:
                if stat.ppid == parent:
                    return known.handle, stat
        try:
            handle = ProcHandle(pid, self.proc)
            stat = handle.stat()
        except NoSuchProcess:
            return None
        if stat.ppid != parent:  # exited and reused between listing and opening
            handle.close()
            return None
        return handle, stat

    def _carry_departed(
        self, departed: dict[int, _Member], live: dict[int, tuple[_Member, Stat]]
    ) -> None:
        if not departed:
            return
        lost_by_ancestor: dict[int | None, _Vec] = {}
        for member in departed.values():
            ancestor = self._nearest_live_ancestor(member, departed, live)
            lost_by_ancestor[ancestor] = _add(lost_by_ancestor.get(ancestor, _ZERO), member.totals)
        carried = self._carried
        for ancestor, lost in lost_by_ancestor.items():
            if ancestor is not None:
                before = self._members[ancestor].reaped
                after = live[ancestor][0].reaped
                lost = _sub_floor(lost, _sub_floor(after, before))
            carried = _add(carried, lost)
        self._carried = carried

    def _nearest_live_ancestor(
        self,
        member: _Member,
        departed: dict[int, _Member],
        live: dict[int, tuple[_Member, Stat]],
    ) -> int | None:
        ppid = member.ppid
        for _ in range(len(departed) + 1):
            if ppid in live and ppid in self._members and ppid not in departed:
                return ppid
            if ppid not in departed:
                return None
            ppid = departed[ppid].ppid
        return None

    def exit_figures(self, exits: TaskExits) -> ExitFigures | None:
        """The target's counters at its root's exit, from the kernel's exit records, or
        None where they are not complete (see taskstats.py).

        Per member seen at the last pass: its own CPU from its records (what it ran
        since, included) plus what it had reaped by then (cutime); storage bytes, which
        /proc does not split into own and reaped, as the larger of the last reading and
        its records. Descendants born and gone since the last pass are found in the
        records by parent, and add their own. Members still alive (re-parented, or
        outliving the root) stay as last seen; departed ones as carried.
        """
        # Unix time of a start in ticks since boot, to 10 ms: through the boot clock,
        # not /proc/stat's btime (whole seconds).
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)

        def started(handle: ProcHandle) -> float:
            return boot + handle.start_ticks / CLOCK_TICKS

        root = exits.exited(self.root.pid, started(self.root))
        if root is None or not exits.complete(started(self.root)):
            return None
        carried = self._carried
        user, system = carried[0] / CLOCK_TICKS, carried[1] / CLOCK_TICKS
        read, write = carried[2], carried[3]
        known = set()
        for pid, m in self._members.items():
            known.add(pid)
            record = exits.exited(pid, started(m.handle))
            if record is None:  # still running: as last seen
                user += m.totals[0] / CLOCK_TICKS
                system += m.totals[1] / CLOCK_TICKS
                read, write = read + m.totals[2], write + m.totals[3]
                continue
            if not exits.complete(started(m.handle)):
                return None
            own_user = max(record.user_s, (m.totals[0] - m.reaped[0]) / CLOCK_TICKS)
            own_system = max(record.system_s, (m.totals[1] - m.reaped[1]) / CLOCK_TICKS)
            user += own_user + m.reaped[0] / CLOCK_TICKS
            system += own_system + m.reaped[1] / CLOCK_TICKS
            read += max(m.totals[2], record.read_bytes)
            write += max(m.totals[3], record.write_bytes)
        if self.children:
            # Born since the last pass, so after the listener if that pass was: their
            # whole life is in the records (their btime is too coarse to tell).
            young = self.last is not None and exits.complete(self.last.time)
            unseen = exits.exited_since(self.generation)
            grew = True
            while grew:  # parents exit after their children: close over the parent links
                grew = False
                for tgid, p in unseen.items():
                    if tgid not in known and p.ppid in known:
                        if not young:
                            return None
                        known.add(tgid)
                        user, system = user + p.user_s, system + p.system_s
                        read, write = read + p.read_bytes, write + p.write_bytes
                        grew = True
        return ExitFigures(
            cpu_user_s=user,
            cpu_system_s=system,
            read_bytes=read,
            write_bytes=write,
            time=started(self.root) + root.elapsed_s,
            rss_peak_bytes=root.hiwater_rss_bytes if len(known) == 1 else None,
        )

    def close(self) -> None:
        for member in self._members.values():
            if member.handle is not self.root:
                member.handle.close()
        self._members = {}
        self.root.close()
