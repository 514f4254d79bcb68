"""What the kernel's exit records miss: each process's teardown.

A process's exit record (taskstats) is sent before it tears down its address space,
so the CPU of that teardown (0.5-1.4 ms a process on a 2-core x86 board: 55-85 % of a
``/bin/true``) is in no record. Its reaper's counters of reaped children (cutime and
cstime in /proc/PID/stat) have it: a parent's ``wait4`` adds the child's whole CPU,
teardown included, and what the child itself had reaped.

So each member that reaps is a check on the records: what its reaped-children
counters grew by since it joined (``shown``), against what the target counted for
the members that exited with it as their parent (``expected``: their own CPU, and
what their own counters showed). The difference, summed over every member (departed
ones at their last reading), is what the records missed. Each part may be negative
(a child that exited but is not reaped yet is expected, not shown; a zombie
re-parented from a member that exited before reaping it is expected at the old
member and shows at its new reaper): only the sum is a figure, never below zero, so
the records are a floor. Every part counts as soon as it is known, a negative one too
(and a member's children are expected before the member itself is read or settled):
a positive part counted before its negative one would stay in the target's
never-decreasing counters. A zombie re-parented outside the target (its parent exited
without reaping it) stays expected and shows nowhere: the figure is then low by up to
its CPU in teardowns, never below the records.

A member reaped outside the target (the root, an orphan re-parented to ``edgewatt
run``) is checked against what was expected of it at its last reading: the children
it reaped after that have their records only. ``edgewatt run`` closes that gap for its
command by holding it as a zombie (its counters final) until the daemon has read it.
All figures are in /proc's clock ticks.
"""

from __future__ import annotations


class Teardowns:
    """Reaped-children counters against the records, per member (see the module)."""

    def __init__(self) -> None:
        self._base: dict[int, float] = {}  # member -> its counters when it joined
        self._shown: dict[int, float] = {}  # member -> their growth, at its last reading
        self._expected: dict[int, float] = {}  # reaper -> what its exited children counted
        self._expected_read: dict[int, float] = {}  # the same, at the reaper's last reading
        self._settled = 0.0  # the differences of departed members
        # Reapers that departed with every child they reaped expected of them (inside
        # the target, or read as a zombie), by the pass they left in: a child whose exit
        # event comes after its reaper left the tree (it exited after that pass drained
        # the events, and was reaped before its reaper was read) is theirs still.
        self._closed: dict[int, int] = {}
        self._passes = 0
        # False once a member reaped outside the target had reaped children after its
        # last reading: their teardowns are in no counter the daemon read.
        self.complete = True

    def read(self, pid: int, reaped_ticks: float, existing: bool) -> None:
        """A live member's reaped-children counters, read now. ``existing``: it was in
        the target when that was registered (what it reaped before is not the
        target's); one forked since starts at zero."""
        base = self._base.setdefault(pid, reaped_ticks if existing else 0.0)
        self._shown[pid] = max(0.0, reaped_ticks - base)

    def depart(
        self, pid: int, own_ticks: float, reaper: int, inside: bool, unseen: bool, final: bool
    ) -> None:
        """Member ``pid`` exited, counted ``own_ticks`` by the target, reaped by
        ``reaper`` (``inside`` the target or not). ``unseen``: it was reaped before the
        last pass could read it, so that pass's reading of its reaper showed it.
        ``final``: it was last read as a zombie, every child it reaped shown."""
        base = self._base.pop(pid, 0.0)
        shown = self._shown.pop(pid, 0.0)
        expected = self._expected.pop(pid, 0.0)
        at_read = self._expected_read.pop(pid, 0.0)
        late = not inside and reaper in self._closed
        if not inside and not late:
            self._settled += shown - (expected if final else at_read)
            if not final and expected - at_read > 1e-6:
                self.complete = False
            if final:
                self._closed[pid] = self._passes
            return
        self._closed[pid] = self._passes
        # What the reaper's counters will gain by reaping it, as the target counted it.
        value = own_ticks + base + shown
        self._settled += shown - expected
        if late:  # its reaper's counters showed it, and it left expecting nothing more
            self._settled -= value
            return
        self._expected[reaper] = self._expected.get(reaper, 0.0) + value
        if unseen:
            self._expected_read[reaper] = self._expected_read.get(reaper, 0.0) + value

    def after_pass(self, live: set[int], members: set[int]) -> None:
        """Every member read this pass (``live``) is expected, as of now, what it showed;
        ``members``: every process still in the target, read or not."""
        for pid in [pid for pid in self._expected if pid not in members]:
            del self._expected[pid]  # a reaper that left the tree without an exit event
        for pid in live:
            self._expected_read[pid] = self._expected.get(pid, 0.0)
        self._passes += 1
        for pid in [pid for pid, at in self._closed.items() if at < self._passes - 2]:
            del self._closed[pid]  # its children's exit events have all come by now

    @property
    def quiet(self) -> bool:
        """No departed reaper's children are still awaited: with the same members read
        with the same counters, a pass changes nothing here but its count, which only
        ages these entries."""
        return not self._closed

    def missed(self) -> float:
        """The ticks the exit records missed, as far as the counters show them yet."""
        # Members still in: one reaped before a pass read it (its exit event to come)
        # has its children's parts expected already, shown in its reaper's counters.
        live = sum(self._shown.values()) - sum(self._expected.values())
        return max(0.0, self._settled + live)
