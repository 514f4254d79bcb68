"""Memory that means what it says: each target's proportional set size (PSS) and its
largest process's RSS, from /proc/PID/smaps_rollup.

The sum of the members' RSS (``memory_rss_bytes``, from stat) counts a page shared by
N members N times: a DataLoader's workers forked from a 400 MiB parent sum to twice
what the tree holds. PSS splits each page among the processes that map it, so the sum
of the members' PSS is what the work really holds (a page shared with a process
outside the target counts its share only).

smaps_rollup walks the process's page tables: ~100 times a stat read for a 100 MiB
process (benchmarks/pss_cost.py, docs/performance.md). A target's members are read
again only when something it could change did: its members, or their RSS summed (by
more than ``RSS_MOVE`` of it), or at every ``REFRESH_EVERY``-th pass (pages shared
with processes outside the target change their share unseen). Between rereads the
figures are the last ones read, of the same members. Rereads are the regular passes'
(they alone count): an edge reads a target's PSS only where it was never read.

What a read costs is the target's to decide: 60,000 small mappings make one ~5-12 ms
(the kernel walks every one), and a target whose memory moves is due every pass (20
of them made a pass 77-119 ms instead of 1.1 ms, at Nice -10). So the reads
of a pass share a budget, ``PASS_BUDGET_S`` of CPU on average (a pass spends at most
that plus one target's read; what it overspends, later passes do not), and a target
whose read costs more than ``TARGET_BUDGET_S`` waits at least as many passes as its
cost is multiples of it. Due targets are read by their wait over their cost,
highest first: under a full budget a target twice as dear waits twice as long, and
none for ever. One not read keeps its last figures, and ``memory_pss_read_at`` (the
reading's time when they were read) says how old they are.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from edgewatt.core.facts import procfs
from edgewatt.core.sampling.contributors import UNCHANGED, Figures, Status, Unchanged

if TYPE_CHECKING:
    from edgewatt.core.sampling.tracked import TargetState

# Rereads happen when the RSS summed moved by more than this share of it...
RSS_MOVE = 0.02
# ...or its members changed, and at least every this many passes (a page shared with a
# process outside the target changes its share unseen; at 10, the reads of waiting
# targets were 13-19 % of a pass over 200 of them: docs/changelog.md).
REFRESH_EVERY = 30
# The CPU the reads of a pass take on average: a pass that reads spends at most this
# plus one read (what is overspent waits in later passes), 0.5 % of a core at 1 s.
PASS_BUDGET_S = 0.005
# A target whose read costs more than this waits cost/TARGET_BUDGET_S passes between
# reads: a 100 MiB process (1-2.7 ms) every pass or two, 1 GiB (12-14 ms) or 60,000
# mappings (5-12 ms) every 2-6 passes at most.
TARGET_BUDGET_S = 0.0025


class Rollup(NamedTuple):
    """One process's figures from its smaps_rollup, in bytes."""

    rss: int
    pss: int


def parse_rollup(data: bytes) -> Rollup:
    """Rss and Pss (kB in the file) of /proc/PID/smaps_rollup's text."""
    rss = pss = None
    for line in data.split(b"\n"):
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
            break  # Rss comes first
    if rss is None or pss is None:
        raise ValueError(f"no Rss/Pss in smaps_rollup: {data[:80]!r}")
    return Rollup(rss, pss)


def read_rollup(pid: int, proc: str = "/proc") -> Rollup | None:
    """The process's Rss and Pss; None where the kernel shows none (gone, a kernel
    thread or a zombie: no memory; not permitted; a kernel before 4.14)."""
    data = procfs.read_once(f"{proc}/{pid}/smaps_rollup")
    if not data:
        return None  # gone or not permitted; empty: a zombie, its memory gone
    try:
        return parse_rollup(data)
    except ValueError:
        return None


class _Kept:
    """What was read for a target: its figures are handed out once, at the read, and
    are UNCHANGED until the next (no per-target allocation on the passes between)."""

    __slots__ = ("cost", "members", "passes", "rss_sum")

    def __init__(self, members: tuple[int, ...], rss_sum: int, cost: float) -> None:
        self.members = members
        self.rss_sum = rss_sum  # the reading's RSS summed when the rollups were read
        self.passes = 0  # passes since
        self.cost = cost  # CPU seconds the read took


