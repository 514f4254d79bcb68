"""Exit accounting, unit by unit: what a departed member leaves in its target's counters,
each mode and channel checked on its own with exact figures (an end-to-end exit test
checks CPU as the sum the kernel counted; a swap of user and system keeps that sum).

Members are laid out as a pass reads them: ticks (``CLOCK_TICKS`` a second) and bytes;
the exit records come through the real TaskExits from a stand-in socket.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from edgewatt.core.channels import NO_COUNTS
from edgewatt.core.facts.departures import Departures, ExitFigures
from edgewatt.core.facts.member_counters import ZERO, Counters, Member, add
from edgewatt.core.facts.procfs import CLOCK_TICKS, Stat
from edgewatt.core.facts.tree_walk import Departed, Walked
from edgewatt.core.kernel.taskstats import TICK_S, TaskExit, TaskExits, unix_start
from tests.channel_counts import switches

ROOT, CHILD, GRANDCHILD, OUTSIDE = 1000, 1001, 1002, 1  # OUTSIDE: not in the target
# Now, in /proc's start ticks: the members started after the exit listener.
START_TICKS = int(time.clock_gettime(time.CLOCK_BOOTTIME) / TICK_S)
READ_AT = time.time() + 100  # the exit pass's reading: later than any exit recorded


class Handle:
    """What Departures asks of a member's ProcHandle: its start, and its identity."""

    start_ticks = START_TICKS


class Records:
    """The taskstats socket, replayed: the records handed to the next drain."""

    registered_at = time.time() - 60

    def __init__(self) -> None:
        self.queued: list[TaskExit] = []

    def drain(self) -> tuple[list[TaskExit], bool]:
        records, self.queued = self.queued, []
        return records, False

    def close(self) -> None:
        pass


class Target:
    """One Departures and its passes: each pass's live members and departures."""

    def __init__(self, *, own_cpu: bool, records: bool = True) -> None:
        self.own_cpu = own_cpu
        self.records = Records()
        self.exits = TaskExits(self.records, keep_s=60) if records else None  # type: ignore[arg-type]
        self.departures = Departures(ROOT, self.exits, own_cpu=own_cpu)
        self.handles = {ROOT: Handle(), CHILD: Handle(), GRANDCHILD: Handle()}
        self.members: dict[int, Member] = {}
        self.unseen: set[int] = set()
        self.passes = 0

    def member(
        self,
        pid: int,
        ppid: int,
        own: tuple[float, float, int, int],
        reaped: tuple[float, float, int, int] = ZERO,
        *,
        zombie: bool = False,
    ) -> Member:
        """A member as MemberReader reads it: ``own`` (utime, stime, read, write: io
        counts reaped children's bytes too) and ``reaped`` (cutime, cstime, ...)."""
        user, system, read, write = own
        if self.own_cpu:
            totals, kept = Counters(user, system, read, write), Counters(0, 0, read, write)
        else:
            reaped_user, reaped_system, _, _ = reaped
            totals = Counters(user + reaped_user, system + reaped_system, read, write)
            kept = Counters(reaped_user, reaped_system, read, write)
        member = Member(
            self.handles[pid], ppid, totals, kept, (read, write), 3, None, False, 0, zombie
        )
        member.reaped_cpu = reaped[0] + reaped[1]
        return member

    def exit(
        self,
        pid: int,
        ppid: int,
        user_us: int,
        system_us: int,
        read: int,
        write: int,
        status: int = 0,
    ) -> None:
        """The kernel's exit record of ``pid`` (one thread, 2 s old, wait status
        ``status``), drained at the next pass."""
        start = unix_start(START_TICKS)
        record = (user_us, system_us, read, write, 1 << 20, status)
        self.records.queued.append(TaskExit(pid, pid, ppid, start, 2_000_000, *record))

    def sample(
        self,
        live: list[Member],
        departed: list[Departed] | None = None,
        never_seen: list[Departed] | None = None,
        unseen: set[int] | None = None,
    ) -> Counters:
        """One pass: ``live`` members read, ``departed`` gone since (``never_seen``:
        born and gone between two passes; ``unseen``: gone before this pass could read
        them, their exit events to come); the target's counters."""
        self._settle(live, departed, never_seen, unseen or set())
        total = ZERO
        for m in live:
            total = add(total, m.totals)
        return self.departures.total(total)

    def end(self, departed: list[Departed], *, alone: bool) -> ExitFigures:
        """The pass that finds no member live, as ProcessTree runs it: settled, then
        ended (no total in between)."""
        self._settle([], departed, None, set())
        return self.departures.end(read_at=READ_AT, alone=alone)

    def _settle(
        self,
        live: list[Member],
        departed: list[Departed] | None,
        never_seen: list[Departed] | None,
        unseen: set[int],
    ) -> None:
        if self.exits is not None:
            self.exits.update()
        stat = Stat("x", "S", 0, 0, 0, 0, 0, 1, START_TICKS, 0, 0, 0)
        now = {self._pid(m): (m, stat) for m in live}
        walked = Walked(now, departed or [], never_seen or [], unseen)
        before, first = self.members, self.passes == 0
        # As ProcessTree: the unseen of the pass before; every member still in.
        self.departures.settle(walked, before, self.unseen, set(now) | unseen, first=first)
        self.members, self.unseen = {pid: m for pid, (m, _) in now.items()}, unseen
        self.passes += 1

    def _pid(self, member: Member) -> int:
        return next(pid for pid, h in self.handles.items() if h is member.handle)


