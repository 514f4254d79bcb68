"""A target's history: its phases nested by depth and bounded in number, its memory
and spreads, the network rate over its last rows, and when its windows are settled."""

from __future__ import annotations

import dataclasses

import pytest

from edgewatt.core.targets import history as history_module
from edgewatt.core.targets.errors import TargetError
from edgewatt.core.targets.history import (
    MAX_PERSON_PHASES,
    MAX_PHASE_DEPTH,
    MAX_PHASES,
    MAX_USERS_PHASES,
    History,
    Phase,
    phase_name,
)
from edgewatt.core.targets.row import SampleRow, row_of
from tests.snapshots import process


def _row(at: float, **figures: float | int | None) -> SampleRow:
    """A row read at ``at`` s (monotonic), dated 1,700,000,000 s later, from
    tests/snapshots.py's sample (one process, 100 B of RSS, no device energy)."""
    return row_of(dataclasses.replace(process(0), time=1_700_000_000.0 + at, **figures), at)


def test_phases_nest_by_depth_and_an_end_ends_the_deeper_ones() -> None:
    history = History(10)
    assert history.depth == 0 and history.end_phase(1.0) is None
    epoch, step = Phase("epoch", 1.0, depth=0), Phase("step", 2.0, depth=1)
    history.start_phase(epoch, 1.0)
    assert history.depth == 1
    history.start_phase(step, 2.0)
    assert history.depth == 2 and history.running_phases == [epoch, step]
    # Another step at depth 1 ends the first, the epoch runs on.
    step2 = Phase("step2", 3.0, depth=1)
    history.start_phase(step2, 3.0)
    assert (step.ended_at, epoch.ended_at) == (3.0, None)
    assert history.running_phases == [epoch, step2]
    # No depth: the innermost ends; at depth 1 with none running there: none.
    assert history.end_phase(4.0) is step2 and step2.ended_at == 4.0
    assert history.end_phase(4.5, 1) is None and epoch.ended_at is None
    # Ending at a depth ends those deeper too and returns the one at that depth, else
    # the outermost ended.
    inner, deep = Phase("inner", 5.0, depth=1), Phase("deep", 5.0, depth=3)
    history.start_phase(inner, 5.0)
    history.start_phase(deep, 5.0)
    assert history.end_phase(6.0, 0) is epoch
    assert (epoch.ended_at, inner.ended_at, deep.ended_at) == (6.0, 6.0, 6.0)
    history.start_phase(inner2 := Phase("inner2", 7.0, depth=1), 7.0)
    history.start_phase(deep2 := Phase("deep2", 7.0, depth=3), 7.0)
    assert history.end_phase(8.0, 2) is deep2 and inner2.ended_at is None
    assert history.phases == [epoch, step, step2, inner, deep, inner2, deep2]


