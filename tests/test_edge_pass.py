"""What an edge pass (a pass on demand for one target) reads beside the target, in
process with a real child: what a regular pass reads for everyone it skips."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from edgewatt import client
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.sampling.passes import READ, RECORDED
from edgewatt.core.sampling.pss import ProportionalMemory
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from tests.conftest import table_with
from tests.test_sampler_power import JetsonBoard


class CountedHost(LinuxPlatform):
    """The Linux platform, counting its reads of the host's files: all three, and
    /proc/stat alone."""

    def __init__(self) -> None:
        super().__init__()
        self.host_reads = self.cpu_reads = 0

    def read_host(self) -> Any:
        self.host_reads += 1
        return super().read_host()

    def read_host_cpu(self) -> Any:
        self.cpu_reads += 1
        return super().read_host_cpu()


def sampling(
    spawn: Any, power: bool, contributors: tuple[Any, ...] = ()
) -> tuple[str, CountedHost, Sampler]:
    """A sleeping child's target id, the counted platform, and a sampler over it (with
    power: a JetsonBoard's, attribution sharing by the host's CPU; ``contributors``:
    the sampler's)."""
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    platform = CountedHost()
    sampler = Sampler(
        table,
        interval=0.2,
        host_name="h",
        power=PowerMeter([JetsonBoard(gpu_w=10.0)], max_gap_s=5.0) if power else None,
        attribution=Attribution(idle_w=5.0, window_s=600.0) if power else None,
        parts=Parts(ProcessTrees(platform), contributors),
    )
    return target.id, platform, sampler


def test_an_edge_pass_without_power_keeps_the_host_figures_of_the_last_pass(
    spawn: Any,
) -> None:
    target_id, platform, sampler = sampling(spawn, power=False)
    regular = sampler.sample_once()
    assert platform.host_reads == 1 and regular.host is not None
    edges = [sampler.sample_now(target_id) for _ in range(3)]
    # Each edge is a pass with the target's row, and the host as the last pass read it.
    assert [e.sequence for e in edges] == [2, 3, 4]
    assert all(e.host is regular.host for e in edges)
    assert (platform.host_reads, platform.cpu_reads) == (1, 0)
    # The next regular pass reads it anew (its CPU use since the pass before the edges).
    after = sampler.sample_once()
    assert platform.host_reads == 2 and after.host is not regular.host
    sampler.close()


def test_an_edge_pass_with_power_reads_only_the_host_cpu_that_attribution_shares_by(
    spawn: Any,
) -> None:
    target_id, platform, sampler = sampling(spawn, power=True)
    regular = sampler.sample_once()
    edge = sampler.sample_now(target_id)
    assert (platform.host_reads, platform.cpu_reads) == (1, 1)
    # The CPU read at the edge; memory and interfaces the regular pass's.
    assert edge.host is not None and regular.host is not None
    assert edge.host.cpu is not regular.host.cpu
    assert edge.host.memory is regular.host.memory
    assert edge.host.network is regular.host.network
    sampler.sample_once()
    assert (platform.host_reads, platform.cpu_reads) == (2, 1)
    sampler.close()