@pytest.mark.parametrize("own_cpu", [False, True], ids=["by-reaper", "by-owner"])
def test_a_lone_target_exits_with_user_system_and_read_bytes_each_its_records(
    own_cpu: bool,
) -> None:
    """Since its last pass the root ran 75 ticks of user time and 5 of system time,
    read 6,000 bytes and wrote 3,000: each figure at exit is the record's own, and the
    exit is dated by the record (its start plus its 2 s of life), with its status."""
    t = Target(own_cpu=own_cpu)
    last = t.member(ROOT, OUTSIDE, (100, 20, 2_000, 9_000))
    assert t.sample([last]) == (100, 20, 2_000, 9_000)
    t.exit(ROOT, OUTSIDE, user_us=1_750_000, system_us=250_000, read=8_000, write=12_000)
    end = t.end([(ROOT, last, OUTSIDE)], alone=True)
    assert (end.cpu_user_s, end.cpu_system_s) == (175 / CLOCK_TICKS, 25 / CLOCK_TICKS)
    assert (end.read_bytes, end.write_bytes) == (8_000, 12_000)
    assert end.time == pytest.approx(unix_start(START_TICKS) + 2.0, abs=0.01)
    assert (end.rss_peak_bytes, end.exit_status, end.teardowns_counted) == (1 << 20, 0, True)
    assert t.departures.exact


@pytest.mark.parametrize(("status", "code"), [(3 << 8, 3), (9, -9)])
def test_the_exit_status_is_the_records(status: int, code: int) -> None:
    t = Target(own_cpu=False)
    last = t.member(ROOT, OUTSIDE, (100, 20, 0, 0))
    t.sample([last])
    t.exit(ROOT, OUTSIDE, user_us=1_000_000, system_us=200_000, read=0, write=0, status=status)
    assert t.end([(ROOT, last, OUTSIDE)], alone=True).exit_status == code


def test_without_records_the_last_reading_stands_and_the_target_is_not_exact() -> None:
    t = Target(own_cpu=False, records=False)
    last = t.member(ROOT, OUTSIDE, (100, 20, 2_000, 3_000))
    t.sample([last])
    end = t.end([(ROOT, last, OUTSIDE)], alone=True)
    assert (end.cpu_user_s, end.cpu_system_s) == (100 / CLOCK_TICKS, 20 / CLOCK_TICKS)
    assert (end.read_bytes, end.write_bytes) == (2_000, 3_000)
    assert (end.time, end.rss_peak_bytes, end.exit_status) == (READ_AT, None, None)
    assert t.departures.exact is False


