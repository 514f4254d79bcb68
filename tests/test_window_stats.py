"""Window statistics: for the run and each phase, the lowest, mean and
highest of the device's power (from every reading of the sensor, not one a pass), of
the target's CPU utilization and of its memory. The power on the 1 kHz stand-in
INA3221 (tests/power_standin.py) at a 5 W floor with a 50 ms spike at 20 W: what a
Jetson power-mode budget (10 W / 15 W / MAXN) is checked against."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.phases import HEADER, phase_table
from edgewatt.cli.top import detail_lines
from edgewatt.core.power.trace import Trace
from edgewatt.core.targets.history import History, Phase
from edgewatt.core.targets.row import SampleRow
from edgewatt.core.targets.summary import phase_figures, spreads, summarize_phase
from tests.conftest import wait_for
from tests.power_standin import build_tree, start_writer

FLOOR_MA, SPIKE_MA = 1000, 4000  # 5 W and 20 W at the stand-in's 5 V
SPIKE_S = 0.05


@pytest.fixture
def spiky(tmp_path: Path) -> Any:
    """(sysfs root, start the writer: 5 W with a 50 ms spike at 20 W ``at`` s in)."""
    root = tmp_path / "sys"
    current = build_tree(root)
    # The floor before the writer starts: the daemon starts (slowly on a busy machine)
    # before the writer, so no reading of the tree's own 4 W is in the run.
    current.write_text(f"{FLOOR_MA:04d}\n")
    waves = []

    def writer(at: float) -> Any:
        waves.append(
            start_writer(
                current,
                tmp_path / "writer.log",
                square_hz=0.0,
                bursts=[(at, SPIKE_S)],
                currents_ma=(FLOOR_MA, FLOOR_MA, SPIKE_MA),
            )
        )
        return waves[-1]

    yield root, writer
    for wave in waves:
        wave.stop()


def test_a_trace_keeps_its_lowest_and_highest_as_readings_arrive() -> None:
    trace = Trace(max_gap_s=5.0)
    assert trace.take_range() is None  # nothing read
    for t, watts in [(0.0, 5.0), (0.1, 20.0), (0.2, 4.5), (0.3, 5.0)]:
        trace.add(t, watts)
    assert trace.take_range() == (4.5, 20.0)
    # The next interval begins at the last reading: the power at the edge is in both.
    assert trace.take_range() == (5.0, 5.0)
    trace.add(0.4, 7.0)
    assert trace.take_range() == (5.0, 7.0)
    # A counter's are its intervals' mean powers (joules over seconds).
    counter = Trace(max_gap_s=5.0, counter=True)
    for t, joules in [(0.0, 100.0), (0.5, 105.0), (1.0, 106.0)]:
        counter.add(t, None, joules)
    assert counter.take_range() == (2.0, 10.0)
    assert counter.take_range() is None  # no interval since


def _row(t: float, utilization: float | None, rss: int) -> SampleRow:
    figures = dict.fromkeys(SampleRow._fields)  # a figure not read: None
    figures.update(time=t, cpu_user_s=0.0, cpu_system_s=0.0, cpu_utilization=utilization)
    figures.update(memory_rss_bytes=rss, memory_virtual_bytes=0, threads=1, processes=1)
    figures.update(monotonic=t)
    return SampleRow(**figures)


def test_a_phase_counts_the_intervals_between_its_samples_and_the_passes_without_rows() -> None:
    history = History(capacity=100)
    history.add(_row(0.0, 0.9, 100))  # before the phase
    history.note(None, 6.0, 30.0)  # the interval before the phase's first sample
    phase = Phase("train", started_at=1.0)
    history.start_phase(phase, 1.0)
    history.add(_row(1.0, 0.8, 400))  # its first sample: the interval ending here is before it
    history.note(None, 5.0, 5.5)
    history.note(None, 5.0, 19.0)  # a pass on demand for another target: no row here
    history.add(_row(2.0, 0.25, 300))
    history.note(None, 4.75, 6.0)
    history.add(_row(3.0, 0.5, 200))
    history.end_phase(3.5)
    history.note(None, 5.0, 5.0)
    history.add(_row(4.0, 0.75, 500))  # its closing sample: in it
    history.note(None, 1.0, 50.0)
    history.add(_row(5.0, 0.0, 50))  # after it
    assert spreads(phase.power, phase.cpu_utilization, phase.memory) == {
        "power_min_w": 4.75,
        "power_max_w": 19.0,
        "cpu_utilization_min": 0.25,
        "cpu_utilization_max": 0.75,
        "memory_pss_peak_bytes": None,  # not read
        "memory_rss_largest_peak_bytes": None,
        "memory_rss_peak_bytes": 500,
        "memory_rss_min_bytes": 200,
        "memory_rss_avg_bytes": 350,  # (400 + 300 + 200 + 500) / 4
    }
    assert phase_figures(phase).power_max_w == 19.0
    item = summarize_phase(phase, logical_cpus=4, carbon=None, period_s=None)
    assert (item["memory_rss_peak_bytes"], item["power_max_w"]) == (500, 19.0)
    # The run: every interval after its first sample, every sample.
    assert (history.power.low, history.power.high) == (1.0, 50.0)
    assert (history.cpu_utilization.low, history.cpu_utilization.high) == (0.0, 0.8)
    assert (history.memory.rss.low, history.memory.rss.high) == (50, 500)


def test_a_50_ms_spike_in_a_phase_is_its_peak_power_on_metrics_and_in_its_summary(
    spiky: Any, daemon_factory: Any, spawn: Any
) -> None:
    # The daemon's steady rate 10 Hz: a 50 ms spike falls between two readings half the
    # time. The phase's first 2 s are read at the window rate (200 Hz): ~10 readings.
    root, writer = spiky
    daemon = daemon_factory(
        interval=1.0,
        env={
            "EDGEWATT_SYSFS_PATH": str(root),
            "EDGEWATT_POWER_SOURCES": "ina3221",
            "EDGEWATT_POWER_SAMPLE_HZ": "10",
        },
    )
    sleeper = spawn("import time; time.sleep(120)")
    tid = daemon.register(sleeper.pid)["id"]
    wave = writer(at=1.5)  # the spike 1.5 s after the writer's start, the daemon up
    spike_at = wave.changes()[0][0] + 1.5
    assert time.monotonic() < spike_at - 0.6, "the writer took too long to start"
    time.sleep(max(0.0, spike_at - 0.5 - time.monotonic()))
    path = f"/v1/targets/{tid}/phase"
    assert daemon.call("POST", path, {"name": "spike"})[0] == 201
    time.sleep(max(0.0, spike_at + 0.5 - time.monotonic()))
    assert daemon.call("POST", path, {"name": "calm"})[0] == 201
    time.sleep(1.0)
    status, ended = daemon.call("DELETE", path)
    assert status == 200, ended
    assert time.monotonic() < spike_at + 0.5 + 2.0  # calm was young all along
    summary = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
    spike, calm = summary["phases"]
    # What the file held: any reading inside the spike is 5000 mV x 4000 mA, 20.0 W.
    assert spike["power_max_w"] == 20.0, spike
    assert spike["power_min_w"] == 5.0
    # The mean is the device's energy over the phase's own time: 5 W all along, and
    # 15 W more for 50 ms (each 15 W step interpolated over one 5 ms period at most).
    duration = spike["duration_s"]
    # Each of the three rounded to 1 mJ, 1 ms, 1 mW: apart by as much as those allow.
    mean = spike["device_power_avg_w"]
    rounding = 0.0005 + 0.0005 * (1.0 + mean) / duration
    assert mean == pytest.approx(spike["device_energy_j"] / duration, abs=rounding)
    assert spike["device_energy_j"] == pytest.approx(5.0 * duration + 15.0 * SPIKE_S, rel=0.03)
    assert (calm["power_min_w"], calm["power_max_w"]) == (5.0, 5.0)
    assert ended["phase"]["power_max_w"] == 5.0  # DELETE's answer: the phase ended
    # 5 W at every reading from before the phase to after it: exact, to the mW shown.
    assert calm["device_power_avg_w"] == 5.0, calm
    # The run holds the spike too; a sleeper's CPU and memory have their own spreads.
    assert (summary["power_min_w"], summary["power_max_w"]) == (5.0, spike["power_max_w"])
    for item in (summary, spike, calm):
        assert 0.0 <= item["cpu_utilization_min"] <= item["cpu_utilization_max"] < 0.05
        low, mean = item["memory_rss_min_bytes"], item["memory_rss_avg_bytes"]
        assert 0 < low <= mean <= item["memory_rss_peak_bytes"]
    # In the phase table run, summary and report print, and in top's detail view.
    [row] = [line for line in phase_table(summary["phases"]) if line.strip().startswith("spike")]
    cells = [cell.strip() for cell in row.split("  ") if cell.strip()]
    assert cells[HEADER.index("peak power")] == f"{spike['power_max_w']:.2f} W"
    target = {**daemon.call("GET", f"/v1/targets/{tid}")[1], "summary": summary}
    lines = detail_lines(target, cpus=None, width=80)
    header = next(line for line in lines if line.startswith("PHASE"))
    [row] = [line for line in lines if line.startswith("spike")]
    column = header.index("PEAK W") + len("PEAK W")
    assert row[:column].split()[-1] == f"{spike['power_max_w']:.2f}"
    # On /metrics, per phase, the next pass on.
    series = "edgewatt_process_phase_power_max_watts"
    wait_for(lambda: daemon.value(series, edgewatt_target_id=tid, edgewatt_phase="calm"))
    assert (
        daemon.value(series, edgewatt_target_id=tid, edgewatt_phase="spike")
        == (spike["power_max_w"])
    )
    assert daemon.value(series, edgewatt_target_id=tid, edgewatt_phase="calm") == 5.0
