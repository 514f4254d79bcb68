"""The target table's phases: which sensor period a window is flagged against."""

from __future__ import annotations

import dataclasses
import os

from edgewatt.core.targets import TargetTable
from tests.conftest import table_with
from tests.snapshots import process


def _pass(table: TargetTable, period_s: float, at: float, only: set[str] | None = None) -> None:
    """One pass as the sampler records it: the sensors' period over the interval it
    ends, then every target's sample (1 W of device power, so energy is time)."""
    table.energy_period_s = period_s
    samples = [
        dataclasses.replace(process(0), target_id=t.id, time=at, device_energy_j=at)
        for t in table.running()
    ]
    table.record(samples, 10, only)


def _flags(table: TargetTable, target_id: str) -> list[bool]:
    summary = table.summary(target_id, 2)
    return [p["shorter_than_sensor_period"] for p in summary["phases"]]


def test_a_window_is_flagged_against_the_period_it_was_read_at_not_todays() -> None:
    table = table_with(os.getpid())
    (target,) = table.running()
    uid = os.getuid()
    _pass(table, 0.2, 0.0)
    # A 150 ms window read at 5 Hz (its window rate refused): shorter than its period.
    table.start_phase(target.id, "refused", uid)
    _pass(table, 0.2, 1.0, {target.id})
    table.end_phase(target.id, uid)
    _pass(table, 0.2, 1.15, {target.id})
    # A 150 ms window read at 200 Hz: resolved.
    table.start_phase(target.id, "fine", uid)
    _pass(table, 0.005, 2.0, {target.id})
    table.end_phase(target.id, uid)
    _pass(table, 0.005, 2.15, {target.id})
    assert _flags(table, target.id) == [True, False]
    # Later passes at other rates change neither: each window keeps its own period.
    _pass(table, 0.2, 3.0)
    assert _flags(table, target.id) == [True, False]
    _pass(table, 0.005, 4.0)
    assert _flags(table, target.id) == [True, False]


def test_a_coarse_pass_for_another_target_inside_a_window_counts() -> None:
    # Between this window's edges a pass on demand for another target read at 5 Hz
    # (this one got no row from it): the window was not read at 200 Hz throughout.
    table = table_with(os.getpid())
    table.register(os.getppid(), {}, False, os.getuid())
    mine, other = (t.id for t in table.running())
    uid = os.getuid()
    _pass(table, 0.005, 0.0)
    table.start_phase(mine, "window", uid)
    _pass(table, 0.005, 1.0, {mine})
    _pass(table, 0.2, 1.05, {other})
    table.end_phase(mine, uid)
    _pass(table, 0.005, 1.15, {mine})
    assert _flags(table, mine) == [True]
    summary = table.summary(mine, 2)
    assert summary["phases"][0]["duration_s"] == 0.15