class ProportionalMemory:
    """Contributor: ``memory_pss_bytes`` (PSS summed over the live members) and
    ``memory_rss_largest_bytes`` (the largest member's RSS) of each target; None
    where no member's smaps_rollup could be read (never 0); ``memory_pss_read_at``,
    the unix time they were read at."""

    name = "reading smaps_rollup"
    sets = ("memory_pss_bytes", "memory_rss_largest_bytes", "memory_pss_read_at")
    counts = "any"
    # An edge reads a target's PSS only if it was never read: a reread (5-12 ms for
    # a target of many mappings, 1 edge in 23-30 paid ~1 ms for it) waits for the
    # regular pass, and REFRESH_EVERY counts regular passes.
    at_edges = False

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._kept: dict[str, _Kept] = {}
        self.reads = 0  # smaps_rollup files read since start (tests, benchmarks)
        self._allowance = PASS_BUDGET_S  # CPU seconds the reads may take (< 0: overspent)

    def begin(self) -> None:
        pass

    def contribute(self, states: Sequence[TargetState]) -> Figures:
        figures: dict[str, Mapping[str, Any] | Unchanged] = {}
        due: list[tuple[float, str, TargetState]] = []  # by priority (_read_due)
        for state in states:
            reading = state.reading
            if reading is None:
                continue
            target_id = state.target.id
            kept = self._kept.get(target_id)
            if kept is None:
                due.append((float("inf"), target_id, state))  # never read: first
                continue
            if (  # a waiting target's reading, given back as it was: kept (most targets)
                kept.members is reading.pids
                and kept.rss_sum == reading.rss_bytes
                and kept.passes + 1 < REFRESH_EVERY
            ) or not self._stale(kept, reading.pids, reading.rss_bytes):
                kept.passes += 1
            else:
                # Its wait in passes per read cost (in TARGET_BUDGET_S): a cheap one first.
                priority = (kept.passes + 1) * TARGET_BUDGET_S / max(kept.cost, 1e-6)
                due.append((priority, target_id, state))
                continue
            figures[target_id] = UNCHANGED
        if due:
            figures.update(self._read_due(due))
        return figures

    def _read_due(
        self, due: list[tuple[float, str, TargetState]]
    ) -> dict[str, Mapping[str, Any] | Unchanged]:
        """Read the due targets, highest priority first (their wait in passes over
        their cost: under 1, not yet), while the budget lasts; the others keep their
        figures one pass more."""
        self._allowance = min(self._allowance + PASS_BUDGET_S, PASS_BUDGET_S)
        figures: dict[str, Mapping[str, Any] | Unchanged] = {}
        due.sort(key=lambda d: d[0], reverse=True)
        for priority, target_id, state in due:
            kept = self._kept.get(target_id)
            if self._allowance <= 0 or priority < 1:
                if kept is not None:
                    kept.passes += 1
                    figures[target_id] = UNCHANGED
                continue
            reading = state.reading
            assert reading is not None
            figures[target_id] = self._read(
                target_id, reading.pids, reading.rss_bytes, reading.time
            )
        return figures

    @staticmethod
    def _stale(kept: _Kept, members: tuple[int, ...], rss_sum: int) -> bool:
        if kept.passes + 1 >= REFRESH_EVERY or kept.members != members:
            return True
        return abs(rss_sum - kept.rss_sum) > RSS_MOVE * max(kept.rss_sum, 1)

    def _read(
        self, target_id: str, members: tuple[int, ...], rss_sum: int, at: float
    ) -> dict[str, Any]:
        """The target's figures read now (kept, and the read's cost spent)."""
        started = time.thread_time()
        pss = largest = None
        for pid in members:
            rollup = read_rollup(pid, self.proc)
            self.reads += 1
            if rollup is None:
                continue
            pss = (pss or 0) + rollup.pss
            largest = max(largest or 0, rollup.rss)
        cost = time.thread_time() - started
        self._kept[target_id] = _Kept(members, rss_sum, cost)
        self._allowance -= cost
        return {
            "memory_pss_bytes": pss,
            "memory_rss_largest_bytes": largest,
            "memory_pss_read_at": at,
        }

    def forget(self, target_id: str) -> None:
        self._kept.pop(target_id, None)

    def status(self) -> Status:
        return Status()

    def close(self) -> None:
        self._kept.clear()