def test_without_records_a_child_never_read_is_its_reapers_to_count() -> None:
    t = Target(own_cpu=False, records=False)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    assert t.sample([root]) == (10, 5, 0, 0)
    assert t.sample([root], never_seen=[(CHILD, None, ROOT)]) == (10, 5, 0, 0)
    assert t.departures.exact is True  # its parent's counters will show it


@pytest.mark.parametrize("own_cpu", [False, True], ids=["by-reaper", "by-owner"])
def test_a_child_born_and_gone_between_passes_counts_its_record(own_cpu: bool) -> None:
    """Never read: its record alone says what it did (25 ticks user, 12.5 system)."""
    t = Target(own_cpu=own_cpu)
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))]) == (10, 5, 0, 0)
    t.exit(CHILD, ROOT, user_us=250_000, system_us=125_000, read=512, write=1_024)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    assert t.sample([root], never_seen=[(CHILD, None, ROOT)]) == (35, 17.5, 512, 1_024)
    assert t.departures.exact
    # One with no record (lost): by owner its time is lost, and the target says so.
    t.sample([root], never_seen=[(GRANDCHILD, None, ROOT)])
    assert t.departures.exact is (not own_cpu)


def test_a_child_that_reaped_its_own_children_leaves_them_with_its_record() -> None:
    """By reaper, a child's reaped children are in its counters; its record has its own
    time only: what it leaves is the two added (80 user, 30 system)."""
    t = Target(own_cpu=False)
    child = t.member(CHILD, ROOT, (40, 20, 0, 0), (30, 5, 0, 0))
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), child]) == (80, 30, 0, 0)
    t.exit(CHILD, ROOT, user_us=500_000, system_us=250_000, read=0, write=0)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    assert t.sample([root], [(CHILD, child, ROOT)]) == (90, 35, 0, 0)


def test_a_record_as_long_as_the_reading_gives_its_own_split() -> None:
    """Record and /proc agree on 100 ticks in all and split them apart: the record's
    split counts, at exit too."""
    t = Target(own_cpu=False)
    last = t.member(ROOT, OUTSIDE, (60, 40, 0, 0))
    t.sample([last])
    t.exit(ROOT, OUTSIDE, user_us=750_000, system_us=250_000, read=0, write=0)
    end = t.end([(ROOT, last, OUTSIDE)], alone=True)
    assert (end.cpu_user_s, end.cpu_system_s) == (75 / CLOCK_TICKS, 25 / CLOCK_TICKS)


def test_cpu_time_never_goes_backwards_when_a_reaper_shows_its_child_in_whole_ticks() -> None:
    """By reaper, a child's record (in microseconds) is pending on its parent until the
    parent's counters show it, truncated to ticks: less than a tick lower. CPU time is
    held where it was reported, and grows from there."""
    t = Target(own_cpu=False)
    child = t.member(CHILD, ROOT, (140, 20, 0, 0))
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), child]) == (150, 25, 0, 0)
    # 97/64 s of user time: 151.5625 ticks, exact in binary.
    t.exit(CHILD, ROOT, user_us=1_515_625, system_us=250_000, read=0, write=0)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    assert t.sample([root], [(CHILD, child, ROOT)]) == (161.5625, 30, 0, 0)
    # Reaped: /proc shows 151 ticks of it; the 0.5625 left is that rounding.
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0), (151, 25, 0, 0))
    assert t.sample([root]) == (161.5625, 30, 0, 0)
    assert t.departures.quiet  # nothing pending: held, not counted twice
    root = t.member(ROOT, OUTSIDE, (11, 5, 0, 0), (151, 25, 0, 0))
    assert t.sample([root]) == (162, 30, 0, 0)


