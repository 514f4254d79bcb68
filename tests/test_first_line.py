"""A push source started and silent so far (Traces.begin): an edge before its first line
has the energy counted so far (none of its own yet), not final; once the line comes, its
power is held back to the source's start, as the last line's is held past it, so that
edge settles at the energy from the start; a start beyond the gap limit is not bridged.
(End to end, in process: tests/test_edges_in_process.py.)"""

from __future__ import annotations

import pytest

from edgewatt.core.power.traces import Traces
from tests.test_traces import Pushed, edge, reading


def begun(source: Pushed, at: float, max_gap_s: float = 5.0) -> Traces:
    traces = Traces([source], max_gap_s=max_gap_s)
    with traces.lock:
        traces.take(source)
        traces.begin(source, at)
    return traces


def test_an_edge_before_the_first_line_settles_at_its_power_held_back() -> None:
    board = Pushed("tegrastats", board=True)
    traces = begun(board, 10.0)
    early = edge(traces, 10.2)
    assert early.host_energy_j == 0.0 and early.host_power_w is None
    assert early.provenance is not None and early.provenance.reason is not None  # no reading
    with traces.lock:
        assert traces.settled_at(10.2, 10.3) is None  # its line may still come
    board.lines.append(reading("tegrastats", 10.5, 10.0))
    edge(traces, 10.6)
    with traces.lock:
        # 10 W from the start, 10.0 s (to the floats' rounding of 10.2 - 10.0).
        assert traces.settled_at(10.2, 10.6) == pytest.approx(2.0, abs=1e-9)
        assert traces.settled_at(10.5, 10.6) == 5.0


def test_a_counters_first_reading_is_held_back_by_its_power() -> None:
    counter = Pushed("powermetrics")
    traces = begun(counter, 0.0)
    counter.lines.append(reading("powermetrics", 0.5, 10.0, energy=100.0))
    counter.lines.append(reading("powermetrics", 1.0, 12.0, energy=106.0))
    edge(traces, 1.0)
    with traces.lock:
        assert traces.settled_at(0.2, 1.0) == 2.0
        assert traces.settled_at(1.0, 1.0) == 11.0  # 5 J held back, then the counter's 6


def test_a_first_line_beyond_the_gap_limit_is_not_bridged() -> None:
    board = Pushed("tegrastats", board=True)
    traces = begun(board, 0.0, max_gap_s=5.0)
    assert edge(traces, 4.0).host_energy_j == 0.0
    # Silent beyond the limit: no energy to give (none counted, none to come for then).
    assert edge(traces, 5.5).host_energy_j is None
    board.lines.append(reading("tegrastats", 6.0, 10.0))
    edge(traces, 6.5)
    with traces.lock:
        assert traces.settled_at(4.0, 6.5) == 0.0
        assert traces.settled_at(6.0, 6.5) == 0.0  # the 6 s before its line: not bridged


def test_each_rail_is_held_back_with_the_total() -> None:
    """The rails of the first line are held back as its total is: a window from the
    source's start reads the same joules on the rail as on the device."""
    board = Pushed("tegrastats", board=True)
    traces = begun(board, 10.0)
    board.lines.append(reading("tegrastats", 10.5, 10.0))
    snapshot = edge(traces, 10.6)
    (rail,) = snapshot.rails
    assert rail.energy_j == pytest.approx(6.0, abs=1e-9)  # 10 W from 10.0 s to 10.6 s
    assert snapshot.host_energy_j == pytest.approx(6.0, abs=1e-9)
