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
tells socket discovery). Its stat is still read each time: the kernel can reclaim its
pages, and its parent can change, without it running.
"""

from __future__ import annotations

import time
import typing  # runtime aliases: Python 3.8's builtins take no [...]
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS, exit_code
from edgewatt.core.sampling.membership import Lineage
from edgewatt.core.sampling.procfs import CLOCK_TICKS, PAGE_SIZE, NoSuchProcess, ProcHandle, Stat
from edgewatt.core.sampling.taskstats import TaskExits
from edgewatt.core.sampling.teardowns import Teardowns

# Channels accounted as counters: user ticks, system ticks, read bytes, write bytes.
_Vec = typing.Tuple[float, float, float, float]  # ticks may be fractional: exit records are in us
_ZERO: _Vec = (0, 0, 0, 0)
# Departed members remembered, so that a zombie already counted is not let back in
# by a walk of the parent links (bounded: a target may fork millions over its life).
MAX_DEPARTED = 4096
# Every this many readings, idle members are read in full all the same: a safety net
# should a kernel show no scheduler activity for a thread that ran.
RECHECK_EVERY = 10


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

    @property
    def processes(self) -> int:
        return len(self.pids)


@dataclass(frozen=True, **SLOTS)
class ExitFigures:
    """A target's counters at its exit, as the kernel counted them."""

    cpu_user_s: float
    cpu_system_s: float
    read_bytes: int
    write_bytes: int
    time: float  # unix seconds of the root's exit
    rss_peak_bytes: int | None  # the kernel's peak RSS, for a target of one process
    # Every member's teardown counted (teardowns.py): False where a member reaped
    # outside the target had reaped children after its last reading.
    teardowns_counted: bool = True
    # The root's exit code, or -N for signal N (its exit record's; None: none came).
    exit_status: int | None = None


@dataclass(**SLOTS)
class _Member:
    handle: ProcHandle
    ppid: int
    totals: _Vec  # own + reaped-children figures, as last seen
    reaped: _Vec  # the reaped-children part alone (where a reaped child's totals land)
    io: tuple[int, int] | None  # as last read
    fds: int | None
    activity: bytes | None  # scheduler counters when io and fds were read
    idle: bool  # did not run since the previous reading: io and fds carried over
    reaped_cpu: float  # its reaped children's CPU ticks (cutime + cstime)
    zombie: bool = False  # read after its exit, before its reaping: figures final


def _add(a: _Vec, b: _Vec) -> _Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _sub_floor(a: _Vec, b: _Vec) -> _Vec:
    return (max(0, a[0] - b[0]), max(0, a[1] - b[1]), max(0, a[2] - b[2]), max(0, a[3] - b[3]))


def cpu_shares(
    used: tuple[float, float], elapsed_s: float, logical_cpus: int
) -> tuple[float, float]:
    """CPU seconds ``used`` (user, system) over ``elapsed_s`` wall seconds as shares of
    all logical CPUs, by mode. The modes add up to the share of both together: a tree
    whose user/system split moved (/proc and the exit records split differently) may
    show one mode going back, so the whole is split in proportion to the modes that
    grew, and nothing is negative."""
    total = max(0.0, used[0] + used[1]) / (elapsed_s * max(logical_cpus, 1))
    user, system = max(0.0, used[0]), max(0.0, used[1])
    if user + system == 0:
        return (0.0, 0.0)
    return (total * user / (user + system), total * system / (user + system))


