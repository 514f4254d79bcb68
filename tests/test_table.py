"""The table of targets: registrations held and let go, phases started at a depth,
what it reads back (ages, samples, rates, summaries), a pass's samples recorded at
their instants, and the windows' edges settled while the trace holds them."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import types
from typing import Any

import pytest

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.facts import procfs
from edgewatt.core.facts.cgroup_names import CgroupName
from edgewatt.core.lookups import Lookups
from edgewatt.core.targets import Limits, Resolver, TargetTable
from edgewatt.core.targets.errors import Conflict, Forbidden, NotFound, TargetError, TooMany
from tests.conftest import ROOT
from tests.snapshots import process
from tests.test_targets import Clocks

UID = os.getuid()


def _table(**options: Any) -> tuple[TargetTable, Clocks]:
    clocks = Clocks()
    limits = Limits(max_targets=10, history_samples=100, exited_retention_s=60)
    resolver = Resolver(procfs.boot_time(), procfs.CLOCK_TICKS)
    table = TargetTable(
        limits, resolver, wall_clock=clocks.wall, monotonic_clock=clocks.monotonic, **options
    )
    return table, clocks


def _sample(target_id: str, clocks: Clocks, **figures: Any) -> Any:
    """A sample of ``target_id`` read now (dated by the wall clock, no monotonic
    instant of its own unless given)."""
    given = {"target_id": target_id, "time": clocks.wall(), **figures}
    return dataclasses.replace(process(0), **given)


def test_a_registration_holds_a_target_until_its_last_holder_lets_go() -> None:
    table, clocks = _table()
    clocks.t = 5.0
    held = table.register(os.getpid(), {"run": "a"}, True, UID)
    target = held.target
    assert (held.created, held.refused, target.holders, len(target.id)) == (True, [], 1, 12)
    assert (target.identity.registered_at, target.restored_at) == (1_700_000_005.0, None)
    again = table.register(os.getpid(), {"run": "b"}, False, UID)
    assert (again.target is target, again.created, target.holders) == (True, False, 2)
    assert [r["field"] for r in again.refused] == ["labels.run", "children"]
    clocks.t = 7.0
    assert table.delete(target.id, UID) is target and target.state == "running"
    assert table.delete(target.id, UID).state == "unregistered"
    assert (target.exited_at, target.exit_mode, target.holders) == (
        1_700_000_007.0,
        "last-sample",
        0,
    )
    assert table.persistent_state() == []
    with pytest.raises(Conflict) as refused:
        table.delete(target.id, UID)
    assert refused.value.error == "not registered"  # the API's answer names it so
    assert refused.value.detail == f"target {target.id} has no registration left"
    # Its process registered again is a new target.
    anew = table.register(os.getpid(), {}, True, UID)
    assert anew.created and anew.target is not target
    with pytest.raises(NotFound) as missing:
        table.get("nothere")
    assert (missing.value.error, missing.value.detail) == (
        "no such target",
        "no target with id 'nothere'",
    )
    with pytest.raises(Forbidden):
        table.delete(anew.target.id, 1000)
    # A reload's limits hold for the next registration.
    table.set_limits(Limits(max_targets=1, history_samples=10, exited_retention_s=60))
    with pytest.raises(TooMany) as full:
        table.register(os.getppid(), {}, True, UID)
    assert full.value.detail == "at most 1 may run at once"


def test_a_restored_registration_keeps_its_id_date_and_holders() -> None:
    table, clocks = _table()
    clocks.t = 30.0
    restored = table.register(
        os.getpid(), {}, True, UID, target_id="abc", registered_at=1_600_000_000.0, holders=3
    ).target
    assert (restored.id, restored.holders, restored.identity.registered_at) == (
        "abc", 3, 1_600_000_000.0
    )  # fmt: skip
    assert restored.restored_at == 1_700_000_030.0
    table.mark_exited("abc", 1_700_000_031.0)
    assert (restored.exit_mode, restored.exited_at) == ("last-sample", 1_700_000_031.0)
    none_held = table.register(os.getpid(), {}, True, UID, target_id="def", holders=0).target
    assert (none_held.holders, none_held.identity.registered_at) == (1, 1_700_000_030.0)


def test_phases_start_at_a_depth_within_the_bound() -> None:
    table, clocks = _table()
    target = table.register(os.getpid(), {}, True, UID).target
    clocks.t = 2.0
    epoch = table.start_phase(target.id, "epoch", UID)
    clocks.t = 3.0
    step = table.start_phase(target.id, "step", UID, None)  # inside every running one
    assert (epoch.depth, step.depth, step.started_at, step.started_monotonic) == (
        0, 1, 1_700_000_003.0, 3.0
    )  # fmt: skip
    assert table.start_phase(target.id, "deepest", UID, 15).depth == 15
    for depth in (16, -1):
        with pytest.raises(TargetError) as refused:
            table.start_phase(target.id, "too deep", UID, depth)
        assert (refused.value.error, refused.value.detail) == (
            "invalid phase depth", "a phase runs inside 0 to 15 others"
        )  # fmt: skip
        with pytest.raises(TargetError):
            table.end_phase(target.id, UID, depth)
    with pytest.raises(TargetError) as refused:
        table.start_phase(target.id, "", UID)
    assert refused.value.error == "invalid phase name"
    clocks.t = 10.0
    assert table.youngest_phase_age() == 7.0  # "step", started at 3 s
    clocks.step = 100.0  # the phases' ages are on the monotonic clock
    assert table.end_phase(target.id, UID, 1) is step and step.ended_at == 1_700_000_110.0
    assert table.youngest_phase_age() == 8.0  # "epoch" runs on
    # An exited target's phases are not running ones.
    other = table.register(os.getppid(), {}, True, UID).target
    clocks.t = 9.5
    table.start_phase(other.id, "late", UID)
    clocks.t = 10.0
    assert table.youngest_phase_age() == 0.5
    table.mark_exited(other.id, 1_700_000_110.0)
    assert table.youngest_phase_age() == 8.0
    table.end_phase(target.id, UID, 0)
    assert table.youngest_phase_age() is None and table.end_phase(target.id, UID) is None


def test_a_pass_records_each_sample_at_its_instant() -> None:
    table, clocks = _table()
    mine = table.register(os.getpid(), {}, True, UID).target
    other = table.register(os.getppid(), {}, True, UID).target
    assert table.sample_age(mine.id) is None
    clocks.t = 100.0
    table.start_phase(mine.id, "a", UID)
    table.start_phase(mine.id, "b", UID)
    table.start_phase(mine.id, "c", UID)
    table.record(
        [
            _sample("gone", clocks),  # unregistered while the pass ran: the others count
            _sample(mine.id, clocks, members=(7, 8)),  # read now
            _sample(other.id, clocks, time=clocks.wall() - 400.0),  # dated 400 s ago
        ]
    )
    exported = table.recent_phases(["gone", mine.id, other.id], 2)
    assert list(exported) == [mine.id]
    assert [p.name for p in exported[mine.id]] == ["b", "c"]  # the last 2 phases
    # A sample's age from its date is taken as at most 60 s.
    assert (mine.history.last.monotonic, other.history.last.monotonic) == (100.0, 40.0)  # type: ignore[union-attr]
    clocks.t = 102.5
    assert table.sample_age(mine.id) == 2.5
    # Dated after now (the wall clock stepped back since): no age; its own instant wins.
    table.record([_sample(mine.id, clocks, time=clocks.wall() + 5.0)])
    table.record([_sample(other.id, clocks, monotonic=101.25)])
    assert (mine.history.last.monotonic, other.history.last.monotonic) == (102.5, 101.25)  # type: ignore[union-attr]
    # A pass on demand for one target: the other gets no row, only the pass's view.
    clocks.t = 103.0
    table.record([_sample(mine.id, clocks), _sample(other.id, clocks, members=(9,))], {mine.id})
    assert (mine.history.count, other.history.count, other.members) == (3, 2, (9,))
    assert [d["id"] for d in table.describe_all(9)] == [other.id]
    assert [d["id"] for d in table.describe_all()] == [mine.id, other.id]
    table.mark_exited(other.id, 1_700_000_103.5)
    assert table.describe_all(9) == [] and table.describe(other.id)["state"] == "exited"
    table.record([_sample(other.id, clocks)])  # its figures ended at its exit
    assert other.history.count == 2


def test_what_the_table_reads_back_of_a_target() -> None:
    during = []

    class Context:
        def during(self, start: float, end: float | None) -> dict[str, Any]:
            during.append((start, end))
            return {"temperature_max_c": 40.0}

    table, clocks = _table(context=Context(), carbon=CarbonIntensity(400.0, "test"))
    target = table.register(os.getpid(), {}, True, UID).target
    for at, sent in ((10.0, 1000), (11.0, 1500), (12.0, 3000)):
        clocks.t = at
        table.record([_sample(target.id, clocks, network_transmit_bytes=sent)])
    assert [s["time"] for s in table.samples(target.id, 1_700_000_011.0)] == [1_700_000_012.0]
    assert len(table.samples(target.id)) == 3
    rate = table.network_rate(target.id)
    assert rate is not None and rate["transmit_bytes_per_s"] == 1000.0
    summary = table.summary(target.id, 2)
    assert summary["context"] == {"temperature_max_c": 40.0}
    # Its descendants as the parent links show them (the daemon says "lineage" where it
    # hears the kernel's events); its energy's carbon at the table's intensity.
    assert (summary["membership"], summary["carbon_intensity_g_per_kwh"]) == ("parent-links", 400.0)
    assert summary["energy_provenance"]["reason"] == summary["device_energy_provenance"]["reason"]
    table.mark_exited(target.id, 1_700_000_013.0, exit_mode="exact", rss_peak_bytes=4096,
                      end_reason="its cgroup was removed", exit_status=3)  # fmt: skip
    assert table.network_rate(target.id) is None  # not a running target's
    assert (target.exit_mode, target.history.memory.rss.high, target.end_reason) == (
        "exact", 4096, "its cgroup was removed"
    )  # fmt: skip
    assert target.exit_status == 3
    table.mark_exited(target.id, 1_700_000_020.0, exit_mode="last-sample")  # once only
    assert (target.exited_at, target.exit_mode) == (1_700_000_013.0, "exact")
    table.summary(target.id, 2)
    assert during == [
        (target.identity.registered_at, None),
        (target.identity.registered_at, 1_700_000_013.0),
    ]
    assert _table()[0].purge_exited(0.0) == 0
    assert table.purge_exited(1_700_000_073.0) == 0  # 60 s of retention
    assert table.purge_exited(1_700_000_073.5) == 1
    with pytest.raises(NotFound):
        table.summary(target.id, 2)


CHURN = """
import gc, os, tracemalloc
from tests.test_table import _table, UID
table, clocks = _table()

