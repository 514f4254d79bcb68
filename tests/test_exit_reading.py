"""A target's end, merged (core/sampling/exits.py): its last reading with the kernel's
exit figures, and the exit mode its summary states."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgewatt.core.facts.departures import ExitFigures
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.sampling.exits import Ending, exit_reading, mark_exited

LAST = TreeReading(
    time=100.0,
    cpu_user_s=1.5,
    cpu_system_s=0.25,
    cpu_utilization=0.5,
    rss_bytes=4096,
    vms_bytes=8192,
    read_bytes=2000,
    write_bytes=3000,
    threads=2,
    open_fds=5,
    pids=(7, 8),
    idle_pids=frozenset({8}),
    cpu_mode_utilization=(0.375, 0.125),
    root_execs=0,
)
FIGURES = ExitFigures(
    cpu_user_s=1.75,
    cpu_system_s=0.5,
    read_bytes=1000,
    write_bytes=5000,
    time=100.5,
    rss_peak_bytes=65536,
    teardowns_counted=False,
    exit_status=-9,
)


@dataclass
class Tree:
    """What exit_reading reads of a target's sampler: its last reading, its exit figures."""

    last: TreeReading | None
    figures: ExitFigures | None = None
    asked: list[bool] = field(default_factory=list)

    def exit_figures(self) -> ExitFigures | None:
        self.asked.append(True)
        return self.figures


@dataclass
class CgroupTree(Tree):
    """A cgroup target's: its root's execs and exit status known apart."""

    root_execs: int = 0
    exit_status: int | None = None


def test_the_exit_mode_says_what_the_end_was_counted_from() -> None:
    assert Ending(1.0).mode(True) == "last-sample"
    assert Ending(1.0, figures=True).mode(False) == "last-sample"
    assert Ending(1.0, figures=True).mode(True) == "exact"
    assert Ending(1.0, figures=True, teardowns=False).mode(True) == "exit-records"
    assert Ending(1.0) == Ending(1.0, None, False, None, True, None)


def test_the_exit_reading_is_the_last_merged_with_the_kernels_figures() -> None:
    ending = Ending(101.0)
    got = exit_reading(Tree(LAST, FIGURES), ending, records=True, cgroup=False, name="t")
    # CPU: the larger total (2.25 s), split as the exit figures split it; disk bytes
    # each the larger; the time the root's exit; no utilization, no live member.
    assert got == dataclasses.replace(
        LAST,
        time=100.5,
        cpu_user_s=1.75,
        cpu_system_s=0.5,
        cpu_utilization=None,
        cpu_mode_utilization=None,
        read_bytes=2000,
        write_bytes=5000,
        pids=(),
        idle_pids=frozenset(),
    )
    assert ending == Ending(101.0, None, True, 65536, False, -9)
    # A last reading later than the root's exit, with I/O unknown, keeps them.
    last = dataclasses.replace(LAST, time=101.0, read_bytes=None, write_bytes=None)
    got = exit_reading(Tree(last, FIGURES), Ending(101.0), records=True, cgroup=False, name="t")
    assert got is not None
    assert (got.time, got.read_bytes, got.write_bytes) == (101.0, None, None)


def test_without_exit_figures_the_end_is_the_last_reading(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="edgewatt.core.sampling.exits")
    ending = Ending(101.0)
    tree = Tree(LAST, None)
    got = exit_reading(tree, ending, records=True, cgroup=False, name="t-1")
    assert got == dataclasses.replace(
        LAST, cpu_utilization=None, cpu_mode_utilization=None, pids=(), idle_pids=frozenset()
    )
    assert ending == Ending(101.0)  # no figures: its summary says last-sample
    assert [r.getMessage() for r in caplog.records] == [
        "target t-1: the kernel's exit records are incomplete (it started before the "
        "listener, or records were lost): its figures end at the last pass"
    ]
    # Exit records not read: none asked for, nothing to say.
    caplog.clear()
    tree = Tree(LAST, FIGURES)
    got = exit_reading(tree, Ending(101.0), records=False, cgroup=False, name="t-1")
    assert got is not None and got.cpu_user_s == 1.5 and tree.asked == []
    assert caplog.records == []


def test_an_emptied_cgroups_last_reading_is_its_exact_end(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="edgewatt.core.sampling.exits")
    # `edgewatt run`'s command exec'd at the end (a zombie's comm): its execs count.
    empty = dataclasses.replace(LAST, pids=())
    tree = CgroupTree(empty, None, root_execs=1, exit_status=3)
    ending = Ending(101.0, reason="emptied")
    got = exit_reading(tree, ending, records=True, cgroup=True, name="c")
    assert got == dataclasses.replace(
        empty, cpu_utilization=None, cpu_mode_utilization=None, idle_pids=frozenset(), root_execs=1
    )
    assert ending == Ending(101.0, "emptied", True, None, True, 3)
    assert caplog.records == []  # a cgroup's end needs no records
    # A cgroup removed with members still in it: its figures end at the last pass.
    ending = Ending(101.0, reason="removed")
    exit_reading(CgroupTree(LAST, None), ending, records=True, cgroup=True, name="c")
    assert ending == Ending(101.0, "removed", False, None, True, None)
    # A last reading's own execs count where the tree has none of its own.
    got = exit_reading(
        Tree(dataclasses.replace(LAST, root_execs=1)),
        Ending(1.0),
        records=False,
        cgroup=False,
        name="p",
    )
    assert got is not None and got.root_execs == 1


def test_a_target_that_exited_before_its_first_sample_has_no_exit_reading(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="edgewatt.core.sampling.exits")
    ending = Ending(101.0)
    assert exit_reading(Tree(None, FIGURES), ending, records=True, cgroup=False, name="t-2") is None
    assert ending == Ending(101.0)
    assert [r.getMessage() for r in caplog.records] == ["target t-2 exited before its first sample"]


@dataclass
class Table:
    marked: list[tuple[Any, ...]] = field(default_factory=list)

    def mark_exited(self, target_id: str, when: float, **figures: Any) -> None:
        self.marked.append((target_id, when, figures))


@pytest.mark.parametrize("network_exact", [True, False])
def test_ended_targets_are_marked_exited_with_their_mode(caplog: Any, network_exact: bool) -> None:
    caplog.set_level(logging.INFO, logger="edgewatt.core.sampling.exits")
    table = Table()
    ended = [
        ("a", Ending(5.0, None, True, 4096, True, 0, 8192)),
        ("b", Ending(6.0, "removed", False, None, True, None)),
    ]
    mark_exited(table, ended, network_exact)  # type: ignore[arg-type]
    assert table.marked == [
        ("a", 5.0, {"exit_mode": "exact" if network_exact else "last-sample",
                    "rss_peak_bytes": 4096, "end_reason": None, "exit_status": 0,
                    "largest_peak_bytes": 8192}),
        ("b", 6.0, {"exit_mode": "last-sample", "rss_peak_bytes": None,
                    "end_reason": "removed", "exit_status": None, "largest_peak_bytes": None}),
    ]  # fmt: skip
    # Only a target whose figures were final is told its TCP bytes end early.
    assert [r.getMessage() for r in caplog.records] == (
        []
        if network_exact
        else [
            "target a: a closed connection's final counts did not come (lost "
            "notifications): its TCP bytes end at the last pass that saw it"
        ]
    )
