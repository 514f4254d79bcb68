"""The target table: its phases (which sensor period a window is flagged against), the
summary's arithmetic on named rows, a target's persisted identity apart from what each
pass sees, and the bounds, each through its own module."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import subprocess
import sys
import tracemalloc
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.sampling.passes import READ, nothing
from edgewatt.core.snapshot import ProcessSample
from edgewatt.core.targets import (
    Conflict,
    Forbidden,
    History,
    Identity,
    Limits,
    NotFound,
    Target,
    TargetError,
    TargetTable,
    TooMany,
    TooManyLookups,
)
from edgewatt.core.targets.edges import EdgeEnergy
from edgewatt.core.targets.history import MAX_PHASE_NAME
from edgewatt.core.targets.row import _WHOLE, RowRing, SampleRow, row_of, sample_dict
from edgewatt.core.targets.summary import span
from edgewatt.core.uids import alone
from edgewatt.exporter.unix_http import Request
from tests.conftest import table_with
from tests.snapshots import process


class Clocks:
    """The table's two clocks: ``t`` seconds of monotonic time; the wall clock the
    same plus an offset that a step (NTP's, on a board without an RTC) moves."""

    def __init__(self) -> None:
        self.t = 0.0
        self.step = 0.0

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t + self.step

    def monotonic(self) -> float:
        return self.t


def _table(pid: int) -> tuple[TargetTable, Clocks]:
    clocks = Clocks()
    return table_with(pid, wall_clock=clocks.wall, monotonic_clock=clocks.monotonic), clocks


def _pass(
    table: TargetTable, clocks: Clocks, period_s: float, at: float, only: set[str] | None = None
) -> dict[str, tuple[tuple[str, bool, float | None, float], ...]]:
    """One pass as the sampler records it at ``at`` s (monotonic): the sensors' period
    over the interval it ends, then every target's sample, dated by the wall clock
    (1 W of device power, 0.5 W attributed, 0.25 cores: energy and CPU are time)."""
    clocks.t = at
    table.energy_period_s = period_s
    samples = [
        dataclasses.replace(
            process(0),
            target_id=t.id,
            time=clocks.wall(),
            device_energy_j=at,
            energy_j=0.5 * at,
            cpu_user_s=0.25 * at,
            cpu_system_s=0.0,
        )
        for t in table.running()
    ]
    table.record(samples, only)
    return table.recent_phases([s.target_id for s in samples], 10)


def _flags(table: TargetTable, target_id: str) -> list[bool]:
    summary = table.summary(target_id, 2)
    return [p["shorter_than_sensor_period"] for p in summary["phases"]]


def test_a_window_is_flagged_against_the_period_it_was_read_at_not_todays() -> None:
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    _pass(table, clocks, 0.2, 0.0)
    # A 150 ms window read at 5 Hz (its window rate refused): shorter than its period.
    table.start_phase(target.id, "refused", uid)
    _pass(table, clocks, 0.2, 1.0, {target.id})
    table.end_phase(target.id, uid)
    _pass(table, clocks, 0.2, 1.15, {target.id})
    # A 150 ms window read at 200 Hz: resolved.
    table.start_phase(target.id, "fine", uid)
    _pass(table, clocks, 0.005, 2.0, {target.id})
    table.end_phase(target.id, uid)
    _pass(table, clocks, 0.005, 2.15, {target.id})
    assert _flags(table, target.id) == [True, False]
    # Later passes at other rates change neither: each window keeps its own period.
    _pass(table, clocks, 0.2, 3.0)
    assert _flags(table, target.id) == [True, False]
    _pass(table, clocks, 0.005, 4.0)
    assert _flags(table, target.id) == [True, False]


def test_a_coarse_pass_for_another_target_inside_a_window_counts() -> None:
    # Between this window's edges a pass on demand for another target read at 5 Hz
    # (this one got no row from it): the window was not read at 200 Hz throughout.
    table, clocks = _table(os.getpid())
    table.register(os.getppid(), {}, False, os.getuid())
    mine, other = (t.id for t in table.running())
    uid = os.getuid()
    _pass(table, clocks, 0.005, 0.0)
    table.start_phase(mine, "window", uid)
    _pass(table, clocks, 0.005, 1.0, {mine})
    _pass(table, clocks, 0.2, 1.05, {other})
    table.end_phase(mine, uid)
    _pass(table, clocks, 0.005, 1.15, {mine})
    assert _flags(table, mine) == [True]
    summary = table.summary(mine, 2)
    assert summary["phases"][0]["duration_s"] == 0.15


def test_a_window_read_at_two_rates_is_flagged_against_the_coarser() -> None:
    """A 150 ms window whose first interval was read at 5 Hz and its last at 200 Hz:
    not resolved throughout, whichever rate came last. The same for the whole history."""
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    _pass(table, clocks, 0.005, 0.0)
    table.start_phase(target.id, "window", uid)
    _pass(table, clocks, 0.2, 1.0, {target.id})
    _pass(table, clocks, 0.2, 1.05, {target.id})
    _pass(table, clocks, 0.005, 1.1, {target.id})
    table.end_phase(target.id, uid)
    _pass(table, clocks, 0.005, 1.15, {target.id})
    summary = table.summary(target.id, 2)
    assert [(p["duration_s"], p["shorter_than_sensor_period"]) for p in summary["phases"]] == [
        (0.15, True)
    ]
    # A whole history of 150 ms: its first interval read at 5 Hz.
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    for period_s, at in [(0.005, 0.0), (0.2, 0.05), (0.005, 0.1), (0.005, 0.15)]:
        _pass(table, clocks, period_s, at)
    summary = table.summary(target.id, 2)
    assert (summary["duration_s"], summary["shorter_than_sensor_period"]) == (0.15, True)


def test_a_fresh_read_ages_the_latest_sample_on_the_monotonic_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GET /v1/targets/{id}?fresh=1 (a monitor's read) samples anew only where the
    latest sample is older than min_interval: by the monotonic clock, so a wall-clock
    step neither keeps a stale sample for the hour it went back nor forces passes for
    the hour it went forward."""
    from edgewatt.exporter import api

    table, clocks = _table(os.getpid())
    (target,) = table.running()
    # Where the handler may read the wall clock, it reads this table's.
    monkeypatch.setattr(api, "time", types.SimpleNamespace(time=clocks.wall))
    asked = []
    context = api.ApiContext(
        table=table, logical_cpus=2, health=dict, host=dict, sample_units={},
        sample_now=asked.append, min_interval=0.5,
    )  # fmt: skip

    def read() -> None:
        request = Request("GET", f"/v1/targets/{target.id}", "fresh=1", 0, 0, lambda: b"")
        request.params = {"id": target.id}
        api.get_target(context, request)

    def sampled() -> bool:
        read()
        return bool(asked and asked.pop() == target.id)

    assert sampled()  # no sample yet
    _pass(table, clocks, 0.02, 10.0)
    clocks.t = 10.2
    assert not sampled()  # 0.2 s old
    clocks.step = -3600.0  # back an hour
    clocks.t = 11.0
    assert sampled()  # 1 s old, though dated an hour ahead of the wall clock
    _pass(table, clocks, 0.02, 11.0)
    clocks.step = 3600.0  # forward an hour
    clocks.t = 11.1
    assert not sampled()  # 0.1 s old, though dated two hours back


def test_a_registration_and_a_phases_start_are_answered_once_the_counters_are_read() -> None:
    """The answer to a new registration and to a phase's start holds nothing of the
    pass: each runs its pass to READ (the counters at its instant) and writes the
    rest after the answer (Response.after); a joining registration runs none."""
    from edgewatt.exporter import api

    table = table_with(os.getpid())
    (mine,) = table.running()
    edges: list[tuple[str, str]] = []
    rests: list[str] = []

    def sample_edge(target_id: str, until: str) -> Any:
        edges.append((target_id, until))
        return lambda: rests.append(target_id)

    context = api.ApiContext(
        table=table, logical_cpus=2, health=dict, host=dict, sample_units={},
        sample_now=lambda target_id: pytest.fail("a whole pass before the answer"),
        sample_edge=sample_edge,
    )  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        body = json.dumps({"pid": child.pid, "children": False}).encode()
        request = Request("POST", "/v1/targets", "", os.getpid(), os.getuid(), lambda: body)
        response = api.register_target(context, request)
        assert response.status == 201 and response.after is not None
        target_id = response.body["id"]
        assert (edges, rests) == ([(target_id, READ)], [])
        response.after()
        assert rests == [target_id]
        again = api.register_target(context, request)  # joins: no pass
        assert (again.status, again.after, len(edges)) == (200, nothing, 1)
        start = Request("POST", "", "", os.getpid(), os.getuid(), lambda: b'{"name": "step"}')
        start.params = {"id": mine.id}
        response = api.start_phase(context, start)
        assert response.status == 201 and edges[-1] == (mine.id, READ)
        assert response.after is not None
    finally:
        child.kill()
        child.wait()


def test_the_holders_of_a_process_are_its_own_target_and_its_ancestors_with_children() -> None:
    table = table_with(os.getpid())  # with its children
    (mine,) = table.running()
    read: list[str] = []

    def holders(pid: int, ancestors: list[int]) -> list[str]:
        def parents() -> list[int]:
            read.append("ancestors")
            return ancestors

        def cgroup() -> None:
            read.append("cgroup")

        return table.holders_of(pid, parents, cgroup)

    parent = table.register(os.getppid(), {}, False, os.getuid()).target  # alone
    assert holders(os.getpid(), [os.getppid(), 1]) == [mine.id]
    assert holders(os.getppid(), [1]) == [parent.id]
    assert holders(4_000_000, [os.getpid(), os.getppid()]) == [mine.id]
    assert holders(4_000_000, [os.getppid()]) == []
    assert read == ["ancestors"] * 4  # no cgroup target: no cgroup read
    table.delete(mine.id, os.getuid())
    assert holders(4_000_000, [os.getpid()]) == []  # ended: holds none
    assert read == ["ancestors"] * 4  # none with its children left: no ancestors read


def test_a_pass_read_before_a_phase_began_neither_opens_nor_ends_it() -> None:
    """A registration or a phase's start is answered once its counters are read, its
    row written after: a phase asked meanwhile (another connection, another thread)
    opens at the first row read after it began, not at that one, and ends at the
    first read after its end (CI read a 0.200 s phase as 0.210 s)."""
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    _pass(table, clocks, 0.2, 10.0)
    clocks.t = 11.0
    table.start_phase(target.id, "asked-during-a-pass", uid)
    _pass(table, clocks, 0.2, 10.5)  # read at 10.5, written once the phase began
    _pass(table, clocks, 0.2, 11.2)  # its own edge: the first read after it began
    _pass(table, clocks, 0.2, 11.6)
    clocks.t = 12.0
    table.end_phase(target.id, uid)
    _pass(table, clocks, 0.2, 11.8)  # read before it ended: inside it, not its end
    _pass(table, clocks, 0.2, 12.1)  # the end's own edge
    (phase,) = table.summary(target.id, 2)["phases"]
    assert phase["duration_s"] == pytest.approx(0.9)
    assert phase["energy_j"] == pytest.approx(0.5 * 0.9)  # 0.5 W attributed
    assert phase["cpu_avg_cores"] == pytest.approx(0.25)


def test_a_wall_clock_step_moves_no_duration() -> None:
    """Stepped back one hour inside a ~3 s phase and forward again inside a ~5 s one
    (NTP's first sync on a Jetson without an RTC battery): durations, averages and
    the exported phases keep the monotonic clock's figures; the edges keep the wall
    time users see."""
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    _pass(table, clocks, 0.2, 10.0)
    table.start_phase(target.id, "back", uid)
    _pass(table, clocks, 0.2, 11.0)
    clocks.step = -3600.0
    _pass(table, clocks, 0.2, 12.0)
    clocks.t = 14.0
    table.end_phase(target.id, uid)
    table.start_phase(target.id, "forward", uid)
    _pass(table, clocks, 0.2, 14.0)
    clocks.step = 0.0
    _pass(table, clocks, 0.2, 17.0)
    clocks.t = 19.0
    table.end_phase(target.id, uid)
    exported = _pass(table, clocks, 0.2, 19.0)[target.id]
    assert [(name, energy, duration) for name, _, energy, duration, _ in exported] == [
        ("back", 1.5, 3.0), ("forward", 2.5, 5.0)
    ]  # fmt: skip
    summary = table.summary(target.id, 2)
    back, forward = summary["phases"]
    assert (back["duration_s"], forward["duration_s"]) == (3.0, 5.0)
    for phase in (back, forward):
        assert phase["power_avg_w"] == 0.5 and phase["cpu_avg_cores"] == 0.25, phase
        assert phase["energy_j"] == 0.5 * phase["duration_s"]
    assert (back["started_at"], back["ended_at"]) == (1_700_000_010.0, 1_699_996_414.0)
    assert forward["ended_at"] == 1_700_000_019.0
    assert summary["duration_s"] == 9.0 and summary["power_avg_w"] == 0.5
    assert table.youngest_phase_age() is None  # both ended
    table.start_phase(target.id, "live", uid)
    clocks.step, clocks.t = -3600.0, 21.0
    assert table.youngest_phase_age() == 2.0


# -- the package's seams ---------------------------------------------------------------


def _row(at: float, **figures: float | int | None) -> SampleRow:
    """A history row read at ``at`` s (monotonic), from tests/snapshots.py's sample."""
    return row_of(dataclasses.replace(process(0), time=1_700_000_000.0 + at, **figures), at)


def _history_of(rows: list[SampleRow], capacity: int) -> History:
    history = History(capacity)
    for row in rows:
        history.add(row)
    return history


def test_a_full_history_keeps_its_last_rows_exactly_in_202_bytes_a_row() -> None:
    # Every row's figures are new objects, as a target that runs makes them: the ring
    # must hold their values, not the objects (200 targets' full rings).
    rows = [
        _row(
            i * 0.2 + 0.1,
            cpu_user_s=i / 3,
            cpu_utilization=None if i % 7 == 0 else i / 1000,
            memory_rss_bytes=10_000_000 + i * 4096,
            disk_read_bytes=None if i % 2 else 2**52 + i,  # a byte count stays an int
            network_transmit_bytes=i,
            energy_j=i * 1.5,
            memory_pss_bytes=None,
        )
        for i in range(1000)
    ]
    history = _history_of(rows, 300)
    kept = list(history.rows)
    assert kept == rows[-300:] and history.rows[-1] == rows[-1] and history.rows[0] == rows[700]
    assert len(history.rows) == 300 and history.count == 1000
    for got, want in zip(kept, rows[-300:]):
        assert [type(v) for v in got] == [type(v) for v in want]
    with pytest.raises(IndexError):
        history.rows[300]
    assert list(_history_of(rows[:5], 300).rows) == rows[:5]
    assert list(_history_of(rows[:5], 0).rows) == []

    # tracemalloc counts every thread's allocations: threads an earlier test left
    # running in this process (CI measured 193 B once, 175 B alone) add to one
    # reading, so the least of three is the history's own. The rows are made before
    # it: a row freed inside it may stay allocated in the interpreter's caches of
    # freed objects, counted or not as the tests before (or a gc.collect()) left
    # them; that the history keeps none of them is read from their reference counts.
    readings = []
    for _ in range(3):
        made = [_row(i + 0.5, cpu_user_s=i / 3, energy_j=i * 1.5) for i in range(300)]
        references = [sys.getrefcount(row) for row in made]
        tracemalloc.start(16)
        try:
            before = tracemalloc.get_traced_memory()[0]
            held = _history_of(made, 300)
            readings.append((tracemalloc.get_traced_memory()[0] - before) / 300)
        finally:
            tracemalloc.stop()
        assert len(held.rows) == 300
        # Only the first and the last rows are held (History.first, .last), once each.
        now = [sys.getrefcount(row) for row in made]
        assert [b - a for a, b in zip(references, now)] == [1] + [0] * 298 + [1]
        del held
    # 192 B alone (23 figures a row), 199 B in a whole run of the suite.
    assert min(readings) <= 202, f"{min(readings):.0f} B a row ({readings})"


def _read_back(row: SampleRow) -> SampleRow:
    """What a ring gives back for ``row``: None (or NaN) as None, counts and bytes as
    ints, the other figures as floats."""
    return SampleRow(
        *(
            None if v is None or v != v else int(v) if whole else float(v)
            for v, whole in zip(row, _WHOLE)
        )
    )


def _check_ring(rows: list[SampleRow], capacity: int) -> RowRing:
    """``rows`` appended one by one, the ring holding the last ``capacity`` of them
    exactly after each append (values and types)."""
    ring = RowRing(capacity)
    for n, row in enumerate(rows, 1):
        ring.append(row)
        want = [_read_back(r) for r in rows[max(0, n - capacity) : n]] if capacity else []
        got = list(ring)
        assert got == want and len(ring) == len(want)
        for a, b in zip(got, want):
            assert [type(v) for v in a] == [type(v) for v in b]
        if want:
            assert ring[-1] == want[-1] and ring[0] == want[0] and ring[-len(want)] == want[0]
        for bad in (len(want), -len(want) - 1):
            with pytest.raises(IndexError):
                ring[bad]
    return ring


def test_a_ring_keeps_repeated_figures_once_and_reads_every_row_back_across_wraps() -> None:
    # Runs of rows repeating the same figures (None among them), of lengths 1 to 4,
    # the times and the device's energy new in every row (as on a board with power
    # sensors), through several wraps: a figure row shared by kept rows must outlive
    # the dropped ones, and a new one must take no kept row's place.
    runs = [4, 1, 1, 3, 1, 2, 4, 4, 1, 1, 1, 2, 3, 1, 4, 1]
    rows = []
    for run, length in enumerate(runs * 3):
        for _ in range(length):
            i = len(rows)
            rows.append(
                _row(
                    i * 0.2,
                    cpu_user_s=run / 3,
                    memory_rss_bytes=10_000_000 + run,
                    open_fds=None if run % 2 else run,
                    device_energy_j=i * 2.5,
                )
            )
    alternating = [rows[i // 2 * 2] for i in range(40)]  # new, repeat, new, repeat...
    alternating = [r._replace(time=1.0 + i, monotonic=float(i)) for i, r in enumerate(alternating)]
    for capacity in (0, 1, 2, 3, 4, 5, 7, 16):
        _check_ring(rows, capacity)
        _check_ring(alternating, capacity)
    # -0.0 after 0.0 compares equal, so it is a repeat: it reads back as 0.0, equal.
    zero = _row(1.0, cpu_utilization=0.0)
    assert list(_check_ring([zero, zero._replace(cpu_utilization=-0.0)], 2)) == [zero, zero]


_FIGURE = st.one_of(st.none(), st.floats())
_COUNT = st.one_of(st.none(), st.integers(-(2**53), 2**53))


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(0, 7),
    pool=st.lists(
        st.tuples(*(_COUNT if whole else _FIGURE for whole in _WHOLE[1:-1])),
        min_size=1,
        max_size=4,
    ),
    picks=st.lists(st.tuples(st.integers(0, 3), _FIGURE, _FIGURE, _FIGURE), max_size=30),
)
def test_any_rows_read_back_as_the_last_ones_appended(
    capacity: int,
    pool: list[tuple[float | int | None, ...]],
    picks: list[tuple[int, float | None, float | None, float | None]],
) -> None:
    # Rows repeating or changing their figures at random (the same pick twice in a row
    # is a repeat), each with its own times and device energy, None, NaN, infinities and
    # ints up to 2**53 among them, through a ring of any capacity.
    device = SampleRow._fields.index("device_energy_j") - 1
    rows = []
    for pick, time, energy, monotonic in picks:
        figures = list(pool[pick % len(pool)])
        figures[device] = energy
        rows.append(SampleRow(time, *figures, monotonic))
    _check_ring(rows, capacity)


def test_a_full_ring_of_repeated_figures_costs_its_times_a_row() -> None:
    # An idle target: every figure (None among them) the same at every pass, the
    # times and the device's energy (a board's sensors) new. 28 B a row kept (the two
    # times, the energy, the figures' slot) and the figures once: 152 B a row before.
    rows = [_row(i + 0.5, device_energy_j=i * 2.5) for i in range(1000)]
    # What the ring's own code allocated: another test's thread left running in this
    # process allocates meanwhile too (CI counted 38 B a row once so).
    where = [tracemalloc.Filter(True, sys.modules[RowRing.__module__].__file__ or "")]
    tracemalloc.start(16)
    try:
        before = tracemalloc.take_snapshot().filter_traces(where)
        ring = RowRing(300)
        for row in rows:
            ring.append(row)
        # A full collection empties CPython's free lists: the tuples of figures the
        # appends compared and let go are the interpreter's to reuse, not the ring's.
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(where)
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_row = grown / 300
    assert list(ring) == rows[-300:]
    assert 20 <= per_row <= 32, f"{per_row:.1f} B a row"


def _busy_sample(target_id: str, at: float) -> ProcessSample:
    """A busy target's sample at ``at`` s, as the sampler makes one: every figure a new
    object (a float; an int above the interpreter's cached ones, bytes and switches
    past 2**30, 32 B each), so a row held past the ring holds them all; the device's
    energy from a 5 W board."""
    whole = 2**40 + int(at * 1000)
    return dataclasses.replace(
        process(0),
        target_id=target_id,
        time=1_700_000_000.0 + at,
        monotonic=at,
        cpu_user_s=at * 0.25,
        cpu_system_s=at * 0.125,
        cpu_utilization=at / 1e4,
        memory_rss_bytes=whole + 1,
        memory_virtual_bytes=whole + 2,
        memory_pss_bytes=whole + 3,
        memory_rss_largest_bytes=whole + 4,
        memory_pss_read_at=1_700_000_000.0 + at,
        disk_read_bytes=whole + 5,
        disk_write_bytes=whole + 6,
        network_transmit_bytes=whole + 7,
        network_receive_bytes=whole + 8,
        threads=1000 + int(at),
        open_fds=2000 + int(at),
        processes=3000 + int(at),
        power_w=at * 1.5,
        energy_j=at * 0.5,
        device_energy_j=at * 5.0,
        context_switches_voluntary=whole + 9,
        context_switches_involuntary=whole + 10,
        page_faults_minor=whole + 11,
    )


def test_a_kept_phase_holds_at_most_its_stated_bytes() -> None:
    # What a phase a user starts and ends costs the daemon once kept: its record, its
    # name (128 bytes, the longest), the rows at its two edges (their figures, which the
    # ring no longer holds) and its settled energy. The API's path in process: the
    # table's start and end, each followed by the pass on demand the API takes, with a
    # scheduled pass between phases; the history's ring is full before, so only the
    # phases grow. Counted: what this test's own calls allocated and still hold (every
    # allocation with this file in its traceback), never another thread's.
    table, clocks = _table(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    # The trace's integral up to an instant once a reading after it came: a new float.
    table.settlement = types.SimpleNamespace(
        settled_energy=lambda at: at * 5.0 - 0.25 if at < clocks.t else None,
        settled_until=lambda: math.inf,
    )

    def take(only: set[str] | None = None) -> None:
        clocks.t += 0.1
        table.record([_busy_sample(target.id, clocks.t)], only, (5.0, 5.0))

    for _ in range(2 * 100):  # table_with's ring: 100 rows, full
        take()
    phases = 300
    where = [tracemalloc.Filter(True, __file__, all_frames=True)]
    tracemalloc.start(16)  # deep enough to reach this test's frame from the table's
    try:
        before = tracemalloc.take_snapshot().filter_traces(where)
        for i in range(phases):
            table.start_phase(target.id, f"{i:08d}".ljust(MAX_PHASE_NAME, "x"), uid)
            take({target.id})
            table.end_phase(target.id, uid)
            take({target.id})
            take()
        gc.collect()  # CPython's free lists emptied: what is held is the phases'
        after = tracemalloc.take_snapshot().filter_traces(where)
    finally:
        tracemalloc.stop()
    kept = target.history.phases
    assert len(kept) == phases and all(p.final and len(p.name) == MAX_PHASE_NAME for p in kept)
    assert len({id(p.first) for p in kept} | {id(p.last) for p in kept}) == 2 * phases
    per_phase = sum(s.size_diff for s in after.compare_to(before, "filename")) / phases
    # 2,626 B measured; docs/reference.md ("Shares per person") states 2,700 B at most.
    assert 2400 <= per_phase <= 2700, f"{per_phase:.0f} B a phase"


def test_a_span_is_what_was_consumed_between_two_named_rows() -> None:
    first = _row(10.0, cpu_user_s=1.0, energy_j=4.0, device_energy_j=100.0, disk_read_bytes=4096)
    last = _row(
        14.0,
        cpu_user_s=3.0,
        cpu_system_s=1.25,
        energy_j=12.0,
        device_energy_j=140.0,
        disk_read_bytes=12288,
        network_transmit_bytes=1500,
    )
    # Each figure by its name; the monotonic time is the row's, never shown to users.
    assert (last.cpu_user_s, last.energy_j, last.monotonic) == (3.0, 12.0, 14.0)
    assert sample_dict(last)["disk_read_bytes"] == 12288 and "monotonic" not in sample_dict(last)
    assert span(first, last, 2, None, period_s=5.0) == {
        "duration_s": 4.0,
        "cpu_user_s": 2.0,
        "cpu_system_s": 1.0,
        "cpu_avg_cores": 0.75,
        "cpu_avg_utilization": 0.375,
        "disk_read_bytes": 8192,
        "disk_write_bytes": None,  # unknown at both ends: unknown, never 0
        "network_transmit_bytes": 500,
        "network_receive_bytes": 0,
        "context_switches_voluntary": 0,
        "context_switches_involuntary": 0,
        "page_faults_minor": 0,
        "energy_j": 8.0,
        "power_avg_w": 2.0,
        "device_energy_j": 40.0,
        "device_power_avg_w": 10.0,  # the device's energy over the span's own time
        "shorter_than_sensor_period": True,  # 4 s read by a sensor every 5 s
    }
    carbon = span(first, last, 2, CarbonIntensity(450.0, "test"), period_s=1.0)
    assert carbon["shorter_than_sensor_period"] is False
    assert carbon["carbon_g"] == pytest.approx(8.0 / 3_600_000 * 450.0, rel=1e-12)
    assert span(None, None, 2, None)["duration_s"] == 0.0  # no sample yet


def test_a_targets_identity_is_fixed_and_is_all_the_state_file_keeps() -> None:
    table = table_with(os.getpid(), wall_clock=lambda: 1_700_000_000.0)
    (target,) = table.running()
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    saved = {
        "id": target.id,
        "pid": os.getpid(),
        "start_ticks": start_ticks,
        "labels": {},
        "children": True,
        "uid": os.getuid(),
        "registered_at": 1_700_000_000.0,
        "holders": 1,
    }
    assert table.persistent_state() == [saved]
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.identity.pid = 1  # type: ignore[misc]
    # A pass changes what it saw, not who the target is.
    table.record([dataclasses.replace(process(0), target_id=target.id, members=(7, 8))])
    assert target.members == (7, 8) and target.observed.members == (7, 8)
    assert table.persistent_state() == [saved]
    table.register(os.getpid(), {}, True, os.getuid())  # held twice: the count is kept
    assert table.persistent_state() == [{**saved, "holders": 2}]
    table.mark_exited(target.id, 1_700_000_005.0)
    assert table.persistent_state() == [] and target.handle is None
    assert target.identity.pid == os.getpid()  # an exited target still says who it was


def _exited(at: float) -> Target:
    identity = Identity(f"t{at:g}", 1, 1, 0.0, {}, False, 1000, 0.0)
    return Target(identity, History(1), exited_at=at)


def test_the_bounds_refuse_and_forget_by_rule() -> None:
    limits = Limits(
        max_targets=3, history_samples=10, exited_retention_s=60.0, max_targets_per_uid=2
    )
    assert limits.refusal([1000, 0], 1000, alone) is None
    per_user = limits.refusal([1000, 1000], 1000, alone)
    assert isinstance(per_user, TooMany) and per_user.detail == "at most 2 per user may run at once"
    assert limits.refusal([1000, 1000], 0, alone) is None  # root is held to the total alone
    total = limits.refusal([0, 0, 1000], 0, alone)
    assert total is not None and total.detail == "at most 3 may run at once"
    # Five exited, at most three kept: the two oldest go; past the 60 s retention at
    # 85 s, the one exited at 20 s goes too.
    exited = [_exited(at) for at in (40.0, 0.0, 30.0, 10.0, 20.0)]
    assert limits.expired(exited, 85.0, alone) == ["t0", "t10", "t20"]
    assert limits.expired(exited[:3], 85.0, alone) == ["t0"]


def test_a_refusal_says_what_it_is_not_how_http_answers_it() -> None:
    # The API maps each kind to its status (exporter/api.py); the table knows no HTTP.
    kinds = (TargetError, NotFound, Forbidden, Conflict, TooMany, TooManyLookups)
    assert [k for k in kinds if hasattr(k, "status")] == []
    refused = TooManyLookups("3 name lookups a second per user", 0.5)
    assert (refused.error, refused.retry_s, str(refused)) == (
        "too many lookups", 0.5, "too many lookups: 3 name lookups a second per user"
    )  # fmt: skip


def test_a_window_is_never_attributed_more_than_the_device_measured_over_it() -> None:
    # A pass shared out 0.056 J while a push source's last power was held past its
    # line; the settled trace gives the window 0.019 J of the whole device.
    first = _row(10.0, cpu_user_s=1.0, energy_j=1.0, device_energy_j=100.0)
    last = _row(10.2, cpu_user_s=1.1, energy_j=1.056, device_energy_j=100.06)
    settled = EdgeEnergy(start_j=100.0, end_at=10.2, end_j=100.019)
    figures = span(first, last, 2, None, period_s=1.0, edges=settled)
    assert figures["device_energy_j"] == 0.019
    assert figures["energy_j"] == 0.019 and figures["power_avg_w"] == 0.095
    # Below the device's figure, the attributed one is left as it was.
    held = span(first, last, 2, None, period_s=1.0)
    assert (held["energy_j"], held["device_energy_j"]) == (0.056, 0.06)