def churn(cycles):
    for _ in range(cycles):
        target = table.register(os.getpid(), {}, True, UID).target
        handle = target.handle
        table.start_phase(target.id, "round", UID)
        table.delete(target.id, UID)
        handle.close()  # the sampler's part, once the target left its list
        table.purge_exited(clocks.wall())  # beyond max_targets: the oldest go

churn(1000)  # the table full of exited targets, its dicts at their size
tracemalloc.start()
churn(100)  # those kept exited now traced too
gc.collect()  # what a cycle holds is freed when the collector runs: not counted
before = tracemalloc.get_traced_memory()[0]
churn(2000)
gc.collect()
print(tracemalloc.get_traced_memory()[0] - before)
"""


def test_targets_forgotten_leave_nothing_behind_without_a_power_source() -> None:
    # The edges to settle are tracked by target id; without a power source no pass
    # settles them, and the purge alone lets them go (CI saw a daemon's RSS grow by
    # 5 MiB over 5,000 register/exit cycles, 136 bytes a cycle of it here). Counted
    # in an interpreter of its own: a thread another test left would count here too.
    out = subprocess.run([sys.executable, "-c", CHURN], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    grown = int(out.stdout)
    assert grown < 2000 * 8, f"{grown} bytes more after 2,000 targets came and went"


def _settling(energy: Any) -> Any:
    """A Settlement (edges.py) whose every instant may settle: ``energy`` says which."""
    return types.SimpleNamespace(settled_energy=energy, settled_until=lambda: math.inf)


def test_an_exited_targets_last_edge_is_settled_while_the_trace_holds_it() -> None:
    trace: dict[float, float | None] = {}
    table, clocks = _table()
    table.settlement = _settling(trace.get)
    target = table.register(os.getpid(), {}, True, UID).target
    clocks.t = 10.0
    trace[10.0] = 100.0
    table.record([_sample(target.id, clocks, device_energy_j=100.5)])
    assert target.history.edges.start_j == 100.0
    clocks.t = 11.0
    table.start_phase(target.id, "window", UID)
    clocks.t = 12.0
    table.record([_sample(target.id, clocks, device_energy_j=121.0)])
    phase = target.history.phases[0]
    # The phase's first edge settled by a pass; it runs: its figures are not final.
    trace[12.0] = 120.0
    item = table.phase_summary(target.id, phase, 2)
    assert (item["device_energy_j"], item["final"]) == (0.0, True)
    # A running target's summary settles its last row's edge (not a pass: it runs).
    summary = table.summary(target.id, 2)
    assert (summary["device_energy_j"], summary["final"]) == (20.0, True)
    clocks.t = 13.0
    table.record([_sample(target.id, clocks, device_energy_j=131.0)])
    assert not table.final(target.id)  # the reading after 13 s not come yet
    trace[13.0] = 130.0
    assert table.final(target.id)  # asking settles it too
    clocks.t = 14.0
    table.record([_sample(target.id, clocks, device_energy_j=141.0)])
    table.mark_exited(target.id, 1_700_000_014.0)
    trace[14.0] = 140.0
    table.record([])  # the pass after the exit settles its last edge
    trace.clear()  # the trace keeps only its last readings
    summary = table.summary(target.id, 2)
    assert (summary["device_energy_j"], summary["final"]) == (40.0, True)
    assert summary["phases"][0]["device_energy_j"] == 20.0 and table.final(target.id)


def test_a_targets_rows_take_the_settled_energy_at_any_pass_and_when_read() -> None:
    trace: dict[float, float] = {}
    table, clocks = _table()
    table.settlement = _settling(trace.get)
    mine = table.register(os.getpid(), {}, True, UID).target
    other = table.register(os.getppid(), {}, True, UID).target

    def rows(target: Any) -> list[float | None]:
        return [r.device_energy_j for r in target.history.rows]

    clocks.t = 10.0  # the pass's edge: the power held past the last reading
    table.record([_sample(t.id, clocks, device_energy_j=100.5) for t in (mine, other)])
    assert rows(mine) == rows(other) == [100.5]
    trace[10.0] = 100.0  # the reading after it came
    clocks.t = 11.0
    table.record([_sample(other.id, clocks, device_energy_j=111.0)], {other.id})
    # A pass on demand for the other target settles mine too.
    assert (rows(mine), rows(other)) == ([100.0], [100.0, 111.0])
    clocks.t = 12.0
    table.record([_sample(mine.id, clocks, device_energy_j=121.0)], {mine.id})
    trace[12.0] = 120.0  # come after the last pass: a read settles what the trace has
    assert [r["device_energy_j"] for r in table.samples(mine.id)] == [100.0, 120.0]
    assert rows(mine) == [100.0, 120.0]


class Horizon:
    """A trace at 5 W from instant 0 whose readings have come up to ``until``: what
    the table asks of it, counted."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.asked = 0

    def settled_until(self) -> float | None:
        return self.until

    def settled_energy(self, t: float) -> float | None:
        self.asked += 1
        return 5.0 * t if t <= self.until else None


