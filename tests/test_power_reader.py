"""Energy at the sensor's rate: a stand-in INA3221 (and a stand-in tegrastats printing
it at its --interval) whose power follows a known waveform, read by the real power
reader and by the real daemon; the figures against the exact integral of what the
stand-in's file held (tests/power_standin.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.power import ina3221, native
from edgewatt.core.power import meter as meter_module
from edgewatt.core.power.allowance import WindowAllowance
from edgewatt.core.power.meter import (
    PowerMeter,
    sample_hz_from_environment,
    window_hz_from_environment,
)
from edgewatt.core.power.rate import RateController, auto_rate
from edgewatt.core.power.source import AUTO_BUDGET, PowerOptions, PowerReading, PullSource
from edgewatt.core.power.values import PowerStatus
from tests.conftest import ROOT, DaemonProcess, wait_for
from tests.power_standin import Waveform, stand_in_board
from tests.test_native_reader import thread_priority_allowed

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")


def why_no_extension_builds() -> str | None:
    """Why this interpreter cannot build a C extension here (None: it can): its own
    compiler, asked to compile what every extension starts with, as setuptools would."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(compiler[0]) is None:
        return f"no C compiler: {compiler[0]} is not on PATH"
    include = sysconfig.get_paths()["include"]
    asked = subprocess.run(
        [*compiler, "-fsyntax-only", "-I", include, "-x", "c", "-"],
        input="#include <Python.h>\n", capture_output=True, text=True,
    )  # fmt: skip
    if asked.returncode != 0:
        return f"{compiler[0]} cannot compile against {include}/Python.h: {asked.stderr[:300]}"
    return None


def test_the_native_reader_is_built_where_the_machine_can_build_it() -> None:
    # An install without a compiler or Python's headers falls back to the Python reader
    # (the extension is optional); where both are, a build that broke must not pass as
    # that fallback.
    why = why_no_extension_builds()
    if why is not None:
        pytest.skip(f"the native reader cannot be built here: {why}")
    assert native._stream is not None, "the compiler works, yet _stream.c was not built"
    assert native.available() == (os.environ.get("EDGEWATT_NATIVE_READER", "1") != "0")


@pytest.fixture
def board(tmp_path: Path) -> Any:
    """(sysfs root, current file, start a writer)."""
    yield from stand_in_board(tmp_path)