def test_the_exit_guard_holds_cpu_reported_above_the_last_figures() -> None:
    """The figures carried at exit below what was reported (the rounding above, at the
    root's exit): the exit's CPU time is what was reported."""
    t = Target(own_cpu=False)
    child = t.member(CHILD, ROOT, (140, 20, 0, 0))
    t.sample([t.member(ROOT, OUTSIDE, (10, 5, 4_096, 0)), child])
    t.exit(CHILD, ROOT, user_us=1_515_625, system_us=250_000, read=0, write=0)
    root = t.member(ROOT, OUTSIDE, (10, 5, 4_096, 0))
    t.sample([root], [(CHILD, child, ROOT)])
    root = t.member(ROOT, OUTSIDE, (10, 5, 4_096, 0), (151, 25, 0, 0))
    assert t.sample([root]) == (161.5625, 30, 4_096, 0)
    t.exit(ROOT, OUTSIDE, user_us=93_750, system_us=46_875, read=4_096, write=0)
    end = t.end([(ROOT, root, OUTSIDE)], alone=False)
    assert (end.cpu_user_s, end.cpu_system_s) == (161.5625 / CLOCK_TICKS, 30 / CLOCK_TICKS)
    assert (end.read_bytes, end.rss_peak_bytes) == (4_096, None)  # not alone: not its own


def test_a_live_reading_split_anew_at_the_same_sum_is_taken() -> None:
    t = Target(own_cpu=False)
    assert t.sample([t.member(ROOT, OUTSIDE, (100, 20, 0, 0))]) == (100, 20, 0, 0)
    assert t.sample([t.member(ROOT, OUTSIDE, (99, 21, 0, 0))]) == (99, 21, 0, 0)


def test_a_record_below_what_proc_showed_keeps_the_reading_and_adds_what_follows() -> None:
    """A departed member's record may count less than /proc last showed of it: its
    reading stands, and what the live members run afterwards adds to it."""
    t = Target(own_cpu=False)
    child = t.member(CHILD, ROOT, (200, 50, 0, 0))
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), child]) == (210, 55, 0, 0)
    t.exit(CHILD, OUTSIDE, user_us=1_500_000, system_us=250_000, read=0, write=0)
    root = t.member(ROOT, OUTSIDE, (20, 5, 0, 0))  # reaped outside: carried
    assert t.sample([root], [(CHILD, child, OUTSIDE)]) == (220, 55, 0, 0)


@pytest.mark.parametrize("own_cpu", [False, True], ids=["by-reaper", "by-owner"])
def test_an_exited_child_counts_while_its_parent_has_not_reaped_it(own_cpu: bool) -> None:
    """A child exits; its parent (the root) reaps it two passes later. In between, its
    record counts in the target (the parent's counters do not show it yet); once they
    do, it counts there, once."""
    t = Target(own_cpu=own_cpu)
    child = t.member(CHILD, ROOT, (40, 10, 100, 200))
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), child]) == (50, 15, 100, 200)
    t.exit(CHILD, ROOT, user_us=750_000, system_us=250_000, read=300, write=400)
    departed = [(CHILD, child, ROOT)]
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))], departed) == (85, 30, 300, 400)
    assert not t.departures.quiet
    assert t.sample([t.member(ROOT, OUTSIDE, (12, 5, 0, 0))]) == (87, 30, 300, 400)
    # Reaped: the parent's counters show the child's (its io counts the child's bytes),
    # and 2 ticks of system time more: the child's teardown, after its record.
    reaping = t.member(ROOT, OUTSIDE, (12, 5, 300, 400), (75, 27, 300, 400))
    assert t.sample([reaping]) == (87, 32, 300, 400)
    assert t.departures.quiet
    later = t.member(ROOT, OUTSIDE, (13, 5, 300, 400), (75, 27, 300, 400))
    assert t.sample([later]) == (88, 32, 300, 400)


def test_by_owner_a_departed_childs_teardown_is_awaited() -> None:
    """A child that left nothing pending (no bytes): its teardown is still to show in
    its parent's counters, so the target's passes are not quiet yet."""
    t = Target(own_cpu=True)
    child = t.member(CHILD, ROOT, (40, 10, 0, 0))
    t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), child])
    t.exit(CHILD, ROOT, user_us=750_000, system_us=250_000, read=0, write=0)
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))], [(CHILD, child, ROOT)]) == (
        85,
        30,
        0,
        0,
    )
    assert not t.departures.quiet