def test_windows_waiting_for_a_reading_cost_a_pass_nothing_until_it_comes() -> None:
    # A phase a call at 100 calls a second and a 1 Hz push source: a second's phases
    # wait for the next reading. Asking the trace about each at every pass cost the
    # pass and the phase's answer ~1 us a window (90 us at 90 phases); until the
    # horizon moves no answer can change.
    table, clocks = _table()
    trace = table.settlement = Horizon(until=9.0)
    target = table.register(os.getpid(), {}, True, UID).target
    asked = []
    for i in range(100):
        clocks.t = 10.0 + i / 100
        table.start_phase(target.id, f"call-{i}", UID)
        before = trace.asked
        table.record([_sample(target.id, clocks, device_energy_j=5.0 * clocks.t + 1.0)])
        asked.append(trace.asked - before)
    phases = list(target.history.phases)
    before = trace.asked
    ended = table.phase_summary(target.id, phases[-2], 2)
    assert (sum(asked[1:]), trace.asked - before, ended["final"]) == (0, 0, False)
    # The reading after them comes: the next pass settles every edge it can, once.
    trace.until = 20.0
    clocks.t = 11.0
    table.record([_sample(target.id, clocks, device_energy_j=56.0)])
    # Each phase's two edges, each of the 101 rows, the target's first edge: once.
    assert trace.asked - before == 2 * 100 + 101 + 1
    for phase in phases:
        found = table.phase_summary(target.id, phase, 2)
        assert found["final"] and found["device_energy_j"] == pytest.approx(0.05), phase.name


@pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as other users")
def test_a_users_registrations_count_in_her_persons_shares() -> None:
    # Uids 1000 and 1001 are one person's (core/persons.py): one running target each
    # at most, and 16 KiB of labels together.
    sleepers = [
        subprocess.Popen(["sleep", "60"], user=uid, group=uid) for uid in (1000, 1001, 1000)
    ]
    try:
        limits = Limits(
            max_targets=10, history_samples=10, exited_retention_s=60, max_targets_per_uid=1
        )
        resolver = Resolver(procfs.boot_time(), procfs.CLOCK_TICKS)
        table = TargetTable(limits, resolver, person=lambda uid: 1000 if uid == 1001 else uid)
        assert table.lookups is resolver.lookups  # the sampler's follows are bounded by them
        labels = {f"l{i}": "v" * 1000 for i in range(17)}  # 17,041 bytes
        with pytest.raises(TooMany) as refused:
            table.register(sleepers[0].pid, labels, False, 1000)
        assert refused.value.detail == (
            "at most 16384 bytes of labels per user (names and values): 17041 asked, 16384 left"
        )
        table.register(sleepers[0].pid, {}, False, 1000)
        with pytest.raises(TooMany) as refused:
            table.register(sleepers[1].pid, {}, False, 1001)
        assert refused.value.detail == "at most 1 per user may run at once"
        # Root's are the administrator's: not in any person's share.
        assert table.register(os.getpid(), labels, True, 0).created
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_a_cgroup_is_registered_and_a_process_in_it_joins_its_target() -> None:
    clocks = Clocks()
    inodes = {"/jobs/a": 4711, "/jobs/b": 4712}

    def locate(name: CgroupName, uid: int) -> Any:  # the cgroup tree, stood in
        return types.SimpleNamespace(path=name.name, inode=inodes[name.name])

    paths = {os.getpid(): "/jobs/a/worker", os.getppid(): "/elsewhere"}
    resolver = Resolver(
        procfs.boot_time(), procfs.CLOCK_TICKS, locate_cgroup=locate,
        cgroup_of=lambda pid, proc: paths[pid],
    )  # fmt: skip
    limits = Limits(max_targets=10, history_samples=100, exited_retention_s=60)
    table = TargetTable(limits, resolver, wall_clock=clocks.wall, monotonic_clock=clocks.monotonic)
    clocks.t = 5.0
    held = table.register_cgroup(CgroupName("cgroup", "/jobs/a"), {"run": "a"}, UID)
    target = held.target
    assert (held.created, held.refused, target.holders, len(target.id)) == (True, [], 1, 12)
    me = target.identity
    assert (me.pid, me.start_ticks, me.children, me.executable, target.cgroup) == (
        0, 4711, True, "/jobs/a", "/jobs/a"
    )  # fmt: skip
    assert (me.start_time, me.registered_at, target.restored_at) == (1_700_000_005.0,) * 2 + (None,)
    again = table.register_cgroup(CgroupName("cgroup", "/jobs/a"), {}, UID)
    assert (again.target is target, again.created, target.holders) == (True, False, 2)
    # A process below it joins it, with its labels; one asking for itself alone does not.
    joined = table.register(os.getpid(), {"seed": "1"}, True, UID)
    assert (joined.target is target, joined.created, joined.refused) == (True, False, [])
    assert (target.holders, target.labels) == (3, {"run": "a", "seed": "1"})
    alone = table.register(os.getpid(), {}, False, UID)
    assert alone.created and alone.target.kind == "process"
    outside = table.register(os.getppid(), {}, True, UID)  # in no registered cgroup
    assert outside.created and outside.target.kind == "process"
    # One restored from the state file keeps its id, date and holders.
    clocks.t = 9.0
    restored = table.register_cgroup(
        CgroupName("cgroup", "/jobs/b"), {}, UID, target_id="abc",
        registered_at=1_600_000_000.0, holders=3, limited=False,
    ).target  # fmt: skip
    assert (restored.id, restored.holders, restored.identity.registered_at) == (
        "abc", 3, 1_600_000_000.0
    )  # fmt: skip
    assert (restored.restored_at, restored.identity.start_time) == (1_700_000_009.0,) * 2
    table.mark_exited("abc", 1_700_000_009.5)
    anew = table.register_cgroup(CgroupName("cgroup", "/jobs/b"), {}, UID, holders=0).target
    assert (anew.holders, anew.restored_at, anew.identity.registered_at) == (
        1,
        None,
        1_700_000_009.0,
    )


