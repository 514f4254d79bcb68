"""The rule of what a contributor hands out: per target, a mapping of its figures or
UNCHANGED (as the last mapping it gave that target); a waiting target's sample is a
copy of its last exactly while every figure stands, whatever objects carry them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.sampling.contributors import UNCHANGED, Figures, Unchanged
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from edgewatt.core.snapshot import Snapshot
from tests.conftest import kernel_cpu_seconds, settled, table_with, wait_for
from tests.test_sampler import RUNS_ON_A_LINE, Handed

Entry = Callable[[], "Mapping[str, Any] | Unchanged"]


class Scripted(Handed):
    """A contributor handing every target read what ``entry`` gives in that pass."""

    name = "counting by script"
    sets = ("network_counts",)
    counts = "any"

    def __init__(self, entry: Entry) -> None:
        self.entry = entry

    def contribute(self, states: Any) -> Figures:
        return {s.target.id: self.entry() for s in states if s.reading is not None}


@pytest.fixture
def waiting(spawn: Any) -> subprocess.Popen:
    """A child that waits on its stdin (RUNS_ON_A_LINE), settled."""
    child = spawn(RUNS_ON_A_LINE, stdin=subprocess.PIPE)
    settled(child.pid)
    return child


def _sampler(pid: int, contributor: Scripted) -> Sampler:
    parts = Parts(ProcessTrees(LinuxPlatform()), (contributor,))
    return Sampler(table_with(pid), interval=0.1, host_name="h", parts=parts)


def _copied(snapshot: Snapshot, built: Snapshot) -> bool:
    """Whether the snapshot's one target carries the figures of the pass ``built``."""
    (sample,) = snapshot.processes
    return snapshot.figures_since[sample.target_id] == built.sequence


def test_a_new_equal_mapping_each_pass_keeps_a_waiting_target_s_sample_copied(
    waiting: subprocess.Popen,
) -> None:
    # Equal figures are unchanged, whatever object carries them: the copy path holds.
    fresh = Scripted(lambda: {"network_counts": "steady"})
    sampler = _sampler(waiting.pid, fresh)
    try:
        sampler.sample_once()  # its first reading: no utilization yet
        built = sampler.sample_once()
        for _ in range(3):
            again = sampler.sample_once()
            assert _copied(again, built)
            assert again.processes[0].network_counts == "steady"
        fresh.entry = lambda: {"network_counts": "moved"}
        moved = sampler.sample_once()
        assert not _copied(moved, built) and moved.processes[0].network_counts == "moved"
    finally:
        sampler.close()


def test_a_mapping_edited_in_place_after_it_was_handed_out_leaves_no_stale_figure(
    waiting: subprocess.Popen,
) -> None:
    # The sampler compares with its own copy of what was given: an edit of the
    # contributor's mapping shows in the next sample, never a copy of the last one.
    mapping = {"network_counts": "first"}
    sampler = _sampler(waiting.pid, Scripted(lambda: mapping))
    try:
        sampler.sample_once()
        built = sampler.sample_once()
        assert _copied(sampler.sample_once(), built)
        mapping["network_counts"] = "second"
        edited = sampler.sample_once()
        assert not _copied(edited, built)
        assert edited.processes[0].network_counts == "second"
        assert built.processes[0].network_counts == "first"  # given before: as it was
    finally:
        sampler.close()


def test_unchanged_stands_for_the_last_figures_given_in_a_rebuilt_sample_too(
    waiting: subprocess.Popen,
) -> None:
    entries: list[Mapping[str, Any] | Unchanged] = [{"network_counts": "given"}]
    sampler = _sampler(waiting.pid, Scripted(lambda: entries.pop(0) if entries else UNCHANGED))
    try:
        sampler.sample_once()
        built = sampler.sample_once()
        copied = sampler.sample_once()
        assert _copied(copied, built) and copied.processes[0].network_counts == "given"
        assert waiting.stdin is not None
        ran_before = kernel_cpu_seconds(waiting.pid)
        waiting.stdin.write(b"run\n")  # it runs: its sample is built anew
        waiting.stdin.flush()
        wait_for(lambda: kernel_cpu_seconds(waiting.pid) >= ran_before + 0.04)
        ran = sampler.sample_once()
        assert not _copied(ran, built)
        (sample,) = ran.processes
        assert sample.cpu_s >= copied.processes[0].cpu_s + 0.04
        assert sample.network_counts == "given"
    finally:
        sampler.close()


def test_unchanged_for_a_target_never_given_figures_is_an_error_naming_the_contributor(
    waiting: subprocess.Popen,
) -> None:
    sampler = _sampler(waiting.pid, Scripted(lambda: UNCHANGED))
    (target,) = sampler.table.running()
    try:
        with pytest.raises(
            ValueError,
            match=f"^counting by script: UNCHANGED for target {target.id}, never given figures$",
        ):
            sampler.sample_once()
    finally:
        sampler.close()


class Asked(Scripted):
    """A contributor of gauges the regular passes keep fresh (``at_edges`` False),
    recording which targets each pass asked it for."""

    at_edges = False

    def __init__(self, entry: Entry) -> None:
        super().__init__(entry)
        self.asked: list[list[str]] = []

    def contribute(self, states: Any) -> Figures:
        self.asked.append([s.target.id for s in states])
        return super().contribute(states)


def test_an_edge_asks_a_contributor_not_at_edges_only_for_targets_it_never_counted(
    spawn: Any,
) -> None:
    first = spawn("import time; time.sleep(60)")
    counts = iter(range(1, 100))
    contributor = Asked(lambda: {"network_counts": next(counts)})
    sampler = _sampler(first.pid, contributor)
    table = sampler.table
    (old,) = table.running()
    sampler.sample_once()
    assert contributor.asked == [[old.id]]
    # Edges for it: not asked; its figures as the last pass gave them.
    edges = [sampler.sample_now(old.id) for _ in range(3)]
    assert contributor.asked == [[old.id]]
    assert [e.processes[0].network_counts for e in edges] == [1, 1, 1]
    # A target it never counted is asked at its first edge, then kept too.
    second = spawn("import time; time.sleep(60)")
    new = table.register(second.pid, {}, True, os.getuid()).target
    sampler.sample_now(new.id)
    sampler.sample_now(new.id)
    assert contributor.asked == [[old.id], [new.id]]
    # A regular pass asks for every target again.
    regular = sampler.sample_once()
    assert contributor.asked[-1] == [old.id, new.id]
    assert sorted(s.network_counts for s in regular.processes) == [3, 4]
    sampler.close()


def test_an_edge_asks_a_contributor_not_at_edges_again_for_a_target_whose_processes_are_gone(
    spawn: Any,
) -> None:
    """Figures read of processes now gone (`edgewatt run`'s fork before its exec, for a
    command shorter than a pass) are not kept into the exit sample an edge takes."""
    child = spawn("import time; time.sleep(60)")
    counts = iter(range(1, 100))
    contributor = Asked(lambda: {"network_counts": next(counts)})
    sampler = _sampler(child.pid, contributor)
    (target,) = sampler.table.running()
    sampler.sample_now(target.id)
    child.kill()
    child.wait()
    edge = sampler.sample_now(target.id)  # the edge that finds it gone
    assert contributor.asked == [[target.id], [target.id]]
    (ended,) = edge.exits
    assert ended.network_counts == 2 and ended.processes == 0
    sampler.close()