def test_by_owner_a_reaper_gone_outside_with_children_unread_leaves_teardowns_uncounted() -> None:
    """The child reaped the grandchild after its last reading, then left, reaped
    outside the target: that teardown is in no counter read, and the exit says so."""
    t = Target(own_cpu=True)
    child = t.member(CHILD, ROOT, (40, 10, 0, 0))
    grandchild = t.member(GRANDCHILD, CHILD, (20, 5, 0, 0))
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    t.sample([root, child, grandchild])
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    t.exit(CHILD, OUTSIDE, user_us=500_000, system_us=125_000, read=0, write=0)
    gone = [(GRANDCHILD, grandchild, CHILD), (CHILD, child, OUTSIDE)]
    assert t.sample([root], gone) == (85, 23.75, 0, 0)
    t.exit(ROOT, OUTSIDE, user_us=125_000, system_us=62_500, read=0, write=0)
    end = t.end([(ROOT, root, OUTSIDE)], alone=True)
    assert (end.cpu_user_s, end.cpu_system_s) == (87.5 / CLOCK_TICKS, 25 / CLOCK_TICKS)
    assert not end.teardowns_counted


@pytest.mark.parametrize("parent_first", [False, True])
def test_a_parent_and_child_leaving_in_one_pass_count_once_in_either_order(
    parent_first: bool,
) -> None:
    t = Target(own_cpu=False)
    child = t.member(CHILD, ROOT, (40, 10, 100, 0))
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    assert t.sample([root, child]) == (50, 15, 100, 0)
    t.exit(CHILD, ROOT, user_us=500_000, system_us=125_000, read=100, write=0)
    t.exit(ROOT, OUTSIDE, user_us=125_000, system_us=62_500, read=0, write=0)
    gone = [(CHILD, child, ROOT), (ROOT, root, OUTSIDE)]
    end = t.end(gone[::-1] if parent_first else gone, alone=False)
    assert (end.cpu_user_s, end.cpu_system_s) == (62.5 / CLOCK_TICKS, 18.75 / CLOCK_TICKS)
    assert end.read_bytes == 100


def test_a_child_never_read_reaped_by_a_member_new_this_pass_counts() -> None:
    t = Target(own_cpu=False)
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))]) == (10, 5, 0, 0)
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=125_000, read=0, write=64)
    live = [t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), t.member(CHILD, ROOT, (1, 0, 0, 0))]
    assert t.sample(live, never_seen=[(GRANDCHILD, None, CHILD)]) == (36, 17.5, 0, 64)


@pytest.mark.parametrize(("user_us", "system_us"), [(15_625, 0), (10_000, 0), (0, 10_000)])
def test_a_second_child_still_to_be_reaped_stays_counted_past_the_rounding(
    user_us: int, system_us: int
) -> None:
    """Two children pending on the root; it reaps the first: the second's ticks (one or
    more of a mode is no rounding) stay pending, and the root's own time adds."""
    t = Target(own_cpu=False)
    first, second = t.member(CHILD, ROOT, (40, 10, 0, 0)), t.member(GRANDCHILD, ROOT, ZERO)
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0)), first, second]) == (50, 15, 0, 0)
    t.exit(CHILD, ROOT, user_us=750_000, system_us=250_000, read=0, write=0)
    t.exit(GRANDCHILD, ROOT, user_us=user_us, system_us=system_us, read=0, write=0)
    user, system = user_us / 10_000, system_us / 10_000  # its ticks, exact here
    gone = [(CHILD, first, ROOT), (GRANDCHILD, second, ROOT)]
    total = t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))], gone)
    assert total == (85 + user, 30 + system, 0, 0)
    reaped_one = t.member(ROOT, OUTSIDE, (11, 5, 0, 0), (75, 25, 0, 0))
    assert t.sample([reaped_one]) == (86 + user, 30 + system, 0, 0)


