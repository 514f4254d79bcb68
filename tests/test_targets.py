"""The target table's phases: which sensor period a window is flagged against."""

from __future__ import annotations

import dataclasses
import os

from edgewatt.core.targets import TargetTable
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
    return table.record(samples, 10, only)


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
    assert [(name, energy, duration) for name, _, energy, duration in exported] == [
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