@pytest.fixture(params=["native", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which reads the stream: the native reader (where it was built) or Python's."""
    if request.param == "native" and native._stream is None:
        pytest.skip("the native reader was not built (no C compiler?)")
    monkeypatch.setenv("EDGEWATT_NATIVE_READER", "1" if request.param == "native" else "0")
    return request.param


def test_ten_seconds_of_a_square_wave_within_one_percent(board: Any, reader: str) -> None:
    # 4 W / 14 W at 3 Hz plus a 150 ms burst at 24 W, read at 50 Hz (what the automatic
    # rate settles at on this VM), with a pass each second as the daemon runs them.
    root, _, writer = board
    wave = writer(square_hz=3.0, bursts=[(4.2, 0.15)])
    source = ina3221.discover(PowerOptions(sysfs_path=str(root)))
    meter = PowerMeter([source], max_gap_s=5.0, sample_hz=50.0)
    meter.start()
    assert meter.reader == reader
    try:
        t0 = time.monotonic()
        e0 = meter.read(t0).host_energy_j  # type: ignore[union-attr]
        readings0 = meter.readings
        for second in range(1, 11):
            time.sleep(max(0.0, t0 + second - time.monotonic()))
            snapshot = meter.read(time.monotonic())
        assert snapshot is not None and snapshot.measured_at is not None
        t1, e1 = snapshot.measured_at, snapshot.host_energy_j
        readings = meter.readings - readings0
    finally:
        meter.close()
    exact = wave.energy(t0, t1)
    assert e1 is not None and e0 is not None
    assert e1 - e0 == pytest.approx(exact, rel=0.01), (e1 - e0, exact)
    # At the sensor's rate, not the pass's: most of 10 s x 50 Hz came (a busy machine
    # may delay some), plus one per pass.
    assert readings >= 0.6 * 50 * 10
    assert snapshot.period_s == pytest.approx(1 / 50)


def test_the_python_reader_says_how_late_each_reading_came(
    board: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEWATT_NATIVE_READER", "0")
    source = ina3221.discover(PowerOptions(sysfs_path=str(board[0])))
    meter = PowerMeter([source], max_gap_s=5.0, sample_hz=100.0).start()
    wait_for(lambda: meter.readings >= 10)  # streamed ones, beside the start's
    meter.close()
    late = meter.reader_lateness()
    # One figure per streamed reading (the start's own reading is not the stream's),
    # its time against its deadline: never before it.
    assert len(late) == meter.readings - 1 > 0
    assert all(x >= 0 for x in late)
    assert meter.reader_lateness() == [] and meter.reader_ahead() == ""


@pytest.mark.parametrize("drains", [True, False], ids=["drained", "not-drained"])
def test_edges_further_apart_than_a_native_ring_lose_no_reading(
    board: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, drains: bool
) -> None:
    # A ring of 100 readings (0.5 s at 200 Hz), edges 2 s apart (a long pass interval
    # at this scale): drained between edges, the energy is whole; without those drains
    # (the control) the ring drops the oldest readings, a gap the trace cannot bridge.
    if native._stream is None:
        pytest.skip("the native reader was not built (no C compiler?)")
    monkeypatch.setenv("EDGEWATT_NATIVE_READER", "1")
    monkeypatch.setattr(native, "RING_READINGS", 100)
    monkeypatch.setattr(meter_module, "NATIVE_DRAIN_S", 0.1 if drains else 1e9)
    root, _, writer = board
    wave = writer(square_hz=3.0, bursts=[])
    source = ina3221.discover(PowerOptions(sysfs_path=str(root)))
    meter = PowerMeter([source], max_gap_s=0.25, sample_hz=200.0)
    meter.start()
    try:
        e0 = meter.read(t0 := time.monotonic()).host_energy_j  # type: ignore[union-attr]
        time.sleep(2.0)
        e1 = meter.read(t1 := time.monotonic()).host_energy_j  # type: ignore[union-attr]
    finally:
        meter.close()
    exact = wave.energy(t0, t1)
    assert e0 is not None and e1 is not None
    if drains:
        assert e1 - e0 == pytest.approx(exact, rel=0.01), (e1 - e0, exact)
        assert "dropped" not in caplog.text
    else:
        assert e1 - e0 < 0.5 * exact
        assert "readings dropped, its ring was full" in caplog.text


def test_between_passes_a_burst_is_seen(board: Any) -> None:
    # Passes 1 s apart; a 150 ms burst at 24 W between them. One reading per pass
    # would integrate 4 W across it (-43 %); the stream holds it. At 200 Hz: each of the
    # burst's two 20 W steps is interpolated across one period (5 ms), at most 0.05 J
    # off (0.7 %) when a reading comes on time; a busy machine delays some.
    root, _, writer = board
    wave = writer(square_hz=0.0, bursts=[(0.4, 0.15)])
    source = ina3221.discover(PowerOptions(sysfs_path=str(root)))
    meter = PowerMeter([source], max_gap_s=5.0, sample_hz=200.0)
    start = wave.changes()[0][0]
    meter.start()
    try:
        e0 = meter.read(t0 := start + 0.1).host_energy_j  # type: ignore[union-attr]
        time.sleep(max(0.0, start + 1.1 - time.monotonic()))
        e1 = meter.read(t1 := time.monotonic()).host_energy_j  # type: ignore[union-attr]
    finally:
        meter.close()
    exact = wave.energy(t0, t1)
    assert exact == pytest.approx(4.0 * (t1 - t0) + 20.0 * 0.15, rel=0.02)
    assert e1 - e0 == pytest.approx(exact, rel=0.03)  # type: ignore[operator]


def test_a_young_window_is_read_at_the_window_rate_beside_a_slow_steady_rate(
    board: Any, reader: str
) -> None:
    # The steady stream at 10 Hz (what the automatic rate gives a Nano-class core), the
    # window rate at 200 Hz: a 300 ms window holding a 150 ms burst at 24 W, its edges
    # two edges of the meter as the sampler takes them, the first saying a window is
    # young. Read at 200 Hz the burst's two 20 W steps are each interpolated across
    # 5 ms (0.05 J of about 4.2 J at most); at 10 Hz they could be 0.5 J off each.
    root, _, writer = board
    wave = writer(square_hz=0.0, bursts=[(1.0, 0.15)])
    source = ina3221.discover(PowerOptions(sysfs_path=str(root)))
    meter = PowerMeter([source], max_gap_s=5.0, sample_hz=10.0, window_hz=200.0).start()
    assert meter.reader == reader
    start = wave.changes()[0][0]
    try:
        time.sleep(max(0.0, start + 0.925 - time.monotonic()))
        t0 = time.monotonic()
        e0 = meter.read(t0, window_until=t0 + 2.0).host_energy_j  # type: ignore[union-attr]
        readings0 = meter.window_readings
        time.sleep(0.3)
        last = meter.read(t1 := time.monotonic())  # the window ended: none young
        fine = meter.window_readings - readings0
        time.sleep(0.3)
        idle = meter.window_readings
        time.sleep(0.3)
        assert meter.window_readings - idle <= 1  # stopped at its next reading
        after = meter.read(time.monotonic())
    finally:
        meter.close()
    assert last is not None and last.host_energy_j is not None and e0 is not None
    exact = wave.energy(t0, t1)
    assert exact == pytest.approx(4.0 * (t1 - t0) + 20.0 * 0.15, rel=0.03)
    assert last.host_energy_j - e0 == pytest.approx(exact, rel=0.05), (last, exact)
    # At the window rate from its first edge on (a busy machine delays some readings),
    # and said so: the window is resolved at 5 ms, the next interval at 100 ms.
    assert fine >= 0.5 * 200 * 0.3
    assert last.period_s == pytest.approx(1 / 200)
    assert after is not None and after.period_s == pytest.approx(1 / 10)
    # Each edge says the device's lowest and highest power since the one before, from
    # every reading (the file's own values: 800 and 4800 mA at 5 V): the burst is the
    # window's highest, though the edge's own reading is 4 W.
    assert (last.power_min_w, last.power_max_w, last.host_power_w) == (4.0, 24.0, 4.0)
    assert (after.power_min_w, after.power_max_w) == (4.0, 4.0)


class Costly(PullSource):
    """A board source whose every reading costs ``cost_s`` of the reader thread's CPU."""

    name = "costly"
    board = True

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def read(self) -> PowerReading:
        return PowerReading(source=self.name, monotonic=time.monotonic(), total_w=5.0)

    def read_total(self) -> tuple[float, float]:
        end = time.thread_time() + self.cost_s
        while time.thread_time() < end:
            pass
        return time.monotonic(), 5.0


def test_windows_spend_an_allowance_and_then_get_the_steady_rate() -> None:
    # 2 ms of CPU a reading: the full allowance (10 s of the 0.5 % budget, 50 ms of
    # CPU) buys about 25 readings at the window rate, whatever the load (the thread's
    # own CPU clock), and its refill (what the budget leaves the windows: 2.5 ms of CPU
    # a second here) about one more a second. Then the window thread stops, and the
    # window is said to be read at the steady rate.
    meter = PowerMeter([Costly(2e-3)], max_gap_s=5.0, sample_hz=5.0, window_hz=200.0).start()
    try:
        t0 = time.monotonic()
        meter.read(t0, window_until=t0 + 10.0)
        wait_for(lambda: meter.windows.since is None, timeout=20)
        spent = meter.window_readings
        assert 20 <= spent <= 27
        # As if the steady stream were measured at the whole budget: nothing refills.
        meter.rate.usage = AUTO_BUDGET
        t1 = time.monotonic()
        snapshot = meter.read(t1, window_until=t1 + 10.0)
        assert snapshot is not None and snapshot.period_s == pytest.approx(1 / 5)
        assert meter.windows_refused == 1
        time.sleep(0.3)
        assert meter.window_readings == spent
        snapshot = meter.read(time.monotonic())
        assert snapshot is not None and snapshot.period_s == pytest.approx(1 / 5)
    finally:
        meter.close()


TRACKED = """
import json, sys, time
from edgewatt import client
start, lead = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - lead - time.monotonic()))
before = time.monotonic()
with client.track("burst") as t:
    inside_from = time.monotonic()
    time.sleep(0.3)
    inside_to = time.monotonic()
after = time.monotonic()
times = {"before": before, "after": after, "inside_from": inside_from, "inside_to": inside_to}
print(json.dumps({**times, **t.last._asdict()}))
"""


def tracked_call(daemon: DaemonProcess, burst_at: float) -> dict[str, Any]:
    """A client process's 300 ms ``track`` call holding the burst 75 ms after its start."""
    out = subprocess.run(
        [sys.executable, "-c", TRACKED, str(burst_at), "0.075"],
        env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def assert_window(measured: dict[str, Any], wave: Waveform) -> None:
    # The call's edges are passes the daemon runs during the API calls of entering
    # and leaving: after `before` and before the block runs, after the block and
    # before `after`. The exact energy of the window lies between the two integrals
    # (a few ms at 4 W apart, more on a busy machine), the burst inside both.
    inner = wave.energy(measured["inside_from"], measured["inside_to"])
    outer = wave.energy(measured["before"], measured["after"])
    assert inner > 0.15 * 20.0  # the burst is inside
    assert 0.95 * inner <= measured["device_energy_j"] <= 1.05 * outer, (measured, inner, outer)
    assert measured["shorter_than_sensor_period"] is False
    # The call's peak: the burst's 24 W, as the file (or tegrastats' line) held it.
    assert measured["power_max_w"] == 24.0, measured


@pytest.mark.parametrize("steady_hz", [200, 10])
def test_a_tracked_call_over_a_burst_from_sysfs(
    board: Any, daemon_factory: Any, steady_hz: int
) -> None:
    # At a steady 200 Hz, and at 10 Hz (as the automatic rate leaves a Nano-class
    # core) with the window rate as configured by default: the call's first edge (a
    # phase opened) starts it, and /healthz counts its readings. The window rate is
    # used only where it is above the steady one.
    root, _, writer = board
    daemon = daemon_factory(
        interval=1.0,
        env={
            "EDGEWATT_SYSFS_PATH": str(root),
            "EDGEWATT_POWER_SOURCES": "ina3221",
            "EDGEWATT_POWER_SAMPLE_HZ": str(steady_hz),
        },
    )
    health = daemon.call("GET", "/healthz")[1]
    assert health["power_window_hz"] == 200.0 and health["power_window_readings"] == 0
    assert health["power_reader"] == ("native" if native.available() else "python")
    # Its thread as far ahead as this daemon may take it (root here: SCHED_FIFO).
    allowed = thread_priority_allowed() if native.available() else "process"
    assert health["power_reader_priority"] == allowed
    wave = writer(square_hz=0.0, bursts=[(3.0, 0.15)])
    assert_window(tracked_call(daemon, wave.changes()[0][0] + 3.0), wave)
    health = daemon.call("GET", "/healthz")[1]
    if steady_hz < 200:
        assert health["power_window_readings"] >= 0.5 * 200 * 0.3
    else:
        assert health["power_window_readings"] == 0
    assert health["power_windows_refused"] == 0


def test_a_tracked_call_over_a_burst_from_tegrastats(board: Any, daemon_factory: Any) -> None:
    # The stand-in prints what the file holds at each line, at the --interval the
    # daemon runs it with (1 / power_sample_hz).
    _, current, writer = board
    log = current.parent / "tegrastats-args"
    daemon = daemon_factory(
        interval=1.0,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            "EDGEWATT_POWER_SAMPLE_HZ": "200",
            "FAKE_TEGRASTATS_POWER_FILE": str(current),
            "FAKE_TEGRASTATS_LOG": str(log),
        },
    )
    wave = writer(square_hz=0.0, bursts=[(3.0, 0.15)])
    assert_window(tracked_call(daemon, wave.changes()[0][0] + 3.0), wave)
    assert log.read_text().split() == ["--interval", "5"]


def test_the_automatic_rate_is_the_highest_within_half_a_percent_of_one_core() -> None:
    # 0.5 % of one core is 5 ms of CPU a second.
    assert auto_rate(20e-6) == 200.0
    assert auto_rate(90e-6) == 50.0  # this VM's INA3221 reading (docs/performance.md)
    assert auto_rate(450e-6) == 10.0  # the same on a core a fifth as fast (a Nano's)
    assert auto_rate(2e-3) == 5.0  # none is within: the lowest


def test_the_reader_settles_at_the_rate_its_own_measured_cost_allows() -> None:
    # 0.3 ms a reading plus the thread's wake: 20 Hz would cost 6 ms a second or more,
    # 10 Hz about 4 (5 where a loaded machine makes the wake cost 0.2 ms or more, as CI
    # has seen): after its first window it reads at the rate its measured cost allows
    # (the cost is the thread's own CPU clock, not the wall).
    meter = PowerMeter([Costly(3e-4)], max_gap_s=5.0, calibration_s=2.0).start()
    try:
        assert meter.sample_hz == 50.0  # where it starts
        cost = wait_for(lambda: meter.rate.cost_s, timeout=10)
        assert cost >= 3e-4
        assert meter.sample_hz == auto_rate(cost) in (10.0, 5.0)
        period = meter.read(time.monotonic()).period_s  # type: ignore[union-attr]
        assert period == pytest.approx(1 / meter.sample_hz)
    finally:
        meter.close()
    fixed = PowerMeter([Costly(3e-4)], max_gap_s=5.0, sample_hz=50.0, calibration_s=2.0).start()
    try:
        wait_for(lambda: fixed.rate.cost_s is not None, timeout=10)
        assert fixed.sample_hz == 50.0  # a configured rate is kept, its cost measured
    finally:
        fixed.close()


def test_the_steady_rate_makes_room_for_what_the_windows_spent() -> None:
    # The state machine fed a window of 10 s at 50 Hz (0.4 % of a core), and what the
    # window thread spent in it: none leaves the whole 0.5 % to the steady rate; 2 ms
    # a second (0.2 %) leaves 0.3 %: 50 Hz is over, one rate down; 4 ms a second would
    # leave 0.1 %, and the steady rate keeps half the budget whatever the windows spend.
    rate = RateController(None)

    def window(usage: float, windows_cpu_s: float) -> float:
        return rate.calibrate(usage * 10, 10.0, round(rate.hz * 10), windows_cpu_s)

    assert window(0.004, 0.0) == 50.0
    assert window(0.004, 0.02) == 20.0
    assert rate.budget == pytest.approx(0.003)
    assert window(0.0016, 0.04) == 20.0 and rate.budget == pytest.approx(0.0025)
    assert window(0.0016, 0.0) == 20.0 and rate.budget == pytest.approx(0.005)


def test_a_higher_rate_is_tried_now_and_then_and_kept_only_within_the_budget() -> None:
    # The state machine alone, fed the windows' measured usage (no thread).
    rate = RateController(None)

    def window(usage: float) -> float:
        return rate.calibrate(usage * 10, 10.0, round(rate.hz * 10))  # CPU, wall, readings

    assert [window(0.004) for _ in range(7)] == [50.0] * 6 + [100.0]  # tried after 6
    assert window(0.0045) == 100.0  # it holds: kept
    assert [window(0.004) for _ in range(6)] == [100.0] * 6
    assert window(0.004) == 200.0  # tried
    assert window(0.008) == 100.0  # over: back, and the next try waits twice as long
    assert [window(0.004) for _ in range(12)] == [100.0] * 12
    assert window(0.004) == 200.0
    assert window(0.009) == 100.0 and rate.probe_wait == 24
    fixed = RateController(50.0)
    fixed.calibrate(1.0, 10.0, 500)  # 10 % of a core: measured, not acted on
    assert fixed.hz == 50.0 and fixed.usage == pytest.approx(0.1)


def test_the_full_allowance_buys_26_readings_of_2_ms_at_200_hz() -> None:
    # The window thread's accounting without the thread: 2 ms of CPU a reading at
    # 200 Hz, the steady rate not measured yet (taken at half the budget, so 2.5 ms a
    # second refills). The allowance starts at 50 ms: after k readings 50 ms - k x
    # (2 ms - 2.5 ms x 5 ms) is left, above 0 up to k = 25, so the readings at k = 0..25
    # are taken and the window rate stops at the 27th.
    windows = WindowAllowance(200.0, now=0.0)
    assert windows.open(0.0, 10.0, steady_hz=5.0, steady_usage=None)
    taken = 0
    for k in range(100):
        now = k / 200.0
        windows.charge(now, 2e-3 if k else 0.0, steady_usage=None)
        if not windows.reading(now):
            break
        taken += 1
    assert taken == 26 and windows.since is None
    assert windows.cpu_s == pytest.approx(26 * 2e-3)
    # Spent, with the steady rate measured at the whole budget (nothing refills): a
    # window opened now is refused, and counted; the steady rate makes room for what
    # the windows spent (rate.py) once, at its next calibration.
    assert not windows.open(0.2, 10.2, steady_hz=5.0, steady_usage=AUTO_BUDGET)
    assert windows.refused == 1 and windows.since is None
    assert windows.take_spent() == pytest.approx(0.052) and windows.take_spent() == 0.0
    # 20 s later, at the steady rate's usage of half the budget: 50 ms refilled, less
    # what the last reading overspent (50 + 0.3 refilled in the window - 52 ms).
    assert windows.open(20.2, 22.2, steady_hz=5.0, steady_usage=AUTO_BUDGET / 2)
    assert windows.left_s == pytest.approx(0.05 + 0.0025 * 0.125 - 0.052 + 0.05)
    # Never more than 10 s of the whole budget, however long none opened.
    windows.refill(1000.0, steady_usage=0.0)
    assert windows.left_s == pytest.approx(AUTO_BUDGET * 10)


def test_a_window_ends_with_its_youth_and_is_not_read_where_no_finer() -> None:
    windows = WindowAllowance(200.0, now=0.0)
    # No finer than the steady rate: not read at the window rate, and not refused.
    assert not windows.open(1.0, 3.0, steady_hz=200.0, steady_usage=None)
    assert windows.since is None and windows.refused == 0
    assert windows.open(1.0, 3.0, steady_hz=10.0, steady_usage=None)
    assert not windows.fine_since(None) and not windows.fine_since(0.9)
    assert windows.fine_since(1.0)  # read finely all along since that edge
    # A second edge while it is young: longer, not a new start.
    assert not windows.open(1.5, 3.5, steady_hz=10.0, steady_usage=None)
    assert windows.since == 1.0 and windows.reading(3.4) and not windows.reading(3.5)
    # An edge that says none is young: the window rate stops at its next reading.
    assert windows.open(4.0, 6.0, steady_hz=10.0, steady_usage=None)
    assert not windows.open(4.2, None, steady_hz=10.0, steady_usage=None)
    assert not windows.reading(4.2) and windows.since is None


def test_the_status_says_what_reads_at_which_rates() -> None:
    meter = PowerMeter([Costly(0.0)], max_gap_s=5.0, sample_hz=20.0, window_hz=100.0)
    assert meter.status() == PowerStatus(
        sources=("costly",),
        reader="none",
        sample_hz=20.0,
        reading_cpu_s=None,
        window_hz=100.0,
        window_readings=0,
        windows_refused=0,
    )
    meter.start()
    try:
        assert meter.status().reader == "python"  # no native stream: not a sysfs file
        assert meter.status().reader_priority == "process"  # a GIL is no priority's
        meter.read(t0 := time.monotonic(), window_until=t0 + 0.3)
        wait_for(lambda: meter.windows.since is None, timeout=10)
        status = meter.status()
        assert status.window_readings == meter.window_readings > 0
    finally:
        meter.close()


def test_in_process_rates_from_the_daemons_variables(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The client samples in-process where no daemon runs: the same variables, a bad
    # value logged and replaced by the default (monitoring never raises).
    monkeypatch.delenv("EDGEWATT_POWER_SAMPLE_HZ", raising=False)
    monkeypatch.delenv("EDGEWATT_POWER_WINDOW_HZ", raising=False)
    assert (sample_hz_from_environment(), window_hz_from_environment()) == (None, 200.0)
    monkeypatch.setenv("EDGEWATT_POWER_SAMPLE_HZ", "20")
    monkeypatch.setenv("EDGEWATT_POWER_WINDOW_HZ", "0")
    assert (sample_hz_from_environment(), window_hz_from_environment()) == (20.0, 0.0)
    monkeypatch.setenv("EDGEWATT_POWER_SAMPLE_HZ", "0")
    monkeypatch.setenv("EDGEWATT_POWER_WINDOW_HZ", "fast")
    assert (sample_hz_from_environment(), window_hz_from_environment()) == (None, 200.0)
    assert "EDGEWATT_POWER_SAMPLE_HZ='0' is not auto or a rate from 1 to 1000 Hz" in caplog.text
    assert (
        "EDGEWATT_POWER_WINDOW_HZ='fast' is not a rate (0: none) from 0 to 1000 Hz" in caplog.text
    )
    assert "200 Hz used" in caplog.text