def test_a_history_lists_its_newest_phases_and_counts_the_older_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound docs/reference.md gives; the rule at a bound of 3 (a thousand phases
    # made test_targets.py's tracemalloc reading of a history's rows fail after them).
    assert MAX_PHASES == 1000
    monkeypatch.setattr(history_module, "MAX_PHASES", 3)
    history = History(10)
    phases = [Phase(f"p{i}", float(i)) for i in range(5)]
    for phase in phases[:3]:
        history.start_phase(phase, phase.started_at)
    assert history.phases == phases[:3] and history.phases_dropped == 0
    history.start_phase(phases[3], 3.0)
    history.start_phase(phases[4], 4.0)
    assert history.phases == phases[2:] and history.phases_dropped == 2
    # A dropped phase not final yet is still settled: its end reaches it.
    assert phases[0] in history.pending and phases[0].ended_at == 1.0


def test_a_phase_name_is_a_label_value_of_at_most_128_bytes() -> None:
    assert phase_name("é" * 64) == "é" * 64  # 128 bytes of UTF-8
    for bad, why in (
        ("é" * 64 + "x", "is longer than 128 bytes"),
        ("", "must not be empty"),
        (7, "must be a string, got int"),
    ):
        with pytest.raises(TargetError) as refused:
            phase_name(bad)
        assert (refused.value.error, refused.value.detail) == (
            "invalid phase name", f"the phase name {why}"
        )  # fmt: skip


def test_the_phase_bounds_are_those_the_reference_gives() -> None:
    # A target's summary lists 1,000; a person's targets keep 1,000 together, all
    # users' 1,000 (README.md, "Shares per person"); 16 deep at most (table.py).
    assert (MAX_PHASES, MAX_PERSON_PHASES, MAX_USERS_PHASES, MAX_PHASE_DEPTH) == (
        1000, 1000, 1000, 16
    )  # fmt: skip


def test_the_network_rate_spans_the_last_two_intervals_on_the_monotonic_clock() -> None:
    history = History(10)
    history.add(_row(10.0, network_transmit_bytes=1000, network_receive_bytes=2000))
    assert history.network_rate() is None  # one row
    history.add(_row(11.0, network_transmit_bytes=1500, network_receive_bytes=2000))
    assert history.network_rate() == {
        "transmit_bytes_per_s": 500.0,
        "receive_bytes_per_s": 0.0,  # nothing received: a rate of 0, not unknown
        "window_s": 1.0,
        "from_time": 1_700_000_010.0,
        "to_time": 1_700_000_011.0,
    }
    history.add(_row(13.1234567891, network_transmit_bytes=2000, network_receive_bytes=2500))
    assert history.network_rate() == {
        "transmit_bytes_per_s": 320.2,  # 1000 B over 3.1234567891 s
        "receive_bytes_per_s": 160.1,
        "window_s": 3.123457,
        "from_time": 1_700_000_010.0,
        "to_time": 1_700_000_013.1234567891,
    }
    # A fourth row: the window is the last two intervals, from the second row.
    history.add(_row(14.0, network_transmit_bytes=3000, network_receive_bytes=2500))
    rate = history.network_rate()
    assert rate is not None and (rate["window_s"], rate["transmit_bytes_per_s"]) == (3.0, 500.0)
    # A counter unknown, or gone back (a socket's counters left with it): no rate.
    history.add(_row(15.0, network_transmit_bytes=None, network_receive_bytes=2600))
    assert history.network_rate() is None
    history = History(10)
    history.add(_row(10.0, network_transmit_bytes=1000, network_receive_bytes=2000))
    history.add(_row(11.0, network_transmit_bytes=900, network_receive_bytes=2100))
    assert history.network_rate() is None
    history.add(_row(11.0, network_transmit_bytes=1000, network_receive_bytes=2100))
    assert history.network_rate() is not None  # from the first row: 1 s, 0 B/s sent
    same = History(10)
    same.add(_row(10.0))
    same.add(_row(10.0))
    assert same.network_rate() is None  # no time between the two


def test_memory_counts_rows_of_live_members_since_the_held_forks_exec() -> None:
    history = History(10)
    history.add(_row(1.0, memory_rss_bytes=5000, memory_pss_bytes=4000))
    history.add(_row(2.0, memory_rss_bytes=0))  # zombies only: no memory held
    history.add(_row(3.0, memory_rss_bytes=7000, processes=0))  # no member
    memory = history.memory
    assert (memory.rows, memory.rss.low, memory.rss.high, memory.pss_peak) == (1, 5000, 5000, 4000)
    # The exec: what came before was `edgewatt run`'s fork, not the command.
    history.add(_row(4.0, memory_rss_bytes=3000, memory_pss_bytes=None), 1)
    history.add(_row(5.0, memory_rss_bytes=2000, memory_rss_largest_bytes=None), 1)
    memory = history.memory
    assert (memory.rows, memory.rss_sum, memory.rss.low, memory.rss.high) == (2, 5000.0, 2000, 3000)
    assert (memory.pss_peak, memory.rss_largest_peak) == (60, 80)
    # A pass whose PSS was not read (a dear read waits): the peak stays.
    history.add(_row(5.5, memory_rss_bytes=2500, memory_pss_bytes=None), 1)
    assert (memory.rows, memory.pss_peak) == (3, 60)
    # Its exit: the kernel's peak RSS of its one process, which no sample can miss.
    history.end(6.0, 9000)
    assert (memory.rss.low, memory.rss.high, memory.rss_largest_peak) == (2000, 9000, 9000)
    history.end(7.0, 50)
    assert (memory.rss.high, memory.rss_largest_peak) == (9000, 9000)
    history.end(8.0, None)
    assert (memory.rss.high, memory.rss_largest_peak, memory.rows) == (9000, 9000, 3)


def test_a_window_spreads_over_its_intervals_not_the_one_before_it() -> None:
    history = History(10)
    history.note(0.5, 30.0, 40.0)  # before the first row: not the history's
    history.add(_row(1.0, cpu_utilization=0.9))
    phase = Phase("train", 1.5)
    history.start_phase(phase, 1.5)
    history.note(0.2, 2.0, 6.0)
    history.note(None, 1.0, None)  # one end of a pass's power only
    history.add(_row(2.0, cpu_utilization=0.25))  # the phase's first row
    history.note(0.1, None, None)
    history.add(_row(3.0, cpu_utilization=None))  # no utilization for this interval
    history.note(None, 3.0, None)  # one end only: not a spread
    history.add(_row(4.0, cpu_utilization=0.5))
    assert (history.period_s, history.power.low, history.power.high) == (0.2, 1.0, 6.0)
    assert (history.cpu_utilization.low, history.cpu_utilization.high) == (0.25, 0.5)
    # The phase from its first row on: only the intervals after it.
    assert (phase.period_s, phase.power.low, phase.power.high) == (0.1, None, None)
    assert (phase.cpu_utilization.low, phase.cpu_utilization.high) == (0.5, 0.5)
    history.note(None, None, 9.0)  # the other end only: not a spread either
    history.add(_row(4.5, cpu_utilization=None))
    history.note(0.05, 4.0, 8.0)  # nothing of the passes before the last row
    history.add(_row(5.0, cpu_utilization=0.125))
    assert (history.period_s, history.power.low, history.power.high) == (0.2, 1.0, 8.0)
    assert (phase.period_s, phase.power.low, phase.power.high) == (0.1, 4.0, 8.0)
    assert (phase.cpu_utilization.low, phase.cpu_utilization.high) == (0.125, 0.5)
    # Two passes between rows, one end each: together a spread.
    history.note(None, 2.0, None)
    history.note(None, None, 8.5)
    history.add(_row(6.0, cpu_utilization=0.25))
    assert (phase.power.low, phase.power.high, history.power.high) == (2.0, 8.5, 8.5)
    assert history.count == 7 and history.first is not None and history.first.monotonic == 1.0


def test_an_exit_ends_and_closes_every_pending_phase_at_its_time() -> None:
    history = History(10)
    history.add(_row(1.0))
    ended, running = Phase("ended", 1.5), Phase("running", 2.5, depth=1)
    history.start_phase(ended, 1.5)
    history.end_phase(2.0)
    history.start_phase(running, 2.5)
    assert not ended.closed and not running.closed
    history.end(3.0, None)
    assert (ended.ended_at, ended.closed, running.ended_at, running.closed) == (
        2.0, True, 3.0, True
    )  # fmt: skip


def test_a_windows_device_energy_is_final_once_the_trace_settled_its_edges() -> None:
    settled: dict[float, float | None] = {}
    history = History(10)
    assert history.final and not history.settled(False)  # no row
    history.add(_row(10.0, device_energy_j=100.0))
    assert not history.final and not history.settled(False)
    history.settle(settled.get)  # the reading after 10 s not come yet
    assert not history.settled(False)
    settled[10.0] = 99.5
    history.settle(settled.get)
    assert history.edges.start_j == 99.5 and history.settled(False) and history.settled(True)
    phase = Phase("window", 10.5)
    history.start_phase(phase, 10.5)
    history.add(_row(12.0, device_energy_j=120.0))
    assert not history.final and not phase.final and not history.settled(False)
    history.end_phase(12.5)
    history.add(_row(13.0, device_energy_j=130.0))  # its closing row
    assert phase.closed and history.pending == [phase] and not phase.done
    settled[12.0], settled[13.0] = 119.0, 131.0
    history.settle(settled.get)  # every pass: the first row's edge and the phases'
    assert (phase.edges.start_j, phase.edges.end_j, phase.done) == (119.0, 131.0, True)
    assert history.pending == [] and history.settled(False) and not history.settled(True)
    assert history.edges.end_at == 10.0  # the last row's edge only for a summary
    history.settle(settled.get, to_last=True)
    assert (history.edges.end_at, history.edges.end_j) == (13.0, 131.0)
    assert history.final and history.settled(True)
    # Without the device's energy there is nothing to settle.
    plain = History(10)
    plain.add(_row(1.0))
    assert plain.settled(False) and plain.settled(True) and plain.final


def test_an_ended_phase_is_final_only_with_its_closing_row() -> None:
    phase = Phase("window", 1.0)
    assert phase.final and phase.running and not phase.done  # no sensor: nothing to settle
    phase.add(_row(1.0))
    phase.ended_at = 2.0
    assert not phase.final and not phase.running and not phase.done
    phase.add(_row(3.0))
    assert phase.closed and phase.final and phase.done


def test_young_rows_settle_oldest_first_up_to_the_first_not_final() -> None:
    history = History(10)
    for i, joules in enumerate([1.0, None, 3.5, 4.5, 6.0]):
        history.add(_row(float(i), device_energy_j=joules))
    assert history.young == 5
    # The trace has a reading up to 3.2 s: rows at 0..3 s settle, the one at 4 s waits.
    truth = {0.0: 0.5, 2.0: 3.0, 3.0: 4.0}
    assert history.settle_rows(lambda t: truth.get(t) if t <= 3.2 else None) is False
    assert history.young == 1
    # The row without a sensor's energy stays without one; the others are the trace's.
    assert [r.device_energy_j for r in history.rows] == [0.5, None, 3.0, 4.0, 6.0]
    assert history.settle_rows(lambda t: 5.25) is True
    assert [r.device_energy_j for r in history.rows] == [0.5, None, 3.0, 4.0, 5.25]
    assert history.young == 0


def test_a_young_row_older_than_the_trace_keeps_its_energy_and_the_rest_settle() -> None:
    history = History(4)
    for i in range(6):  # the ring keeps rows 2 to 5: the two dropped are not settled
        history.add(_row(float(i), device_energy_j=float(i)))
    assert history.young == 6
    # The trace has dropped its readings before 3 s (None there) but has them after.
    assert history.settle_rows(lambda t: None if t < 3.0 else t + 0.5) is True
    assert [r.device_energy_j for r in history.rows] == [2.0, 3.5, 4.5, 5.5]
    assert history.young == 0
