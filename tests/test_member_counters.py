"""One member read by each counting rule (by owner, by reaper, without children), its
io carried over while it waits, and a zombie's final reading: exact figures from a
stand-in /proc handle."""

from __future__ import annotations

from edgewatt.core.facts.member_counters import ZERO, Counters, MemberReader, sub_floor
from edgewatt.core.facts.procfs import NoSuchProcess, Stat
from tests.channel_counts import switches


class Handle:
    """A ProcHandle's reads, each counted: what its /proc files would say."""

    def __init__(self, pid: int, io: tuple[int, int] | None = (4096, 8192)) -> None:
        self.pid = pid
        self.io_value = io
        self.activity_value = b"1 2 3"
        self.stat_value = stat()
        self.gone = False
        self.reads = 0
        self.closed = False
        self.counts_value: tuple[int, ...] | None = switches(40, 3)
        self.count_reads = 0

    def activity(self) -> bytes:
        return self.activity_value

    def io(self) -> tuple[int, int] | None:
        if self.gone:
            raise NoSuchProcess(self.pid)
        self.reads += 1
        return self.io_value

    def fd_count(self) -> int:
        return 7

    def counts(self, stat: Stat) -> tuple[int, ...] | None:
        if self.gone:
            raise NoSuchProcess(self.pid)
        self.count_reads += 1
        return self.counts_value

    def stat(self) -> Stat:
        if self.gone:
            raise NoSuchProcess(self.pid)
        return self.stat_value

    def close(self) -> None:
        self.closed = True


def stat(state: str = "S", threads: int = 1) -> Stat:
    """utime 100, stime 20, cutime 30, cstime 5 ticks."""
    return Stat("python", state, 1, 100, 20, 30, 5, threads, 5000, 1 << 20, 256, 0)


def test_each_rule_counts_its_own_channels() -> None:
    for own_cpu, children, totals, reaped in [
        (True, True, (100, 20, 4096, 8192), (0, 0, 4096, 8192)),
        (False, True, (130, 25, 4096, 8192), (30, 5, 4096, 8192)),
        (False, False, (100, 20, 4096, 8192), ZERO),
    ]:
        root = Handle(10)
        reader = MemberReader(root, own_cpu=own_cpu, children=children)  # type: ignore[arg-type]
        member = reader.read(root, stat(), None, False)  # type: ignore[arg-type]
        assert member is not None
        assert (member.totals, member.reaped) == (totals, reaped), (own_cpu, children)
        assert (member.io, member.fds, member.reaped_cpu) == ((4096, 8192), 7, 35)
        assert (member.ppid, member.idle, member.zombie) == (1, False, False)


def test_a_member_that_did_not_run_keeps_its_io_and_a_recheck_reads_it() -> None:
    root = Handle(10)
    reader = MemberReader(root, own_cpu=False, children=True)  # type: ignore[arg-type]
    first = reader.read(root, stat(), None, False)  # type: ignore[arg-type]
    root.io_value = (1, 1)  # what a read would find now
    idle = reader.read(root, stat(), first, False)  # type: ignore[arg-type]
    assert idle is not None and idle.idle and idle.io == (4096, 8192) and root.reads == 1
    assert reader.read(root, stat(), first, True).io == (1, 1)  # type: ignore[arg-type, union-attr]
    # It ran: read again.
    root.activity_value = b"1 2 4"
    ran = reader.read(root, stat(), first, False)  # type: ignore[arg-type]
    assert ran is not None and not ran.idle and root.reads == 3
    # Several threads: no activity to compare, always read.
    many = reader.read(root, stat(threads=2), ran, False)  # type: ignore[arg-type]
    assert many is not None and not many.idle and many.activity is None and root.reads == 4
    # A reading of another process under the same pid is no previous reading.
    other = Handle(10)
    fresh = reader.read(other, stat(), ran, False)  # type: ignore[arg-type]
    assert fresh is not None and not fresh.idle and other.reads == 1