def test_by_owner_a_zombie_reaped_outside_shows_the_teardowns_it_reaped_late() -> None:
    """The child reaps the grandchild after its last live reading, exits, is read as a
    zombie and is reaped outside the target: the zombie's counters (32 ticks reaped
    against the grandchild's 31.25 recorded) are the only place its teardown shows."""
    t = Target(own_cpu=True)
    child = t.member(CHILD, ROOT, (40, 10, 0, 0))
    grandchild = t.member(GRANDCHILD, CHILD, (20, 5, 0, 0))
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    t.sample([root, child, grandchild])
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    assert t.sample([root, child], [(GRANDCHILD, grandchild, CHILD)]) == (75, 21.25, 0, 0)
    zombie = t.member(CHILD, ROOT, (40, 10, 0, 0), (25, 7, 0, 0), zombie=True)
    t.exit(CHILD, OUTSIDE, user_us=400_000, system_us=100_000, read=0, write=0)
    assert t.sample([root], [(CHILD, zombie, OUTSIDE)]) == (75, 21.25 + 0.75, 0, 0)
    assert t.departures.exact


def test_by_owner_a_child_reaped_unseen_then_its_reaper_gone_outside_counts_once() -> None:
    """The grandchild is born, exits and is reaped by the child before any pass reads
    it: the child's counters show its 31 ticks at once. Its record comes the pass the
    child leaves, reaped outside the target: what the child's counters showed was
    expected of it, so nothing is counted twice and the teardowns are all counted."""
    t = Target(own_cpu=True)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    t.sample([root, t.member(CHILD, ROOT, (40, 10, 0, 0))])
    child = t.member(CHILD, ROOT, (40, 10, 0, 0), (25, 6, 0, 0))
    t.sample([root, child], unseen={GRANDCHILD})
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    t.exit(CHILD, OUTSIDE, user_us=400_000, system_us=100_000, read=0, write=0)
    gone = [(CHILD, child, OUTSIDE)]
    assert t.sample([root], gone, [(GRANDCHILD, None, CHILD)]) == (75, 21.25, 0, 0)
    t.exit(ROOT, OUTSIDE, user_us=100_000, system_us=50_000, read=0, write=0)
    assert t.end([(ROOT, root, OUTSIDE)], alone=False).teardowns_counted


def test_by_owner_a_grandchild_reaped_by_a_child_never_read_counts_once() -> None:
    """The child and the grandchild are born after the last pass; the grandchild exits,
    the child reaps it, exits and is reaped by the root, all before this pass reads the
    child (unseen: its exit event is the next drain's). The root's counters show the
    child's whole CPU, the grandchild's within it: the grandchild's record is expected
    of the child, not counted a second time (CI14 read a subreaper tree 60 ms high)."""
    t = Target(own_cpu=True)
    assert t.sample([t.member(ROOT, OUTSIDE, (10, 5, 0, 0))]) == (10, 5, 0, 0)
    # Reaped: the child's 50 ticks and 1 of teardown, the grandchild's 31.25 and 0.75.
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0), (65, 18, 0, 0))
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    total = t.sample([root], never_seen=[(GRANDCHILD, None, CHILD)], unseen={CHILD})
    assert total.cpu_ticks == 15 + 83
    t.exit(CHILD, ROOT, user_us=400_000, system_us=100_000, read=0, write=0)
    assert t.sample([root], never_seen=[(CHILD, None, ROOT)]) == (75, 23, 0, 0)
    t.exit(ROOT, OUTSIDE, user_us=100_000, system_us=50_000, read=0, write=0)
    end = t.end([(ROOT, root, OUTSIDE)], alone=False)
    assert (end.cpu_user_s, end.cpu_system_s) == (75 / CLOCK_TICKS, 23 / CLOCK_TICKS)
    assert end.teardowns_counted


def test_by_owner_a_child_reaped_after_its_reapers_last_reading_leaves_it_uncounted() -> None:
    """As above, but the child reaps the grandchild after the pass read it, then
    leaves reaped outside: that teardown is in no counter read, and the exit says so."""
    t = Target(own_cpu=True)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    t.sample([root, t.member(CHILD, ROOT, (40, 10, 0, 0))])
    child = t.member(CHILD, ROOT, (40, 10, 0, 0))
    t.sample([root, child])
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    t.exit(CHILD, OUTSIDE, user_us=400_000, system_us=100_000, read=0, write=0)
    gone = [(CHILD, child, OUTSIDE)]
    assert t.sample([root], gone, [(GRANDCHILD, None, CHILD)]) == (75, 21.25, 0, 0)
    t.exit(ROOT, OUTSIDE, user_us=100_000, system_us=50_000, read=0, write=0)
    assert not t.end([(ROOT, root, OUTSIDE)], alone=False).teardowns_counted


