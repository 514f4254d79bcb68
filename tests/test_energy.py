"""Energy from power traces with known joules; the meter's host totals."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.power.source import PowerReading, PullSource, Rail
from edgewatt.core.power.trace import KEEP_POINTS, Trace


def integrate(trace: list[tuple[float, float]], max_gap_s: float = 10.0) -> float:
    meter = Trace(max_gap_s)
    for t, watts in trace:
        meter.add(t, watts)
    return meter.joules


def test_constant_power() -> None:
    trace = [(1000.0 + i, 7.5) for i in range(101)]  # 7.5 W for 100 s
    assert integrate(trace) == pytest.approx(750.0, rel=1e-12)


def test_stepped_power_within_half_a_percent() -> None:
    # 5 W for 50 s then 15 W for 50 s: 1000 J. Sampled every 0.5 s, irregularly offset.
    trace = [(i * 0.5 + 0.013, 5.0 if i * 0.5 < 50 else 15.0) for i in range(201)]
    assert integrate(trace) == pytest.approx(1000.0, rel=0.005)


def test_repeated_readings_are_counted_once() -> None:
    meter = Trace(10.0)
    for t, w in [(0.0, 4.0), (1.0, 4.0), (1.0, 4.0), (1.0, 4.0), (2.0, 4.0)]:
        meter.add(t, w)
    assert meter.joules == 8.0


def test_a_gap_is_not_bridged() -> None:
    # The sensor stopped for 60 s: nothing is invented for that time.
    trace = [(0.0, 10.0), (1.0, 10.0), (61.0, 10.0), (62.0, 10.0)]
    assert integrate(trace, max_gap_s=5.0) == 20.0


def test_hardware_counter_restart_keeps_counting() -> None:
    c = Trace(10.0, counter=True)
    for i, raw in enumerate((100.0, 101.5, 103.0, 0.5, 2.0)):  # restarted after 103.0
        c.add(float(i), None, raw)
    assert c.joules == pytest.approx(3.0 + 0.5 + 1.5)


def test_energy_at_an_instant_between_readings_is_interpolated() -> None:
    # 4 W at t=0, 14 W at t=1: the power is taken as linear in between, so the energy
    # up to t=0.5 is the trapezoid from 4 W to 9 W over 0.5 s.
    trace = Trace(10.0)
    trace.add(0.0, 4.0)
    trace.add(1.0, 14.0)
    trace.add(2.0, 14.0)
    assert trace.at(0.5) == pytest.approx((4.0 + 9.0) / 2 * 0.5)
    assert trace.at(1.0) == pytest.approx(9.0)
    assert trace.at(1.25) == pytest.approx(9.0 + 14.0 * 0.25)
    assert trace.at(2.5) == pytest.approx(23.0 + 14.0 * 0.5)  # held past the last reading
    assert trace.at(-1.0) == 0.0  # before the first reading: nothing yet
    assert trace.at(30.0) == 23.0  # past the gap limit: nothing invented


def test_an_edge_past_the_last_reading_is_final_once_the_next_comes() -> None:
    # A push source's line at t=0 (4 W); an edge at t=0.5 holds 4 W past it, and is
    # not final: the line at t=1 (14 W) makes the power a ramp, and the edge's energy
    # the trapezoid up to it. Then it stays.
    trace = Trace(5.0)
    trace.add(0.0, 4.0)
    assert trace.at(0.5) == pytest.approx(2.0)  # held
    assert trace.settled_at(0.5, now=0.6) is None
    trace.add(1.0, 14.0)
    assert trace.settled_at(0.5, now=1.1) == pytest.approx((4.0 + 9.0) / 2 * 0.5)
    assert trace.settled_at(1.0, now=1.1) == pytest.approx(9.0)  # a reading at the edge


def test_an_edge_a_silent_source_never_reaches_settles_at_its_last_count() -> None:
    # Silent beyond the gap limit: whatever comes later is not bridged to the edge, so
    # its energy is the count at the last reading, the same before and after.
    trace = Trace(5.0)
    trace.add(0.0, 4.0)
    trace.add(1.0, 4.0)
    assert trace.settled_at(2.0, now=5.9) is None
    assert trace.settled_at(2.0, now=6.1) == pytest.approx(4.0)
    trace.add(7.0, 10.0)
    assert trace.settled_at(2.0, now=7.1) == pytest.approx(4.0)


def test_a_counter_is_linear_between_readings_and_held_after() -> None:
    trace = Trace(10.0, counter=True)
    for t, raw in ((0.0, 50.0), (1.0, 60.0), (2.0, 80.0)):
        trace.add(t, None, raw)
    assert trace.at(0.5) == pytest.approx(5.0)
    assert trace.at(1.75) == pytest.approx(25.0)
    assert trace.at(3.0) == 30.0
    # Read with its power (powermetrics: each sample's energy over its own interval),
    # the power is held past the last reading until the next comes, within the gap.
    powered = Trace(10.0, counter=True)
    for t, raw in ((0.0, 50.0), (1.0, 60.0), (2.0, 80.0)):
        powered.add(t, 20.0, raw)
    assert powered.at(2.5) == pytest.approx(30.0 + 20.0 * 0.5)
    assert powered.at(13.0) == 30.0  # past the gap limit: nothing invented


def test_a_gap_is_not_interpolated_across() -> None:
    trace = Trace(5.0)
    for t in (0.0, 1.0, 61.0, 62.0):
        trace.add(t, 10.0)
    assert trace.at(30.0) == 10.0
    assert trace.at(61.5) == pytest.approx(15.0)


@dataclass
class FakeSource(PullSource):
    name: str
    board: bool
    readings: list[PowerReading | Exception | None] = field(default_factory=list)

    def read(self) -> PowerReading | None:
        item = self.readings.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None: ...


def reading(
    source: str, t: float, total: float | None, energy: float | None = None
) -> PowerReading:
    rail = Rail(id=f"{source}:r", name="r", type="power_supply", power_w=total, energy_j=energy)
    return PowerReading(
        source=source, monotonic=t, rails=(rail,), total_w=total, total_energy_j=energy
    )


def test_board_source_alone_gives_the_host_total() -> None:
    board = FakeSource(
        "tegrastats", True, [reading("tegrastats", 0.0, 5.0), reading("tegrastats", 1.0, 7.0)]
    )
    other = FakeSource(
        "nvml", False, [reading("nvml", 0.0, 100.0, 0.0), reading("nvml", 1.0, 100.0, 100.0)]
    )
    meter = PowerMeter([board, other], max_gap_s=5.0)
    meter.read(0.0)
    snap = meter.read(1.0)
    assert snap is not None
    assert snap.host_power_w == 7.0
    assert snap.host_energy_j == pytest.approx(6.0)  # (5 + 7) / 2 over 1 s, the GPU is inside


def test_non_board_sources_add_up_and_never_go_backwards() -> None:
    rapl = FakeSource(
        "rapl",
        False,
        [
            reading("rapl", 0.0, 20.0, 0.0),
            reading("rapl", 1.0, 20.0, 20.0),
            reading("rapl", 2.0, 20.0, 40.0),
        ],
    )
    gpu = FakeSource(
        "nvml",
        False,
        [
            reading("nvml", 0.0, 100.0, 0.0),
            OSError("NVML hiccup"),
            reading("nvml", 2.0, 100.0, 200.0),
        ],
    )
    meter = PowerMeter([rapl, gpu], max_gap_s=5.0)
    first = meter.read(0.0)
    second = meter.read(1.0)
    third = meter.read(2.0)
    assert first and second and third
    assert first.host_power_w == 120.0
    assert second.host_power_w is None  # a partial sum would understate the device
    # The GPU's last power held within the gap, as a power signal's: the count it
    # gives when it is back agrees (200 J at 2 s).
    assert second.host_energy_j == pytest.approx(120.0)
    assert third.host_energy_j == pytest.approx(240.0)
    assert third.host_power_w == 120.0


def test_a_silent_source_drops_out() -> None:
    stale = FakeSource("tegrastats", True, [reading("tegrastats", 0.0, 5.0)] * 2)
    meter = PowerMeter([stale], max_gap_s=5.0)
    assert meter.read(1.0).host_power_w == 5.0  # type: ignore[union-attr]
    assert meter.read(10.0).host_power_w is None  # type: ignore[union-attr]


def test_the_device_energy_never_goes_back_after_a_held_power_overshoots() -> None:
    """Past its last reading a board's power is held (10 W): the edge at 2 s reports
    20 J. The next line, dated 1.8 s, says 0 W: the trace counts 14 J up to 2.5 s, below
    what was reported. The device's energy stays at 20 J (a counter that went back reads
    as a reset in Prometheus) until the trace passes it."""
    board = FakeSource(
        "tegrastats",
        True,
        [
            reading("tegrastats", 0.0, 10.0),
            reading("tegrastats", 1.0, 10.0),
            reading("tegrastats", 1.0, 10.0),  # no new line by the edge at 2 s
            reading("tegrastats", 1.8, 0.0),
            reading("tegrastats", 3.0, 20.0),
        ],
    )
    meter = PowerMeter([board], max_gap_s=5.0)
    energies = []
    for edge in (0.0, 1.0, 2.0, 2.5, 3.0):
        snapshot = meter.read(edge)
        assert snapshot is not None
        energies.append(snapshot.host_energy_j)
    # 10 J by 1 s, 4 J over the 0.8 s to 0 W, 12 J over the 1.2 s to 20 W.
    assert energies == [0.0, 10.0, 20.0, 20.0, 26.0]


def test_a_reading_is_taken_once_and_says_so() -> None:
    power, counter = Trace(10.0), Trace(10.0, counter=True)
    assert power.add(0.0, 4.0) and not power.add(0.0, 4.0) and not power.add(-1.0, 4.0)
    assert not power.add(1.0, None)  # no power: nothing to integrate
    assert counter.add(0.0, None, 50.0) and not counter.add(1.0, 3.0, None)
    assert counter.add(1.0, None, 50.0)
    # The same raw count again: nothing added (a count that went back restarted).
    assert counter.joules == 0.0


def test_a_gap_of_exactly_the_limit_is_bridged_and_held_across() -> None:
    power = Trace(5.0)
    power.add(0.0, 10.0)
    power.add(5.0, 10.0)
    assert power.joules == 50.0
    assert power.at(2.5) == 25.0  # linear inside an interval of exactly the limit
    assert power.at(10.0) == 100.0  # the last power held for exactly the limit
    assert power.at(10.5) == 50.0  # past it: nothing invented
    counter = Trace(5.0, counter=True)
    counter.add(0.0, None, 0.0)
    counter.add(5.0, None, 20.0)
    assert counter.take_range() == (4.0, 4.0)  # its interval's mean power


def test_a_counter_is_interpolated_over_intervals_of_any_length() -> None:
    """On the monotonic clock (long since boot); its range is of its intervals' mean
    powers, but for one longer than the gap limit."""
    counter = Trace(10.0, counter=True)
    for t, raw in ((1000.0, 0.0), (1002.0, 20.0), (1006.0, 100.0), (1026.0, 700.0)):
        counter.add(t, None, raw)
    assert (counter.at(1001.0), counter.at(1004.0)) == (10.0, 60.0)
    assert counter.take_range() == (10.0, 20.0)
    assert counter.take_range() is None  # begun anew, empty: no interval since


def test_before_the_oldest_reading_kept_the_oldest_count_stands() -> None:
    power = Trace(10.0)
    for t in range(KEEP_POINTS + 5):  # 1 W: a joule a second
        power.add(float(t), 1.0)
    assert power.at(0.0) == 5.0  # the oldest kept: 5 s


def test_a_power_range_begins_anew_at_the_last_reading() -> None:
    power = Trace(10.0)
    assert power.take_range() is None
    power.add(0.0, 7.0)
    assert power.take_range() == (7.0, 7.0)
    for t, watts in ((1.0, 9.0), (2.0, 3.0)):
        power.add(t, watts)
    assert power.take_range() == (3.0, 9.0)
    assert power.take_range() == (3.0, 3.0)  # the power at the edge is in both
    power.add(3.0, 4.0)
    assert power.take_range() == (3.0, 4.0)