def test_a_member_s_channel_counts_are_read_where_it_ran_and_kept_where_not() -> None:
    root = Handle(10)
    reader = MemberReader(root, own_cpu=False, children=True)  # type: ignore[arg-type]
    first = reader.read(root, stat(), None, False)  # type: ignore[arg-type]
    assert first is not None and first.counts == switches(40, 3) and root.count_reads == 1
    root.counts_value = switches(41, 3)  # what a read would find now
    idle = reader.read(root, stat(), first, False)  # type: ignore[arg-type]
    assert idle is not None and idle.counts is first.counts and root.count_reads == 1
    root.activity_value = b"1 2 4"  # it ran
    ran = reader.read(root, stat(), first, False)  # type: ignore[arg-type]
    assert ran is not None and ran.counts == switches(41, 3) and root.count_reads == 2
    # Read again unchanged: the same object, so the target's sum is not rebuilt.
    root.activity_value = b"1 2 5"
    root.counts_value = switches(41, 3)  # an equal tuple, not the same one
    again = reader.read(root, stat(), ran, False)  # type: ignore[arg-type]
    assert again is not None and again.counts is ran.counts
    root.counts_value = None  # not shown: None, not 0
    unread = reader.read(root, stat(threads=2), ran, False)  # type: ignore[arg-type]
    assert unread is not None and unread.counts is None


def test_unreadable_io_counts_zero_and_says_so_for_the_root_only() -> None:
    root, child = Handle(10, io=None), Handle(11, io=None)
    reader = MemberReader(root, own_cpu=False, children=True)  # type: ignore[arg-type]
    assert reader.io_visible
    member = reader.read(child, stat(), None, False)  # type: ignore[arg-type]
    assert member is not None and member.totals[2:] == (0, 0) and reader.io_visible
    member = reader.read(root, stat(), None, False)  # type: ignore[arg-type]
    assert member is not None and member.totals == (130, 25, 0, 0) and member.io is None
    assert not reader.io_visible
    root.io_value = (5, 6)
    reader.read(root, stat(), None, False)  # type: ignore[arg-type]
    assert reader.io_visible


def test_a_member_gone_mid_read_is_none_and_a_new_ones_handle_is_closed() -> None:
    root, child = Handle(10), Handle(11)
    reader = MemberReader(root, own_cpu=False, children=True)  # type: ignore[arg-type]
    child.gone = root.gone = True
    assert reader.read(child, stat(), None, False) is None  # type: ignore[arg-type]
    assert child.closed
    assert reader.read(root, stat(), None, False) is None  # type: ignore[arg-type]
    assert not root.closed  # the root's handle is the target's own
    known = Handle(12)
    before = reader.read(known, stat(), None, True)  # type: ignore[arg-type]
    known.gone = True
    assert reader.read(known, stat(), before, True) is None  # type: ignore[arg-type]
    assert not known.closed  # opened in an earlier pass: its owner closes it


def test_a_zombie_is_read_once_more_by_owner_only() -> None:
    for own_cpu in (True, False):
        root = Handle(10)
        reader = MemberReader(root, own_cpu=own_cpu, children=True)  # type: ignore[arg-type]
        member = reader.read(root, stat(), None, False)  # type: ignore[arg-type]
        assert member is not None
        was = (member.totals, member.reaped_cpu)
        # Still running: nothing changes.
        root.stat_value = Stat("python", "R", 1, 150, 40, 60, 9, 1, 5000, 0, 0, 0)
        reader.read_zombie(member)
        assert (member.totals, member.reaped_cpu, member.zombie) == (*was, False)
        root.stat_value = Stat("python", "Z", 1, 150, 40, 60, 9, 1, 5000, 0, 0, 0)
        reader.read_zombie(member)
        if own_cpu:
            assert (member.totals, member.reaped_cpu, member.zombie) == (
                (150, 40, 4096, 8192),
                69,
                True,
            )
        else:  # by reaper its parent's counters show it once reaped
            assert (member.totals, member.reaped_cpu, member.zombie) == (*was, False)
        root.gone = True
        reader.read_zombie(member)  # reaped meanwhile: nothing to read


def test_sub_floor_takes_each_channel_apart_never_below_zero() -> None:
    assert sub_floor(Counters(5, 2, 10, 3), Counters(1, 4, 4, 5)) == (4, 0, 6, 0)
