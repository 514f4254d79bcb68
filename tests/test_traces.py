"""Traces: which sources make the device's total, each rail's energy, the streamed
sources, freshness, the power range over several sources, and the energy asked for
between edges (never backwards), with exact figures from stand-in sources."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from edgewatt.core.power.source import PowerReading, PullSource, Rail
from edgewatt.core.power.traces import Traces
from edgewatt.core.power.values import PowerSnapshot


@dataclass
class Source(PullSource):
    """A pull source that gives its readings in turn (an exception is raised)."""

    name: str
    board: bool = False
    readings: list[PowerReading | Exception] = field(default_factory=list)
    totals: list[tuple[float, float] | Exception | None] = field(default_factory=list)

    def read(self) -> PowerReading | None:
        item = self.readings.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def read_total(self) -> tuple[float, float] | None:
        item = self.totals.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


@dataclass
class Pushed(Source):
    pushed = True
    lines: list[PowerReading] = field(default_factory=list)

    def arrived(self) -> list[PowerReading]:
        lines, self.lines = self.lines, []
        return lines


def reading(source: str, t: float, watts: float, energy: float | None = None) -> PowerReading:
    rail = Rail(id=f"{source}:in", name="in", type="power_supply", power_w=watts, energy_j=energy)
    return PowerReading(
        source=source, monotonic=t, rails=(rail,), total_w=watts, total_energy_j=energy
    )


def edge(traces: Traces, now: float) -> PowerSnapshot:
    with traces.lock:
        for source in traces.sources:
            traces.take(source)
        return traces.snapshot(now, None, ())


def test_the_first_board_alone_is_the_device() -> None:
    first = Source("ina3221", True, [reading("ina3221", 1000.0, 5.0)])
    second = Source("tegrastats", True, [reading("tegrastats", 1000.0, 7.0)])
    rapl = Source("rapl", False, [reading("rapl", 1000.0, 3.0, 10.0)])
    snapshot = edge(Traces([first, second, rapl], 5.0), 1000.0)
    assert snapshot.host_power_w == 5.0
    assert snapshot.sources == ("ina3221", "tegrastats", "rapl")


def test_each_rail_has_its_energy_and_each_reading_is_counted() -> None:
    board = Source(
        "ina3221", True, [reading("ina3221", 1000.0, 4.0), reading("ina3221", 1002.0, 6.0)]
    )
    gpu = Source(
        "nvml", False, [reading("nvml", 1000.0, 50.0, 100.0), reading("nvml", 1002.0, 50.0, 180.0)]
    )
    traces = Traces([board, gpu], 5.0)
    edge(traces, 1000.0)
    snapshot = edge(traces, 1002.0)
    assert [(r.id, r.source, r.power_w, r.energy_j) for r in snapshot.rails] == [
        ("ina3221:in", "ina3221", 6.0, 10.0),  # (4 + 6) / 2 W over 2 s
        ("nvml:in", "nvml", 50.0, 80.0),  # the counter's own joules
    ]
    assert (snapshot.host_power_w, snapshot.host_energy_j, snapshot.measured_at) == (
        6.0,
        10.0,
        1002.0,
    )
    assert traces.readings == 4


def test_a_source_without_a_counter_is_streamed_between_the_edges() -> None:
    board = Source(
        "ina3221",
        True,
        [reading("ina3221", 1000.0, 4.0), reading("ina3221", 1001.0, 8.0)],
        totals=[(1000.5, 10.0), None, OSError("gone")],
    )
    counter = Source("rapl", False, [reading("rapl", 1000.0, 3.0, 0.0)])
    pushed = Pushed("tegrastats", False, lines=[reading("tegrastats", 1000.0, 1.0)])
    traces = Traces([board, counter, pushed], 5.0)
    edge(traces, 1000.0)
    assert traces.streamed == {"ina3221"}  # not the counter, nor the pushed source
    traces.stream(board)  # its cheap path: (t, W)
    traces.stream(board)  # none: a whole reading
    traces.stream(board)  # failed: nothing, the next edge logs it
    assert traces.readings == 5
    # 4 W, then 10 W at 1000.5 s (streamed), then 8 W at 1001 s (the whole reading).
    assert traces.totals["ina3221"].at(1001.0) == 3.5 + 4.5


def test_a_reading_exactly_the_gap_old_is_fresh_and_an_older_one_is_not() -> None:
    board = Source("ina3221", True, [reading("ina3221", 1000.0, 4.0)] * 3)
    traces = Traces([board], 5.0)
    assert edge(traces, 1005.0).host_power_w == 4.0
    assert edge(traces, 1005.5).host_power_w is None


def test_no_energy_yet_is_none_and_measured_nowhen() -> None:
    failing = Source("ina3221", True, [OSError("no sensor")])
    snapshot = edge(Traces([failing], 5.0), 1000.0)
    assert (snapshot.host_energy_j, snapshot.measured_at) == (None, None)


def test_a_failing_source_is_logged_once_and_its_return_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = Source(
        "ina3221", True, [OSError("i2c"), OSError("i2c"), reading("ina3221", 1000.0, 4.0)]
    )
    traces = Traces([board], 5.0)
    with caplog.at_level(logging.INFO):
        for now in (998.0, 999.0, 1000.0):
            edge(traces, now)
    assert [r.getMessage() for r in caplog.records] == [
        "power source ina3221 failed, retrying: i2c",
        "power source ina3221 is back",
    ]


def test_several_sources_range_as_the_sums_of_their_lows_and_highs() -> None:
    rapl = Source(
        "rapl",
        False,
        [
            reading("rapl", 1000.0, 0, 0.0),
            reading("rapl", 1001.0, 0, 20.0),
            reading("rapl", 1002.0, 0, 50.0),
        ],
    )
    gpu = Source(
        "nvml",
        False,
        [
            reading("nvml", 1000.0, 0, 0.0),
            reading("nvml", 1001.0, 0, 100.0),
            reading("nvml", 1002.0, 0, 160.0),
        ],
    )
    traces = Traces([rapl, gpu], 5.0)
    edge(traces, 1000.0)
    with traces.lock:
        for _ in range(2):
            traces.take(rapl)
            traces.take(gpu)
        snapshot = traces.snapshot(1002.0, None, ())
    assert (snapshot.power_min_w, snapshot.power_max_w) == (80.0, 130.0)  # 20 + 60, 30 + 100
    # One source without an interval since: no range rather than half of one.
    lone = Source("rapl", False, [reading("rapl", 1000.0, 0, 0.0)])
    assert edge(Traces([lone], 5.0), 1000.0).power_max_w is None


def test_energy_asked_between_edges_never_goes_back() -> None:
    """Before the last energy reported (an exit the kernel dates back): never above it;
    after it: never below, and the next edge goes on from there."""
    board = Source(
        "ina3221",
        True,
        [reading("ina3221", 1000.0, 10.0), reading("ina3221", 1001.0, 10.0)]
        + [reading("ina3221", 1001.0, 10.0)] * 2,
    )
    traces = Traces([board], 5.0)
    edge(traces, 1000.0)
    assert edge(traces, 1002.0).host_energy_j == 20.0  # 10 W held past 1001 s
    assert traces.energy_at(1000.5) == 5.0
    assert traces.energy_at(1002.0) == 20.0
    assert traces.energy_at(1003.0) == 30.0
    assert traces.energy_at(1002.5) == 25.0  # below the 30 J reported: its own
    assert edge(traces, 1003.0).host_energy_j == 30.0
    assert Traces([board], 5.0).energy_at(1000.0) is None  # no trace yet


def test_the_horizon_is_the_last_instant_that_settles_and_past_the_gap_every_one() -> None:
    # settled_until's promise (edges.settler rests on it): every instant past it gives
    # None from settled_at, the instants up to it joules; silent beyond the gap, all.
    pushed = Pushed("tegrastats", True, lines=[reading("tegrastats", 1000.0, 4.0)])
    traces = Traces([pushed], 5.0)
    with traces.lock:
        assert traces.settled_until(999.0) is None  # no reading yet: none settles
        traces.begin(pushed, 999.0)  # held back: 4 W from 999 s
    edge(traces, 1000.2)
    pushed.lines = [reading("tegrastats", 1001.0, 6.0)]
    edge(traces, 1001.5)
    with traces.lock:
        assert traces.settled_until(1001.5) == 1001.0
        for t, joules in ((1000.5, 4.0 + 2.25), (1001.0, 9.0), (1001.0 + 1e-9, None)):
            assert traces.settled_at(t, 1001.5) == pytest.approx(joules), t
        assert traces.settled_until(1006.0) == 1001.0  # exactly the gap: not yet silent
        assert traces.settled_until(1006.5) == float("inf")
        assert traces.settled_at(1006.4, 1006.5) == pytest.approx(9.0)
