"""A phase's exported figures (PhaseFigures, every pass) and a span's changes where one
end lacks a figure, to the rounding users read."""

from __future__ import annotations

import dataclasses

from edgewatt.core.targets.history import Phase
from edgewatt.core.targets.row import row_of
from edgewatt.core.targets.summary import phase_figures, span
from tests.snapshots import process


def test_a_phase_without_samples_is_running_until_ended_and_nothing_else() -> None:
    phase = Phase("warmup", 1_700_000_000.0)
    assert tuple(phase_figures(phase)) == ("warmup", True, None, 0.0, None)
    phase.ended_at = 1_700_000_001.0
    assert tuple(phase_figures(phase)) == ("warmup", False, None, 0.0, None)


def test_a_phases_figures_are_rounded_to_the_millisecond_and_millijoule() -> None:
    phase = Phase("train", 1_700_000_000.0)
    sample = process(0)
    phase.add(row_of(dataclasses.replace(sample, energy_j=1.0), 100.0))
    phase.add(
        row_of(dataclasses.replace(sample, energy_j=3.4567891), 101.2345678), None, (2.5, 9.8765432)
    )
    assert tuple(phase_figures(phase)) == ("train", True, 2.457, 1.235, 9.877)
    phase.ended_at = 1_700_000_002.0
    assert phase_figures(phase).running is False


def test_a_figure_unknown_at_one_end_has_no_change() -> None:
    sample = process(0)
    first = row_of(dataclasses.replace(sample, disk_write_bytes=None), 100.0)
    last = row_of(dataclasses.replace(sample, disk_write_bytes=4096), 101.0)
    assert span(first, last, 2, None)["disk_write_bytes"] is None
    assert span(last, first, 2, None)["disk_write_bytes"] is None


def test_a_spans_figures_are_rounded_and_rates_need_a_duration() -> None:
    sample = process(0)
    at = {"cpu_user_s": 1.0, "cpu_system_s": 0.5, "energy_j": 2.0, "device_energy_j": 10.0}
    first = row_of(dataclasses.replace(sample, **at), 100.0)
    later = {"cpu_user_s": 1.1234567, "cpu_system_s": 0.6234567}
    later.update(energy_j=3.2345678, device_energy_j=15.8765432)
    last = row_of(dataclasses.replace(sample, **later), 100.4567891)
    figures = span(first, last, 2, None)
    names = ("duration_s", "cpu_user_s", "cpu_system_s", "cpu_avg_cores", "cpu_avg_utilization")
    power = ("energy_j", "power_avg_w", "device_energy_j", "device_power_avg_w")
    assert [figures[n] for n in names] == [0.457, 0.123, 0.123, 0.5405, 0.2703]
    assert [figures[n] for n in power] == [1.235, 2.703, 5.877, 12.865]
    # No time between the two rows: no rate.
    still = span(first, first, 2, None)
    assert [still[n] for n in names] == [0.0, 0.0, 0.0, None, None]
    assert [still[n] for n in power] == [0.0, None, 0.0, None]
