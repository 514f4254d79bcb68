"""The order of a sampler pass's effects, with a real child process."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.sampling import tracked
from edgewatt.core.sampling.clock import Clock
from edgewatt.core.sampling.contributor_list import contributors
from edgewatt.core.sampling.contributors import UNCHANGED, Figures, Status
from edgewatt.core.sampling.exits import final_cpu
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.tracked import TargetState
from edgewatt.core.sampling.trees import ProcessTrees
from edgewatt.core.snapshot import Snapshot
from tests.conftest import kernel_cpu_seconds, settled, table_with, wait_for


def test_a_target_is_called_exited_only_once_the_exporters_have_dropped_it(
    spawn: Any,
) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    published: list[tuple[Snapshot, str]] = []
    sampler = Sampler(
        table,
        interval=0.1,
        host_name="h",
        on_pass=lambda s: published.append((s, table.get(target.id).state)),
    )
    sampler.sample_once()
    child.kill()
    child.wait()
    sampler.sample_once()
    (first, _), (second, state_while_publishing) = published
    assert [p.target_id for p in first.processes] == [target.id]
    assert second.processes == ()
    # A client that polls GET /v1/targets/{id} until "exited" and then scrapes must not
    # find the series still there: the table says so only after the exporters have it.
    assert state_while_publishing == "running"
    assert table.get(target.id).state == "exited"
    sampler.close()


def test_an_exporter_that_raises_still_lets_the_exit_be_recorded(spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()

    def broken(snapshot: Snapshot) -> None:
        raise RuntimeError("exporter bug")

    sampler = Sampler(table, interval=0.1, host_name="h", on_pass=broken)
    child.kill()
    child.wait()
    with pytest.raises(RuntimeError, match="exporter bug"):
        sampler.sample_once()
    assert table.get(target.id).state == "exited"
    sampler.close()


def test_a_pass_keeps_time_by_the_clock_it_is_given(spawn: Any) -> None:
    # The exit found at the clock's time and the exited target's 60 s retention run
    # out on it, without sleeping a second.
    now = [1_000_000.0]
    clock = Clock(time=lambda: now[0], monotonic=lambda: now[0])
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    parts = Parts(ProcessTrees(LinuxPlatform()), clock=clock)
    sampler = Sampler(table, interval=0.1, host_name="h", parts=parts)
    assert sampler.snapshot.time == 1_000_000.0
    assert sampler.sample_once().time == 1_000_000.0
    child.kill()
    child.wait()
    now[0] += 5.0
    snapshot = sampler.sample_once()
    assert snapshot.time == 1_000_005.0 and [s.target_id for s in snapshot.exits] == [target.id]
    assert table.get(target.id).exited_at == 1_000_005.0
    now[0] += 60.0  # the retention, to the second: kept
    sampler.sample_once()
    assert table.get(target.id).state == "exited"
    now[0] += 0.5
    sampler.sample_once()
    assert target.id not in {t["id"] for t in table.describe_all()}
    sampler.close()


class Threads:
    """A contributor of one figure (the threads its reading counted, in words, where
    network_counts goes); refuses (OSError) the passes named in ``refuse``."""

    name = "counting threads"

    def __init__(self, refuse: tuple[int, ...] = ()) -> None:
        self.calls: list[str] = []
        self.refuse = refuse
        self.passes = 0

    def begin(self) -> None:
        self.passes += 1
        self.calls.append("begin")

    def contribute(self, states: Any) -> Figures:
        self.calls.append("contribute")
        if self.passes in self.refuse:
            raise OSError("refused")
        read: list[TargetState] = list(states)
        return {
            s.target.id: {"network_counts": f"{s.reading.threads} threads"}
            for s in read
            if s.reading
        }

    def forget(self, target_id: str) -> None:
        self.calls.append(f"forget {target_id}")

    def status(self) -> Status:
        return Status(overflows={"threads": self.passes})

    def close(self) -> None:
        self.calls.append("close")


def test_a_contributor_given_at_construction_is_called_through_a_target_s_life(
    spawn: Any,
) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    threads = Threads(refuse=(2,))
    parts = Parts(ProcessTrees(LinuxPlatform()), (threads,))
    sampler = Sampler(table, interval=0.1, host_name="h", parts=parts)
    first = sampler.sample_once()
    (sample,) = first.processes
    assert sample.network_counts == f"{sample.threads} threads"  # its figure, in the sample
    assert first.stats.overflows["threads"] == 1 and first.stats.errors == 0
    # A refusal costs its figure in that pass (counted as an error), not the pass.
    second = sampler.sample_once()
    assert second.stats.errors == 1 and second.processes[0].network_counts is None
    child.kill()
    child.wait()
    third = sampler.sample_once()
    assert [s.target_id for s in third.exits] == [target.id]
    sampler.close()
    assert threads.calls == [
        *["begin", "contribute"] * 3,
        f"forget {target.id}",  # in the pass that found its exit
        "close",
    ]


@settings(max_examples=500, deadline=None)
@given(
    last=st.tuples(st.floats(0, 100), st.floats(0, 100)),
    final=st.tuples(st.floats(0, 100), st.floats(0, 100)),
)
def test_the_cpu_at_an_exit_is_the_larger_total_and_neither_mode_goes_back(
    last: tuple[float, float], final: tuple[float, float]
) -> None:
    # /proc's last reading and the kernel's exit figures split one runtime between user
    # and system differently: (0.20, 0.05) and (0.17, 0.08) are 0.25 s, not 0.28.
    user, system = final_cpu(last, final)
    assert user + system == pytest.approx(max(sum(last), sum(final)), abs=1e-9)
    assert user >= last[0] and system >= last[1] - 1e-9
    if final[0] >= last[0] and final[1] >= last[1]:  # the exit figures as they are
        assert (user, system) == pytest.approx(final)


def test_the_cpu_at_an_exit_split_differently_is_not_counted_twice() -> None:
    assert final_cpu((0.20, 0.05), (0.17, 0.08)) == pytest.approx((0.20, 0.05))
    assert final_cpu((0.20, 0.05), (0.17, 0.10)) == pytest.approx((0.20, 0.07))


def test_after_an_overrun_the_next_pass_waits_for_the_next_boundary() -> None:
    # A pass that ends after the next was due skips it: the next starts at the next
    # boundary of the cadence, not straight away to catch up (two passes back to back).
    now = [100.0]
    waits: list[float] = []

    def wait(event: Any, seconds: float) -> bool:
        waits.append(seconds)
        now[0] += seconds
        return event.is_set()

    clock = Clock(time=lambda: now[0], monotonic=lambda: now[0], wait=wait)
    durations = {2: 1.5, 4: 2.2}  # pass number: seconds it takes
    starts: list[float] = []
    published: list[Snapshot] = []
    stop = threading.Event()

    def on_pass(snapshot: Snapshot) -> None:
        published.append(snapshot)
        starts.append(now[0] - 100.0)
        now[0] += durations.get(len(starts), 0.0)
        if len(starts) == 5:
            stop.set()

    parts = Parts(ProcessTrees(LinuxPlatform()), clock=clock)
    sampler = Sampler(
        table_with(os.getpid()), interval=1.0, host_name="h", on_pass=on_pass, parts=parts
    )
    sampler.run(stop)
    # Pass 2 ends at 2.5 (2 missed): pass 3 at 3. Pass 4 ends at 6.2 (5 and 6 missed):
    # pass 5 at 7.
    assert starts == pytest.approx([0.0, 1.0, 3.0, 4.0, 7.0])
    assert waits == pytest.approx([1.0, 0.5, 1.0, 0.8, 1.0])
    assert [s.stats.overruns for s in published] == [0, 0, 1, 1, 2]
    assert sampler.closed


class Handed:
    """A contributor handing out one mapping for every target, the same object every
    pass until it is given another (equal figures: unchanged to the sampler)."""

    name = "handing out a figure"

    def __init__(self) -> None:
        self.mapping = {"network_counts": "first"}

    def begin(self) -> None:
        pass

    def contribute(self, states: Any) -> Figures:
        return {s.target.id: self.mapping for s in states if s.reading}

    def forget(self, target_id: str) -> None:
        pass

    def status(self) -> Status:
        return Status()

    def close(self) -> None:
        pass


def test_a_misspelt_figure_name_raises_on_every_python(spawn: Any, monkeypatch: Any) -> None:
    # Figures are set by name. With slots (3.10+) a misspelt one raises as it is set;
    # 3.8 and 3.9 check the names first (forced on here), else it would be a stray
    # attribute that no exporter reads.
    monkeypatch.setattr(tracked, "CHECK_NAMES", True, raising=False)
    child = spawn("import time; time.sleep(60)")
    handed = Handed()
    handed.mapping = {"network_counts": "kept", "network_count": "misspelt"}
    parts = Parts(ProcessTrees(LinuxPlatform()), (handed,))
    sampler = Sampler(table_with(child.pid), interval=0.1, host_name="h", parts=parts)
    try:
        with pytest.raises(AttributeError, match=r"^not a ProcessSample field: network_count$"):
            sampler.sample_once()
    finally:
        sampler.close()


class Declaring(Handed):
    """Handed, declaring the fields it sets and the targets it counts."""

    def __init__(self, sets: tuple[str, ...], counts: str = "any") -> None:
        super().__init__()
        self.sets, self.counts = sets, counts


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        (
            [Declaring(("network_count",))],
            "handing out a figure: 'network_count' is not a ProcessSample field",
        ),
        (
            [Declaring(("gpu_utilization",)), Declaring(("threads", "gpu_utilization"))],
            "'gpu_utilization' of process targets is set by two contributors",
        ),
        (  # cgroup traffic sets the network bytes of cgroup targets: both would
            [Declaring(("network_transmit_bytes",), "cgroup")],
            "'network_transmit_bytes' of cgroup targets is set by two contributors: "
            "reading cgroup traffic counters, handing out a figure",
        ),
        ([Declaring(("threads",), "processes")], "counts 'processes', not one of"),
    ],
)
def test_a_contributor_s_declared_fields_are_checked_when_the_sampler_is_built(
    declared: list[Declaring], problem: str
) -> None:
    parts = Parts(
        ProcessTrees(LinuxPlatform()),
        (*contributors(None, pss_proc="/proc", cgroups=True), *declared),
    )
    with pytest.raises(ValueError, match=re.escape(problem)):
        Sampler(table_with(os.getpid()), interval=0.1, host_name="h", parts=parts)


def test_every_contributor_declares_what_it_sets_and_they_agree(spawn: Any) -> None:
    # The daemon's whole list (TCP bytes of process targets and cgroup traffic set the
    # same fields, of different targets): built, and each one's figures in a pass are
    # among the fields it declares.
    child = spawn("import time; time.sleep(60)")
    trees = ProcessTrees(LinuxPlatform())
    listed = contributors(None, pss_proc="/proc", cgroups=True)
    sampler = Sampler(
        table_with(child.pid), interval=0.1, host_name="h", parts=Parts(trees, listed)
    )
    try:
        sampler.sample_once()
        states = list(sampler._states.values())
        for contributor in (trees, *listed):
            assert contributor.counts in ("process", "cgroup", "any")
            for figures in contributor.contribute(states).values():
                if figures is not UNCHANGED:
                    assert set(figures) <= set(contributor.sets), contributor.name
        assert [c.name for c in listed] == [
            "reading cgroup traffic counters",
            "reading smaps_rollup",
        ]
    finally:
        sampler.close()


# A child that waits on its stdin; each line makes it run 50 ms of CPU.
RUNS_ON_A_LINE = (
    "import sys, time\n"
    "for _ in sys.stdin:\n"
    "    t = time.process_time()\n"
    "    while time.process_time() - t < 0.05: pass\n"
)


def _figures(sample: Any) -> dict[str, Any]:
    figures = dataclasses.asdict(sample)
    for moving in ("time", "monotonic", "device_energy_j"):
        del figures[moving]
    return figures


def test_a_waiting_target_s_sample_is_its_last_dated_anew_until_a_figure_moves(
    spawn: Any,
) -> None:
    # A target that did not run gets a copy of its last sample (TargetState.sample):
    # each thing that can move its figures must still show in the next sample.
    child = spawn(RUNS_ON_A_LINE, stdin=subprocess.PIPE)
    settled(child.pid)
    table = table_with(child.pid)
    handed = Handed()
    sampler = Sampler(
        table, interval=0.1, host_name="h", parts=Parts(ProcessTrees(LinuxPlatform()), (handed,))
    )
    sampler.sample_once()  # its first reading: no utilization yet
    built = sampler.sample_once()
    first = built.processes[0]
    copied = sampler.sample_once()
    (second,) = copied.processes
    assert second is not first and second.time > first.time
    # ...and the snapshot says whose figures it carries (the renderer keeps its lines).
    target_id = first.target_id
    assert copied.figures_since[target_id] == built.figures_since[target_id] == built.sequence
    assert second.monotonic is not None and first.monotonic is not None
    assert second.monotonic > first.monotonic
    assert _figures(second) == _figures(first) and second.cpu_utilization == 0.0
    handed.mapping = {"network_counts": "second"}  # a contributor's figure moved
    moved = sampler.sample_once()
    (third,) = moved.processes
    assert third.network_counts == "second"
    assert moved.figures_since[target_id] == moved.sequence
    assert child.stdin is not None
    ran_before = kernel_cpu_seconds(child.pid)
    child.stdin.write(b"run\n")  # it runs 50 ms of CPU, then waits again
    child.stdin.flush()
    wait_for(lambda: kernel_cpu_seconds(child.pid) >= ran_before + 0.04)
    settled(child.pid)
    after_run = sampler.sample_once()
    (ran,) = after_run.processes
    assert after_run.figures_since[target_id] == after_run.sequence
    assert ran.cpu_s == pytest.approx(kernel_cpu_seconds(child.pid), abs=1e-9)
    assert ran.cpu_s >= third.cpu_s + 0.04 and ran.cpu_utilization > 0
    rested = sampler.sample_once()  # the first pass without a run since: utilization 0
    (waited,) = rested.processes
    assert rested.figures_since[target_id] == rested.sequence
    assert sampler.sample_once().figures_since[target_id] == rested.sequence
    assert waited.cpu_s == ran.cpu_s and waited.cpu_utilization == 0.0
    assert waited.network_counts == "second"
    sampler.close()
