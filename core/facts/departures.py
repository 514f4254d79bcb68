"""What departed members leave in their target's counters: each one's figures counted
once, whatever order exits and re-parentings come in (the two rules: ``process.py``).

A departed member's last figures (its exit record's where one came) are carried at
once (by owner: its CPU time; and whatever something outside the target reaps), or
pending on the member that reaps it until that member's reaped-children counters show
them (by reaper). Live members' counters plus these make the target's counters, which
never go backwards (the ratchet in :meth:`Departures.total`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from edgewatt.core.channels import NO_COUNTS
from edgewatt.core.compat import SLOTS, exit_code
from edgewatt.core.facts.member_counters import (
    ZERO,
    Counters,
    Member,
    add,
    counters_of,
    sub_floor,
)
from edgewatt.core.facts.procfs import CLOCK_TICKS, Stat
from edgewatt.core.facts.teardowns import Teardowns
from edgewatt.core.facts.tree_walk import Departed, Walked
from edgewatt.core.kernel.taskstats import ExitedProcess, TaskExits, unix_start


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
    # The largest peak RSS in its members' exit records (the root's included): the
    # largest process's, where no pass saw it at its peak.
    largest_peak_bytes: int | None = None
    counts: tuple[int, ...] = NO_COUNTS  # its channels' (core/channels.py), every member's


class Departures:
    """One target's departed members' figures, and the target's counters made of them
    and its live members'. ``own_cpu``: CPU time by owner (see process.py)."""

    def __init__(self, root_pid: int, exits: TaskExits | None, *, own_cpu: bool) -> None:
        self._root_pid = root_pid
        self._exits = exits
        self._own_cpu = own_cpu
        self._carried = ZERO  # figures of members reaped outside the target
        # Figures of departed members on their way into a live member's reaped-children
        # counters (a zombie waiting for its parent's wait(), or one already reaped):
        # counted here until that member's counters show them.
        self._pending: dict[int, Counters] = {}
        self._value = ZERO  # the target's counters as last reported: never less
        # Departed members' channel counts, carried at once, and the target's as last
        # reported: never less.
        self._counts = self._counts_value = NO_COUNTS
        # By owner, the exit records miss each member's teardown: the reapers' counters
        # of reaped children show it (teardowns.py).
        self._teardowns = Teardowns()
        self.exact = True  # every departed member's last figures came from the kernel
        self._ended_at = 0.0  # unix seconds of the last exit the records timed
        self._largest_peak: int | None = None  # the departed members' records' largest

    @property
    def quiet(self) -> bool:
        """Nothing is pending: a pass whose members did nothing changes nothing here
        (ProcessTree then skips the settling)."""
        return not self._pending and (not self._own_cpu or self._teardowns.quiet)

    def settle(
        self,
        walked: Walked,
        before: dict[int, Member],
        unseen_before: set[int],
        members: set[int],
        *,
        first: bool,
    ) -> None:
        """Count the pass's departed members (``walked``) against the members as they
        were (``before``, ``unseen_before``); ``members``: every pid still in."""
        if self._own_cpu:
            for pid, (member, _) in walked.live.items():
                self._teardowns.read(pid, member.reaped_cpu, existing=first)
            for pid, known, _ in walked.departed:
                if known is not None and known.zombie:
                    self._teardowns.read(pid, known.reaped_cpu, existing=False)
        departed = walked.never_seen + walked.departed
        self._settle(departed, walked.live, before, unseen_before, members)
        if self._own_cpu:
            self._teardowns.after_pass(set(walked.live), members)

    def _settle(
        self,
        departed: list[Departed],
        live: dict[int, tuple[Member, Stat]],
        before: dict[int, Member],
        unseen_before: set[int],
        members: set[int],
    ) -> None:
        """Count every departed member's figures exactly once: on their way into a live
        member that reaps it (pending until its counters show them), or carried when
        something outside the target reaps it."""
        pending = self._pending
        leaving = {pid for pid, _, _ in departed}
        for pid, known, reaper in departed:
            figures = self._final_figures(pid, known)
            if self._own_cpu:  # its own time is its own to the end: carried at once
                own = figures.cpu_ticks
                self._carried = add(
                    self._carried, Counters(figures.user_ticks, figures.system_ticks, 0, 0)
                )
                # A reaper still in though not read (gone before its first read, its
                # exit event to come) is inside: its reaper's counters show this
                # member within its own, so the member is expected of it.
                inside = reaper in live or reaper in leaving or reaper in members
                unseen = known is None and pid in unseen_before
                final = known is not None and known.zombie
                self._teardowns.depart(pid, own, reaper, inside, unseen, final)
                figures = Counters(0, 0, figures.read_bytes, figures.write_bytes)
            figures = add(figures, pending.pop(pid, ZERO))
            if reaper in live or reaper in leaving:
                pending[reaper] = add(pending.get(reaper, ZERO), figures)
            else:
                self._carried = add(self._carried, figures)
        for pid in list(pending):
            entry = live.get(pid)
            if entry is None:  # its reaper left too, outside the target
                self._carried = add(self._carried, pending.pop(pid))
                continue
            was = before.get(pid)
            if was is not None and was.handle is entry[0].handle:
                # What the member reaped since its last reading cancels what was pending.
                grown = sub_floor(entry[0].reaped, was.reaped)
                left = sub_floor(pending[pid], grown)
                # /proc truncates to ticks what the exit records give in us: less than
                # a tick left of each is that rounding, not a member still to come.
                rounding = (
                    grown != ZERO
                    and left.user_ticks < 1
                    and left.system_ticks < 1
                    and left.read_bytes == left.write_bytes == 0
                )
                if left == ZERO or rounding:
                    del pending[pid]
                else:
                    pending[pid] = left

    def _final_figures(self, pid: int, known: Member | None) -> Counters:
        """A departed member's figures at its exit: its own CPU from the kernel's exit
        record where one came (what it ran since the last pass, included), else as
        last read (then the target is no longer exact)."""
        record = None
        if self._exits is not None and known is None:
            record = self._exits.exited_pid(pid)  # the events say it was just now
        elif self._exits is not None and known is not None:
            start = unix_start(known.handle.start_ticks)
            if self._exits.complete(start):
                record = self._exits.exited(pid, start)
        self._carry_counts(record, known)
        if record is None:
            if known is None:
                # By reaper, its parent in the target counts it when it reaps it. By owner
                # (exit records present), its time was in its record alone: lost.
                if self._own_cpu:
                    self.exact = False
                return ZERO
            self.exact = False
            return known.totals
        self._largest_peak = max(self._largest_peak or 0, record.hiwater_rss_bytes)
        # In ticks as /proc counts, unrounded: a short process ran for less than one.
        user, system = record.user_s * CLOCK_TICKS, record.system_s * CLOCK_TICKS
        if known is None:
            return Counters(user, system, record.read_bytes, record.write_bytes)
        started = unix_start(known.handle.start_ticks)
        self._ended_at = max(self._ended_at, started + record.elapsed_s)
        totals, reaped = known.totals, known.reaped
        # The larger of the two CPU times, whole: the record and /proc split the same
        # runtime between user and system differently, so a maximum per mode over-counts.
        final = Counters(
            user + reaped.user_ticks,
            system + reaped.system_ticks,
            max(totals.read_bytes, record.read_bytes),
            max(totals.write_bytes, record.write_bytes),
        )
        if final.cpu_ticks >= totals.cpu_ticks:
            return final
        return Counters(totals.user_ticks, totals.system_ticks, final.read_bytes, final.write_bytes)

    def _carry_counts(self, record: ExitedProcess | None, known: Member | None) -> None:
        """A departed member's channel counts, carried: its exit record's (every
        thread's, to its exit), else as last read."""
        last = NO_COUNTS if known is None or known.counts is None else known.counts
        if record is not None:
            last = tuple(map(max, last, record.counts))
        if last != NO_COUNTS:
            self._counts = tuple(map(operator.add, self._counts, last))

    def counts(self, live: tuple[int, ...]) -> tuple[int, ...]:
        """The target's channel counts: its ``live`` members' and the departed ones',
        never backwards."""
        carried, value = self._counts, self._counts_value
        # Most targets have no departed member: nothing to add.
        now = live if carried is NO_COUNTS else tuple(map(operator.add, live, carried))
        if now != value:
            now = tuple(map(max, value, now))
            if now != value:
                self._counts_value = now
        return self._counts_value

    def total(self, live: Counters) -> Counters:
        """The target's counters: what its ``live`` members show, plus what departed
        members left, carried or pending (counted until their reaper shows them).
        Never backwards; CPU time as a whole (user and system are split differently
        by /proc and the exit records: a maximum per mode would add the larger of
        each)."""
        carried, value = self._with_teardowns(self._carried), self._value
        for figures in self._pending.values():
            carried = add(carried, figures)
        user = live.user_ticks + carried.user_ticks
        system = live.system_ticks + carried.system_ticks
        if user + system < value.user_ticks + value.system_ticks:
            user, system = value.user_ticks, value.system_ticks
        now = (
            user,
            system,
            max(value.read_bytes, live.read_bytes + carried.read_bytes),
            max(value.write_bytes, live.write_bytes + carried.write_bytes),
        )
        if now != value:  # else kept: a comparison costs less than a new Counters
            self._value = counters_of(now)
        return self._value

    def end(self, read_at: float, alone: bool) -> ExitFigures:
        """The counters once no member is live: ``alone``, the target was one process
        at its last reading (the kernel's peak RSS is then its own)."""
        # Nothing is live or pending any more: what was carried is the whole figure.
        v, c = self._value, self._with_teardowns(self._carried)
        cpu = c if c.cpu_ticks >= v.cpu_ticks else v
        record = self._exits.exited_pid(self._root_pid) if self._exits is not None else None
        largest = self._largest_peak
        if record is not None:
            largest = max(largest or 0, record.hiwater_rss_bytes)
        return ExitFigures(
            cpu_user_s=cpu.user_ticks / CLOCK_TICKS,
            cpu_system_s=cpu.system_ticks / CLOCK_TICKS,
            read_bytes=max(v.read_bytes, c.read_bytes),
            write_bytes=max(v.write_bytes, c.write_bytes),
            time=self._ended_at or read_at,
            rss_peak_bytes=record.hiwater_rss_bytes if record is not None and alone else None,
            largest_peak_bytes=largest,
            teardowns_counted=not self._own_cpu or self._teardowns.complete,
            exit_status=None
            if record is None or record.exit_status is None
            else exit_code(record.exit_status),
            counts=self.counts(NO_COUNTS),
        )

    def _with_teardowns(self, carried: Counters) -> Counters:
        """``carried`` with what the exit records missed (by owner): teardowns are the
        kernel's work (exit_mm), counted as system time."""
        missed = self._teardowns.missed() if self._own_cpu else 0.0
        if not missed:
            return carried
        return Counters(
            carried.user_ticks,
            carried.system_ticks + missed,
            carried.read_bytes,
            carried.write_bytes,
        )