class CpuRate:
    """CPU seconds over wall seconds between two reads, as a share of all logical CPUs,
    by mode (user, system)."""

    def __init__(self, logical_cpus: int) -> None:
        self._cpus = logical_cpus
        self._last: tuple[float, float, float] | None = None  # (monotonic, user s, system s)

    def update(self, now: float, user_s: float, system_s: float) -> tuple[float, float] | None:
        last, self._last = self._last, (now, user_s, system_s)
        if last is None or now <= last[0]:
            return None
        return cpu_shares((user_s - last[1], system_s - last[2]), now - last[0], self._cpus)


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
        self._rate = CpuRate(logical_cpus)
        self._members: dict[int, _Member] = {}
        self._carried: _Vec = _ZERO  # figures of members reaped outside the target
        # Figures of departed members on their way into a live member's reaped-children
        # counters (a zombie waiting for its parent's wait(), or one already reaped):
        # counted here until that member's counters show them.
        self._pending: dict[int, _Vec] = {}
        self._departed: dict[int, int] = {}  # pid -> start ticks: never let back in
        self._unseen: set[int] = set()  # members gone from /proc before their first read
        self._value: _Vec = _ZERO
        self._passes = 0
        self.io_visible = True
        self.lost_members = False  # in the last sample: its orphans may be re-parented
        self.exact = True  # every departed member's last figures came from the kernel
        # CPU time by owner: where every fork is heard and every exit has its record,
        # each member's own time, live or final, is counted once by construction, and
        # reaped-children counters are not needed (they double count when a zombie is
        # re-parented to a subreaper other than its parent's reaper). Else, and always
        # for storage bytes (which /proc shows only with reaped children's included),
        # by reaper: see _settle.
        self.own_cpu = self.children and self.lineage.events and exits is not None
        # By owner, the exit records miss each member's teardown: the reapers' counters
        # of reaped children show it (teardowns.py).
        self._teardowns = Teardowns()
        self.last: TreeReading | None = None
        self._final: ExitFigures | None = None
        self._ended_at = 0.0  # unix seconds of the last exit the records timed

    def sample(self, children_of: Callable[[int], list[int]]) -> TreeReading:
        # Rates divide by the time between two reads of the counters: stamp just before
        # the read. The thread holds the GIL until pread's syscall; after it, taking
        # the GIL back may wait a switch interval behind a busy thread.
        read_at, read_at_monotonic = time.time(), time.monotonic()
        self._passes += 1
        recheck = self._passes % RECHECK_EVERY == 0
        lineage = self.lineage
        exited = lineage.take_exited()
        if lineage.events and lineage.lossy and self._passes > 1:
            self.exact = False  # events were lost: a member may have come and gone unseen
        # Parent links: on the first pass, and where events are absent or were lost.
        walk = self.children and (lineage.lossy or self._passes == 1)
        # With the events whole since the last pass, only its exit event takes a member
        # out. One forked before this pass drained the events, then exited and reaped
        # before its first read, has its exit event in the next drain: it stays in,
        # unread, until that event brings the kernel's exit record.
        whole = lineage.events and not lineage.lossy and self._passes > 1
        unseen: set[int] = set()
        live: dict[int, tuple[_Member, Stat]] = {}
        departed: list[tuple[int, _Member | None, int]] = []  # (pid, last figures, reaper)
        # Parents before children: a zombie reaped between the two reads is then in
        # neither (the ratchet below keeps the total), never in both.
        queue = sorted(lineage.pids, key=self._depth, reverse=True)
        while queue:
            pid = queue.pop()
            if pid in live:
                continue
            known = self._members.get(pid)
            opened = self._open(pid, known)
            member = None if opened is None else self._read_member(*opened, recheck)
            if opened is None or member is None:  # gone, or never a member after all
                if known is None and whole and pid not in self._unseen:
                    unseen.add(pid)  # exited and reaped unread: its exit event is coming
                    continue
                if known is None and pid in self._unseen:
                    self.exact = False  # no exit event came for it: its figures are lost
                lineage.discard(pid)
                if known is not None:
                    departed.append((pid, known, exited.pop(pid, known.ppid)))
                continue
            live[pid] = (member, opened[1])
            if walk:
                for child in children_of(pid):
                    if child not in lineage.pids and child not in self._departed | exited.keys():
                        lineage.add(child, pid)
                        queue.append(child)
        # Members the events say exited, that this pass did not read.
        gone = {pid for pid, _, _ in departed}
        for pid, known in self._members.items():
            if pid not in live and pid not in gone:
                self._read_zombie(known)
                departed.append((pid, known, exited.pop(pid, known.ppid)))
        # Born and gone between two passes: only the events knew them.
        never_seen = [(pid, None, parent) for pid, parent in exited.items()]
        if self.exits is not None and (departed or never_seen):
            self.exits.update()  # the records of exits since this pass drained them
        if self.own_cpu:
            for pid, (member, _) in live.items():
                self._teardowns.read(pid, member.reaped_cpu, existing=self._passes == 1)
            for pid, known, _ in departed:
                if known is not None and known.zombie:
                    self._teardowns.read(pid, known.reaped_cpu, existing=False)
        self._settle(never_seen + sorted(departed, key=lambda d: -self._depth(d[0])), live)
        if self.own_cpu:
            self._teardowns.after_pass(set(live), set(live) | unseen | lineage.pids)
        self.lost_members = bool(departed)
        for pid, known, _ in departed:
            assert known is not None
            self._departed[pid] = known.handle.start_ticks
            if len(self._departed) > MAX_DEPARTED:  # the oldest are long reaped
                del self._departed[next(iter(self._departed))]
            if known.handle is not self.root:
                known.handle.close()
        self._members = {pid: m for pid, (m, _) in live.items()}
        self._unseen = unseen
        if not live and not unseen:
            self._final = self._end(read_at)
            raise NoSuchProcess(self.root.pid, "every member has exited")
        return self._reading(read_at, read_at_monotonic, live)

    def _depth(self, pid: int) -> int:
        """How far a member is from the target's root by the last known parent links,
        read or, for one not read yet, from its fork (0 for the root and for members
        re-parented outside the target)."""
        depth = 0
        members, parents = self._members, self.lineage.parents
        while depth <= len(members) + len(parents):
            member = members.get(pid)
            pid = member.ppid if member is not None else parents.get(pid, 0)
            if pid not in members and pid not in parents:
                return depth
            depth += 1
        return depth

    def _open(self, pid: int, known: _Member | None) -> tuple[ProcHandle, Stat] | None:
        """The member's handle and a fresh stat, or None when it is gone."""
        if known is not None:
            try:
                return known.handle, known.handle.stat()
            except NoSuchProcess:
                return None
        if pid == self.root.pid and not self._members and pid not in self._departed:
            handle = self.root
        else:
            try:
                handle = ProcHandle(pid, self.proc)
            except NoSuchProcess:
                return None
            if self._departed.get(pid) == handle.start_ticks:
                handle.close()  # a zombie already counted as departed
                return None
        try:
            return handle, handle.stat()
        except NoSuchProcess:
            if handle is not self.root:
                handle.close()
            return None

    def _read_zombie(self, member: _Member) -> None:
        """A member the events say exited, read once more if it is not reaped yet (by
        owner): a zombie's counters are final, its own teardown included and every child
        it reaped (``edgewatt run`` holds its command so until a pass has read it)."""
        if not self.own_cpu:
            return
        try:
            stat = member.handle.stat()
        except NoSuchProcess:
            return
        if stat.state == "Z":
            member.totals = (stat.utime, stat.stime, *member.totals[2:])
            member.reaped_cpu = stat.cutime + stat.cstime
            member.zombie = True

    def _settle(
        self,
        departed: list[tuple[int, _Member | None, int]],
        live: dict[int, tuple[_Member, Stat]],
    ) -> None:
        """Count every departed member's figures exactly once: on their way into a live
        member that reaps it (pending until its counters show them), or carried when
        something outside the target reaps it."""
        pending = self._pending
        leaving = {pid for pid, _, _ in departed}
        for pid, known, reaper in departed:
            figures = self._final_figures(pid, known)
            if self.own_cpu:  # its own time is its own to the end: carried at once
                self._carried = _add(self._carried, (figures[0], figures[1], 0, 0))
                inside = reaper in live or reaper in leaving
                unseen = known is None and pid in self._unseen
                final = known is not None and known.zombie
                own = figures[0] + figures[1]
                self._teardowns.depart(pid, own, reaper, inside, unseen, final)
                figures = (0, 0, figures[2], figures[3])
            figures = _add(figures, pending.pop(pid, _ZERO))
            if reaper in live or reaper in leaving:
                pending[reaper] = _add(pending.get(reaper, _ZERO), figures)
            else:
                self._carried = _add(self._carried, figures)
        for pid in list(pending):
            entry = live.get(pid)
            if entry is None:  # its reaper left too, outside the target
                self._carried = _add(self._carried, pending.pop(pid))
                continue
            before = self._members.get(pid)
            if before is not None and before.handle is entry[0].handle:
                # What the member reaped since its last reading cancels what was pending.
                grown = _sub_floor(entry[0].reaped, before.reaped)
                left = _sub_floor(pending[pid], grown)
                # /proc truncates to ticks what the exit records give in us: less than
                # a tick left of each is that rounding, not a member still to come.
                rounding = grown != _ZERO and left[0] < 1 and left[1] < 1 and left[2:] == (0, 0)
                if left == _ZERO or rounding:
                    del pending[pid]
                else:
                    pending[pid] = left

    def _final_figures(self, pid: int, known: _Member | None) -> _Vec:
        """A departed member's figures at its exit: its own CPU from the kernel's exit
        record where one came (what it ran since the last pass, included), else as
        last read (then the target is no longer exact)."""
        record = None
        if self.exits is not None and known is None:
            record = self.exits.exited_pid(pid)  # the events say it was just now
        elif self.exits is not None and known is not None:
            start = _unix_start(known.handle)
            if self.exits.complete(start):
                record = self.exits.exited(pid, start)
        if record is None:
            if known is None:
                # By reaper, its parent in the target counts it when it reaps it. By owner
                # (exit records present), its time was in its record alone: lost.
                if self.own_cpu:
                    self.exact = False
                return _ZERO
            self.exact = False
            return known.totals
        # In ticks as /proc counts, unrounded: a short process ran for less than one.
        own = (record.user_s * CLOCK_TICKS, record.system_s * CLOCK_TICKS)
        if known is None:
            return (own[0], own[1], record.read_bytes, record.write_bytes)
        self._ended_at = max(self._ended_at, _unix_start(known.handle) + record.elapsed_s)
        totals, reaped = known.totals, known.reaped
        # The larger of the two CPU times, whole: the record and /proc split the same
        # runtime between user and system differently, so a maximum per mode over-counts.
        final = (own[0] + reaped[0], own[1] + reaped[1])
        cpu = final if sum(final) >= totals[0] + totals[1] else totals[:2]
        return (
            cpu[0],
            cpu[1],
            max(totals[2], record.read_bytes),
            max(totals[3], record.write_bytes),
        )

    def _end(self, read_at: float) -> ExitFigures:
        # Nothing is live or pending any more: what was carried is the whole figure.
        v, c = self._value, self._with_teardowns(self._carried)
        cpu = c[:2] if c[0] + c[1] >= v[0] + v[1] else v[:2]
        value = (cpu[0], cpu[1], max(v[2], c[2]), max(v[3], c[3]))
        record = self.exits.exited_pid(self.root.pid) if self.exits is not None else None
        # One process in its last reading (not none: members reaped unread came after it)
        alone = self.last is None or self.last.processes == 1
        return ExitFigures(
            cpu_user_s=value[0] / CLOCK_TICKS,
            cpu_system_s=value[1] / CLOCK_TICKS,
            read_bytes=value[2],
            write_bytes=value[3],
            time=self._ended_at or read_at,
            rss_peak_bytes=record.hiwater_rss_bytes if record is not None and alone else None,
            teardowns_counted=not self.own_cpu or self._teardowns.complete,
            exit_status=None
            if record is None or record.exit_status is None
            else exit_code(record.exit_status),
        )

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
        carried, value = self._with_teardowns(self._carried), self._value
        for figures in self._pending.values():  # counted until their reaper shows them
            carried = _add(carried, figures)
        # Never backwards; CPU time as a whole (user and system are split differently by
        # /proc and the exit records: a maximum per mode would add the larger of each).
        user, system = user + carried[0], system + carried[1]
        if user + system < value[0] + value[1]:
            user, system = value[0], value[1]
        self._value = value = (
            user,
            system,
            max(value[2], read + carried[2]),
            max(value[3], write + carried[3]),
        )
        cpu_user = value[0] / CLOCK_TICKS
        cpu_system = value[1] / CLOCK_TICKS
        by_mode = self._rate.update(read_at_monotonic, cpu_user, cpu_system)
        self.last = TreeReading(
            time=read_at,
            cpu_user_s=cpu_user,
            cpu_system_s=cpu_system,
            cpu_utilization=None if by_mode is None else by_mode[0] + by_mode[1],
            cpu_mode_utilization=by_mode,
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
            if before is None and handle is not self.root:
                handle.close()  # opened this pass: no one else holds it
            return None
        if handle is self.root:
            self.io_visible = io is not None
        read, write = io if io is not None else (0, 0)
        reaped_cpu = stat.cutime + stat.cstime
        if self.own_cpu:  # every member counts its own time: reaped children count theirs
            reaped: _Vec = (0, 0, read, write)
            totals: _Vec = (stat.utime, stat.stime, read, write)
        elif self.children:
            reaped = (stat.cutime, stat.cstime, read, write)
            totals = (stat.utime + stat.cutime, stat.stime + stat.cstime, read, write)
        else:
            reaped = _ZERO
            totals = (stat.utime, stat.stime, read, write)
        return _Member(handle, stat.ppid, totals, reaped, io, fds, activity, idle, reaped_cpu)

    def _with_teardowns(self, carried: _Vec) -> _Vec:
        """``carried`` with what the exit records missed (by owner): teardowns are the
        kernel's work (exit_mm), counted as system time."""
        missed = self._teardowns.missed() if self.own_cpu else 0.0
        return (carried[0], carried[1] + missed, carried[2], carried[3])

    def exit_figures(self) -> ExitFigures | None:
        """The target's counters when its last member went, where every departed
        member's figures came from the kernel (its exit record, or a reaper in the
        target); None otherwise: its figures then end at the last pass."""
        return self._final if self.exact else None

    def close(self) -> None:
        for member in self._members.values():
            if member.handle is not self.root:
                member.handle.close()
        self._members = {}
        self.root.close()


def _unix_start(handle: ProcHandle) -> float:
    """Unix time of a process's start, to 10 ms, through the boot clock (not /proc/stat's
    whole-second btime)."""
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + handle.start_ticks / CLOCK_TICKS