def test_a_users_name_lookups_are_bounded_but_not_a_restores() -> None:
    looked = []

    def locate(name: CgroupName, uid: int) -> Any:
        looked.append(name.name)
        raise ValueError(f"no unit {name.name}")

    lookups = Lookups(clock=lambda: 100.0)  # no time passes: a failure is remembered 10 s
    resolver = Resolver(
        procfs.boot_time(), procfs.CLOCK_TICKS, locate_cgroup=locate, lookups=lookups
    )
    table = TargetTable(Limits(max_targets=10, history_samples=10, exited_retention_s=60), resolver)
    unit = CgroupName("unit", "web.service")
    for _ in range(2):
        with pytest.raises(TargetError) as refused:
            table.register_cgroup(unit, {}, 1000)
        assert refused.value.error == "no such cgroup"
    # A failure is remembered a moment: the second registration looked nothing up.
    assert looked == ["web.service"] and "(failed within the last" in refused.value.detail
    with pytest.raises(TargetError):
        table.register_cgroup(unit, {}, 1000, limited=False)  # the state file's: looked up
    assert looked == ["web.service", "web.service"]


def test_a_users_cgroup_and_a_process_joining_it_keep_to_her_label_bytes() -> None:
    def locate(name: CgroupName, uid: int) -> Any:  # a cgroup delegated to uid 1000
        return types.SimpleNamespace(path=name.name, inode=99, owner=lambda: 1000)

    handle = types.SimpleNamespace(  # her process, pinned
        pid=4242, start_ticks=7, executable="sleep", refuses=lambda uid: None,
        close=lambda: None, stat=lambda: None,
    )  # fmt: skip
    resolver = Resolver(
        procfs.boot_time(), procfs.CLOCK_TICKS, locate_cgroup=locate,
        open_process=lambda pid, proc, expect_start=None: handle,
        cgroup_of=lambda pid, proc: "/user/jobs/a/worker",
    )  # fmt: skip
    table = TargetTable(Limits(max_targets=10, history_samples=10, exited_retention_s=60), resolver)
    jobs = CgroupName("cgroup", "/user/jobs/a")
    with pytest.raises(TooMany) as refused:
        table.register_cgroup(jobs, {f"l{i}": "v" * 1000 for i in range(17)}, 1000)
    assert refused.value.detail.endswith("17041 asked, 16384 left")
    labels = {f"l{i}": "v" * 1000 for i in range(16)}  # 16,038 bytes: 346 left
    target = table.register_cgroup(jobs, labels, 1000).target
    joined = table.register(4242, {"x": "v" * 400}, True, 1000)
    assert joined.target is target and joined.refused == [
        {"field": "labels.x", "asked": "v" * 400, "kept": None,
         "why": "at most 16384 bytes of labels per user"}
    ]  # fmt: skip