def test_by_owner_a_zombie_reaped_outside_with_its_childs_record_in_the_same_pass() -> None:
    """The grandchild's record and its zombie reaper's departure come in one pass:
    what the zombie's counters show (32 ticks) is weighed against the grandchild's
    31.25, not counted again."""
    t = Target(own_cpu=True)
    child = t.member(CHILD, ROOT, (40, 10, 0, 0))
    grandchild = t.member(GRANDCHILD, CHILD, (20, 5, 0, 0))
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    t.sample([root, child, grandchild])
    zombie = t.member(CHILD, ROOT, (40, 10, 0, 0), (25, 7, 0, 0), zombie=True)
    t.exit(GRANDCHILD, CHILD, user_us=250_000, system_us=62_500, read=0, write=0)
    t.exit(CHILD, OUTSIDE, user_us=400_000, system_us=100_000, read=0, write=0)
    gone = [(GRANDCHILD, grandchild, CHILD), (CHILD, zombie, OUTSIDE)]
    assert t.sample([root], gone) == (75, 21.25 + 0.75, 0, 0)
    t.exit(ROOT, OUTSIDE, user_us=100_000, system_us=50_000, read=0, write=0)
    assert t.end([(ROOT, root, OUTSIDE)], alone=False).teardowns_counted


def _counts(t: Target, live: list[Member]) -> tuple[int, ...]:
    """The target's channel counts after a pass over ``live`` (each its own)."""
    total = NO_COUNTS
    for m in live:
        assert m.counts is not None
        total = tuple(a + b for a, b in zip(total, m.counts))
    return t.departures.counts(total)


@pytest.mark.parametrize("own_cpu", [False, True], ids=["by-reaper", "by-owner"])
def test_a_departed_member_s_context_switches_are_carried_at_once_its_record_s_where_one_came(
    own_cpu: bool,
) -> None:
    """No reaper's counters show a reaped child's switches: a departed member's are
    carried at once, in either mode, its exit record's (all its threads, to its exit)
    where one came, else as last read; the sum never goes back."""
    t = Target(own_cpu=own_cpu)
    root = t.member(ROOT, OUTSIDE, (10, 5, 0, 0))
    root.counts = switches(7, 1)
    child = t.member(CHILD, ROOT, (20, 5, 0, 0))
    child.counts = switches(30, 4)
    t.sample([root, child])
    assert _counts(t, [root, child]) == switches(37, 5)
    # The child ran on (40 waits, 6 preemptions in all) and exited; its parent reaped it.
    t.exit(CHILD, ROOT, user_us=300_000, system_us=50_000, read=0, write=0)
    t.records.queued[-1] = dataclasses.replace(t.records.queued[-1], counts=switches(40, 6))
    t.sample([root], [(CHILD, child, ROOT)])
    assert _counts(t, [root]) == switches(47, 7)
    # A grandchild gone without a record: its last reading counts.
    grandchild = t.member(GRANDCHILD, ROOT, (1, 0, 0, 0))
    grandchild.counts = switches(5, 0)
    t.sample([root, grandchild])
    assert _counts(t, [root, grandchild]) == switches(52, 7)
    t.sample([root], [(GRANDCHILD, grandchild, ROOT)])
    assert _counts(t, [root]) == switches(52, 7)
    # The root read lower (its main thread alone after another exit): never back.
    root.counts = switches(6, 1)
    assert _counts(t, [root]) == switches(52, 7)
    # Its own exit: its record's, all its threads.
    t.exit(ROOT, OUTSIDE, user_us=200_000, system_us=60_000, read=0, write=0)
    t.records.queued[-1] = dataclasses.replace(t.records.queued[-1], counts=switches(9, 2))
    assert t.end([(ROOT, root, OUTSIDE)], alone=True).counts == switches(54, 8)