class CountedTrees(LinuxPlatform):
    """The Linux platform, counting each target's tree reads by its root pid."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[int, int] = {}

    def process_tree(self, handle: Any, **options: Any) -> Any:
        tree = super().process_tree(handle, **options)
        sample, pid = tree.sample, handle.pid

        def counted(*args: Any) -> Any:
            self.reads[pid] = self.reads.get(pid, 0) + 1
            return sample(*args)

        tree.sample = counted
        return tree


def test_an_edge_pass_reads_only_the_target_that_asked(spawn: Any) -> None:
    # Other users' idle targets beside the one at its edges: an edge reads it alone,
    # and hands the others' last samples on as they were.
    asker = spawn("import time; time.sleep(60)")
    others = [spawn("import time; time.sleep(60)") for _ in range(6)]
    table = table_with(asker.pid)
    for other in others:
        table.register(other.pid, {}, True, os.getuid())
    platform = CountedTrees()
    sampler = Sampler(
        table,
        interval=0.2,
        host_name="h",
        power=PowerMeter([JetsonBoard(gpu_w=10.0)], max_gap_s=5.0),
        attribution=Attribution(idle_w=5.0, window_s=600.0),
        parts=Parts(ProcessTrees(platform)),
    )
    regular = sampler.sample_once()
    assert platform.reads == {p.pid: 1 for p in [asker, *others]}
    asker_id = next(t.id for t in table.running() if t.pid == asker.pid)
    edges = [sampler.sample_now(asker_id) for _ in range(3)]
    assert platform.reads == {asker.pid: 4, **{p.pid: 1 for p in others}}
    for edge in edges:
        kept = [s for s in edge.processes if s.target_id != asker_id]
        before = [s for s in regular.processes if s.target_id != asker_id]
        assert len(kept) == len(before) == 6
        assert all(k is b for k, b in zip(kept, before))
        assert edge.figures_since.keys() == {s.target_id for s in regular.processes}
        assert [s.target_id for s in edge.processes] == [s.target_id for s in regular.processes]
    # The next regular pass reads every target again.
    sampler.sample_once()
    assert platform.reads == {asker.pid: 5, **{p.pid: 2 for p in others}}
    sampler.close()


def test_an_in_process_phase_edge_is_a_pass_for_its_own_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No power source: a phase's edges read the process, not the host's files (the
    # sampling thread's regular passes read those; reads in other threads not counted).
    (tmp_path / "sys").mkdir()
    monkeypatch.setenv("EDGEWATT_SYSFS_PATH", str(tmp_path / "sys"))
    monkeypatch.setenv("EDGEWATT_POWER_SOURCES", "ina3221")  # an empty tree: none found
    mine: list[str] = []
    read_host = LinuxPlatform.read_host

    def counted(self: LinuxPlatform) -> Any:
        if threading.current_thread() is threading.main_thread():
            mine.append("host")
        return read_host(self)

    monkeypatch.setattr(LinuxPlatform, "read_host", counted)
    registration = client.register(fallback="always")
    try:
        assert registration.mode == "local"
        registered = len(mine)
        for epoch in range(3):
            with registration.phase(f"epoch-{epoch}"):
                pass
        assert len(mine) == registered
        phases = registration.summary()["phases"]
        assert [p["name"] for p in phases] == ["epoch-0", "epoch-1", "epoch-2"]
    finally:
        registration.close()


def test_an_edge_pass_stops_where_its_answer_is_known_and_the_rest_follows(
    spawn: Any,
) -> None:
    # A phase's start is answered once the target's counters are read (READ), its end
    # once its row is written (RECORDED); the rest of the pass runs after the answer,
    # and the next pass only once it has.
    target_id, platform, sampler = sampling(spawn, power=True)
    sampler.sample_once()
    board = sampler.power.sources[0]  # type: ignore[union-attr]
    history = sampler.table.get(target_id).history
    rows, reads, sequence = len(history.rows), board.reads, sampler.snapshot.sequence
    rest = sampler.sample_edge(target_id, READ)
    # Read: the host's CPU (attribution shares by it); the power, the row and the
    # snapshot not yet.
    assert platform.cpu_reads == 1
    assert (len(history.rows), board.reads, sampler.snapshot.sequence) == (rows, reads, sequence)
    rest()
    assert (len(history.rows), board.reads) == (rows + 1, reads + 1)
    assert sampler.snapshot.sequence == sequence + 1
    assert sampler.snapshot.processes[0].target_id == target_id
    rest = sampler.sample_edge(target_id, RECORDED)
    # Recorded: the power read and the row written (the end's answer is the row's
    # phase figures); the snapshot and the exporters' part after the answer.
    assert (len(history.rows), board.reads) == (rows + 2, reads + 2)
    assert sampler.snapshot.sequence == sequence + 1
    rest()
    assert sampler.snapshot.sequence == sequence + 2
    # Whole, as before: a pass on demand after the rest is a pass of its own.
    assert sampler.sample_now(target_id).sequence == sequence + 3
    sampler.close()


def test_a_new_targets_first_edge_reads_its_pss_after_the_answer(spawn: Any) -> None:
    # A registration's answer is written at READ: its counters are read then, and the
    # new target's first smaps_rollup (5-12 ms for a process of many mappings) after
    # it, in the same pass, so the first row still holds the PSS.
    pss = ProportionalMemory()
    target_id, _, sampler = sampling(spawn, power=False, contributors=(pss,))
    rest = sampler.sample_edge(target_id, READ)
    assert pss.reads == 0
    rest()
    assert pss.reads == 1
    (row,) = sampler.table.get(target_id).history.rows
    (sample,) = sampler.snapshot.processes
    assert sample.memory_pss_bytes is not None and sample.memory_pss_bytes > 0
    assert row.memory_pss_bytes == sample.memory_pss_bytes
    sampler.close()
