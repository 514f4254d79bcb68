"""Edges never wait for a power reading, with the stand-in tegrastats printing
a constant 5 W board input once a second, as `sample_hz: 1` runs the real one: a phase,
a tracked call, a registration costs the caller no wait for the next line; the edge's
instant is the call's; the window's device energy is the trace's integral over it,
final once the line after its end has come, and says so until then; windows nest.
(`edgewatt top` staying up through a slow answer: tests/test_top.py.)"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt import client
from edgewatt.client import DaemonBackend, Options
from tests.conftest import ROOT, DaemonProcess, wait_for

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
WATTS = 5.0  # the stand-in prints 5 V times the mA in its power file


@pytest.fixture
def once_a_second(daemon_factory: Any, tmp_path: Path) -> DaemonProcess:
    return start_once_a_second(daemon_factory, tmp_path)


def start_once_a_second(daemon_factory: Any, tmp_path: Path) -> DaemonProcess:
    """The daemon with the stand-in tegrastats printing a line a second, its board
    input from ``tmp_path``/curr1_input (5 W), each line logged (printed())."""
    current = tmp_path / "curr1_input"
    current.write_text("1000\n")  # 5 V x 1000 mA
    return daemon_factory(
        interval=1.0,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            "EDGEWATT_POWER_SAMPLE_HZ": "1",
            "FAKE_TEGRASTATS_POWER_FILE": str(current),
            "FAKE_TEGRASTATS_LINES": str(tmp_path / "lines.log"),
        },
    )


def printed(tmp_path: Path) -> list[tuple[float, float]]:
    """The stand-in's lines so far: (the monotonic instant it printed one, its W)."""
    path = tmp_path / "lines.log"
    text = path.read_text() if path.exists() else ""
    whole = text.split("\n")[:-1]  # a line being written has no newline yet
    return [(float(t), int(mw) / 1000) for t, mw in (line.split() for line in whole)]


def after_a_line(tmp_path: Path) -> float:
    """Waits for the stand-in's next line, then 0.1 s more: the next line is then
    0.9 s away. The line's instant."""
    seen = len(printed(tmp_path))
    lines = wait_for(lambda: (found := printed(tmp_path))[seen:] and found, timeout=5, step=0.01)
    time.sleep(max(0.0, lines[-1][0] + 0.1 - time.monotonic()))
    return lines[-1][0]


def assert_none_waited(costs: list[float]) -> None:
    """Edges placed 0.1 to 0.6 s after a line, the next 0.9 s after it: one that
    waited for that line took 0.25 s (the bound it waited), every time. None did: a
    few ms each, one of them slow at most (a busy machine's preemption)."""
    assert statistics.median(costs) < 0.05 and sum(c >= 0.2 for c in costs) <= 1, costs


def none_printed(tmp_path: Path, since: float) -> bool:
    """No line printed at or after ``since`` (monotonic) so far: no reading after an
    edge taken then can have reached the daemon."""
    return all(t < since for t, _ in printed(tmp_path))


@pytest.fixture
def reg(once_a_second: DaemonProcess) -> Iterator[client.Registration]:
    # This process alone (its children include the daemon), never in-process; the
    # registration over the API, so each test meets its own point first.
    path, pid = once_a_second.socket, os.getpid()
    backend = DaemonBackend(path, once_a_second.register(pid, children=False))
    registration = client.Registration(path, Options(pid, {}), "never", backend)
    yield registration
    registration.close()


def burn(cpu_s: float) -> None:
    """Work the kernel counts: this thread's CPU time grows by ``cpu_s``."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def test_no_edge_waits_for_a_line_printed_once_a_second(reg: client.Registration) -> None:
    costs = []
    for i in range(8):
        started = time.monotonic()
        reg.phase(f"p{i}")
        entered = time.monotonic()
        reg.end_phase()
        costs += [entered - started, time.monotonic() - entered]
    step = client.track("step", reg)
    for _ in range(8):
        started = time.monotonic()
        with step:
            entered = time.monotonic()
        costs += [entered - started, time.monotonic() - entered]
    # An edge that waits for the next line waits up to a quarter of a second at 1 Hz
    # (a line at most once a second): 50 ms is far from both.
    assert statistics.median(costs) < 0.05, costs


def test_a_phase_lasts_what_the_caller_timed(
    once_a_second: DaemonProcess, reg: client.Registration
) -> None:
    inside, outside = [], []
    for i in range(5):
        before = time.monotonic()
        with reg.phase(f"work-{i}"):
            started = time.monotonic()
            time.sleep(0.2)
            inside.append(time.monotonic() - started)
        outside.append(time.monotonic() - before)
    summary = once_a_second.call("GET", f"/v1/targets/{reg.id}/summary")[1]
    durations = [p["duration_s"] for p in summary["phases"]]
    # Its edges are taken within the calls that open and close it: between the
    # caller's own timing inside them and outside them (to the ms it is shown in),
    # and the caller's own timing within 10 ms (the calls' own time).
    timings = list(zip(durations, inside, outside))
    assert all(t - 0.0005 <= d <= o + 0.0005 for d, t, o in timings), timings
    assert statistics.median(d - t for d, t, _ in timings) < 0.010, timings


def test_a_window_says_when_its_energy_is_final_and_becomes_final(
    reg: client.Registration,
) -> None:
    ended = []
    for i in range(5):
        reg.phase(f"short-{i}")
        time.sleep(0.3)
        ended.append(reg.end_phase())
    # The line after each end comes up to a second later: the answers say they are not
    # final (the odd one whose line came within the call's few ms may be).
    assert all(isinstance(e["final"], bool) for e in ended)
    assert sum(not e["final"] for e in ended) >= 3, ended
    summary = reg.summary(final_wait_s=5.0)
    assert summary["final"] is True
    for phase in summary["phases"]:
        assert phase["final"] is True
        # A constant 5 W: the trace's integral over exactly the phase.
        assert phase["device_energy_j"] == pytest.approx(WATTS * phase["duration_s"], rel=0.01)
        assert phase["device_power_avg_w"] == pytest.approx(WATTS, rel=0.01)
    # Asked for with the wait, the phase's own answer is final too.
    reg.phase("waited")
    time.sleep(0.2)
    waited = reg.end_phase(final_wait_s=5.0)
    assert waited is not None and waited["final"] is True
    assert waited["device_energy_j"] == pytest.approx(WATTS * waited["duration_s"], rel=0.01)


def test_adjacent_phases_share_their_edge_and_add_up(reg: client.Registration) -> None:
    reg.phase("load")
    time.sleep(0.3)
    reg.phase("fit")  # ends "load" at the same edge: one sample closes it and opens "fit"
    time.sleep(0.3)
    reg.end_phase()
    load, fit = reg.summary(final_wait_s=5.0)["phases"]
    assert load["ended_at"] == fit["started_at"]
    assert load["final"] is True and fit["final"] is True
    both = load["device_energy_j"] + fit["device_energy_j"]
    assert both == pytest.approx(WATTS * (load["duration_s"] + fit["duration_s"]), rel=0.01)


def test_a_tracked_call_inside_a_phase_leaves_it_running(reg: client.Registration) -> None:
    step = client.track("step", reg)
    with reg.phase("epoch"):
        burn(0.1)
        with step:
            burn(0.1)
            inner = reg.summary()["phases"]
        burn(0.1)
    # While the call ran, both ran: the epoch outside, the call inside it.
    assert [(p["name"], p["ended_at"]) for p in inner] == [("epoch", None), ("step", None)]
    assert [p["depth"] for p in inner] == [0, 1]
    epoch, call = reg.summary(final_wait_s=5.0)["phases"]
    assert (epoch["name"], call["name"]) == ("epoch", "step")
    assert epoch["started_at"] <= call["started_at"] <= call["ended_at"] <= epoch["ended_at"]
    # The kernel's count, in ticks of 10 ms: the call's 0.1 s, the epoch's 0.3 s
    # around it (each edge's reading is a tick off at most).
    call_cpu = call["cpu_user_s"] + call["cpu_system_s"]
    epoch_cpu = epoch["cpu_user_s"] + epoch["cpu_system_s"]
    assert call_cpu >= 0.08
    assert epoch_cpu >= 0.28 and epoch_cpu >= call_cpu + 0.16, (epoch_cpu, call_cpu)
    assert epoch["duration_s"] > call["duration_s"] > 0
    assert epoch["device_energy_j"] > call["device_energy_j"] > 0
    measured = step.last
    assert measured is not None and measured.cpu_s is not None and measured.cpu_s >= 0.09
    assert measured.final in (True, False)


def test_phases_nest_by_depth_over_the_api(once_a_second: DaemonProcess) -> None:
    daemon = once_a_second
    target = daemon.register(os.getpid(), children=False)["id"]
    path = f"/v1/targets/{target}/phase"
    assert daemon.call("POST", path, {"name": "round"})[1]["depth"] == 0
    assert daemon.call("POST", path, {"name": "fit", "inside": True})[1]["depth"] == 1
    assert daemon.call("POST", path, {"name": "batch", "depth": 2})[1]["depth"] == 2
    # A phase at depth 1 ends the one there and the deeper ones, not the round.
    assert daemon.call("POST", path, {"name": "evaluate", "depth": 1})[1]["depth"] == 1
    status, ended = daemon.call("DELETE", f"{path}?depth=1&final=5")
    assert status == 200 and ended["ended"] == "evaluate" and ended["phase"]["final"] is True
    phases = daemon.call("GET", f"/v1/targets/{target}/summary")[1]["phases"]
    running = [p["name"] for p in phases if p["ended_at"] is None]
    assert running == ["round"]
    assert daemon.call("POST", path, {"name": "x", "depth": 99})[0] == 400
    assert daemon.call("GET", f"/v1/targets/{target}/summary?final=nan")[0] == 400


PHASED = (
    "import time\n"
    "from edgewatt import client\n"
    "reg = client.register(fallback='never')\n"
    "with reg.phase('work'):\n"
    "    time.sleep(0.3)\n"
)


def test_edgewatt_run_holds_final_figures(once_a_second: DaemonProcess, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", once_a_second.socket,
         "--output", str(out), "--", sys.executable, "-c", PHASED],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "EDGEWATT_SOCKET": once_a_second.socket},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "not final" not in result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    summary = records[-1]
    assert summary["type"] == "summary" and summary["final"] is True
    [work] = [p for p in summary["phases"] if p["name"] == "work"]
    assert work["final"] is True
    assert work["device_energy_j"] == pytest.approx(WATTS * work["duration_s"], rel=0.01)


# The same script, which then stops the power source (STAND_IN_PID): the lines after
# its last edges never come.
SILENCED = PHASED + "import os, signal\nos.kill(int(os.environ['STAND_IN_PID']), signal.SIGSTOP)\n"


def stand_in_pid(daemon: DaemonProcess) -> int:
    """The daemon's one child: the stand-in tegrastats."""
    assert daemon.proc is not None
    tasks = Path(f"/proc/{daemon.proc.pid}/task").glob("*/children")
    (child,) = [int(pid) for pid in " ".join(p.read_text() for p in tasks).split()]
    return child


def test_edgewatt_run_says_not_final_where_the_lines_never_came(
    once_a_second: DaemonProcess, tmp_path: Path
) -> None:
    out = tmp_path / "run.jsonl"
    child = stand_in_pid(once_a_second)
    try:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "edgewatt.cli", "run", "--socket", once_a_second.socket,
             "--output", str(out), "--", sys.executable, "-c", SILENCED],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
            env={**os.environ, "EDGEWATT_SOCKET": once_a_second.socket,
                 "STAND_IN_PID": str(child)},
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        os.kill(child, signal.SIGCONT)
    assert result.returncode == 0, result.stderr
    # It waited for the lines 3 s (POWER_FINAL_WAIT_S), then said what it has.
    assert 3.0 <= took < 10, took
    assert "not final" in result.stderr and "power reading after the last edge" in result.stderr
    summary = [json.loads(line) for line in out.read_text().splitlines()][-1]
    assert summary["type"] == "summary" and summary["final"] is False


def test_every_edge_returns_at_once_and_its_figures_become_final(
    once_a_second: DaemonProcess, tmp_path: Path
) -> None:
    # Each edge 0.1 to 0.6 s after a line, the next one 0.9 s after it: an edge that
    # waited for it waited 0.25 s (its bound then). Register, a phase's start and end,
    # a tracked call's start and end, unregister, three times over.
    daemon = once_a_second
    costs: dict[str, list[float]] = {}
    unfinal: dict[str, int] = {}

    def timed(kind: str, call: Any) -> tuple[Any, float]:
        before = time.monotonic()
        result = call()
        costs.setdefault(kind, []).append(time.monotonic() - before)
        return result, before

    def not_final_yet(kind: str, final: bool, since: float) -> None:
        # Said not final while no line after its edge has come; what came then is
        # checked below, final.
        if none_printed(tmp_path, since):
            assert final is False, kind
            unfinal[kind] = unfinal.get(kind, 0) + 1

    ids = []
    for i in range(3):
        after_a_line(tmp_path)
        opened, _ = timed(
            "register", lambda: client.register(socket=daemon.socket, fallback="never")
        )
        reg: client.Registration = opened
        assert reg.mode == "daemon"
        ids.append(reg.id)
        phase_from = time.monotonic()
        timed("phase start", lambda: reg.phase(f"phase-{i}"))  # noqa: B023 - called at once
        inside_from = time.monotonic()
        burn(0.05)
        inside_to = time.monotonic()
        ended, before = timed("phase end", reg.end_phase)
        phase_to = time.monotonic()
        assert ended is not None
        not_final_yet("phase", ended["final"], before)
        # Its instants are the calls': between the caller's clock around them.
        assert (
            inside_to - inside_from - 0.001 <= ended["duration_s"] <= phase_to - phase_from + 0.001
        )
        step = client.track("step", reg)
        timed("track start", step.__enter__)
        burn(0.05)
        _, before = timed("track end", lambda: step.__exit__(None, None, None))  # noqa: B023
        measured = step.last
        assert measured is not None and measured.final is not None
        not_final_yet("track", measured.final, before)
        _, before = timed("unregister", reg.close)
        status, summary = daemon.call("GET", f"/v1/targets/{ids[-1]}/summary")
        assert status == 200 and summary["state"] == "unregistered"
        not_final_yet("registration", summary["final"], before)
    everything = [c for kind in costs.values() for c in kind]
    assert_none_waited(everything)
    # Right after its edge no line had come for most windows: each kind said so.
    assert all(unfinal.get(k, 0) >= 2 for k in ("phase", "track", "registration")), unfinal
    # Once the lines after the edges have come, each window is final: the trace's
    # integral of a constant 5 W over exactly its span.
    for target in ids:
        status, summary = daemon.call("GET", f"/v1/targets/{target}/summary?final=5")
        assert status == 200 and summary["final"] is True
        assert summary["device_energy_j"] == pytest.approx(WATTS * summary["duration_s"], rel=0.01)
        for phase in summary["phases"]:
            assert phase["final"] is True
            assert phase["device_energy_j"] == pytest.approx(WATTS * phase["duration_s"], rel=0.01)


def test_a_monitors_edges_do_not_wait_for_a_line(
    once_a_second: DaemonProcess, tmp_path: Path
) -> None:
    # A monitor's phase mark waits for the reading its loop takes at the edge (a fresh
    # sample from the daemon): that reading, like every edge, takes no line.
    from edgewatt.client.thread_monitor import FileMonitor

    out = tmp_path / "monitor.jsonl"
    monitor = FileMonitor(str(out), interval=1, records="edgewatt", socket=once_a_second.socket)
    monitor.set_metrics(power=True)
    monitor.start()
    costs = []
    try:
        for i in range(4):
            after_a_line(tmp_path)
            started = time.monotonic()
            monitor.phase(f"mark-{i}")
            costs.append(time.monotonic() - started)
    finally:
        monitor.stop()
    assert monitor.source == "daemon"
    assert_none_waited(costs)
    marks = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("type") == "phase"]
    assert [m["name"] for m in marks] == [f"mark-{i}" for i in range(4)]


def test_a_phase_over_changing_power_is_the_interpolated_integral_over_its_edges(
    once_a_second: DaemonProcess, reg: client.Registration, tmp_path: Path
) -> None:
    # The stand-in prints 5 W, then 15 W, then 5 W a second apart (its file changed
    # right after a line): the trace is linear between the lines. A phase from half
    # a second after the first to half a second after the second holds its
    # integral over exactly its two edges, 12.5 J, not what the held power gives
    # (5 W then 15 W past the last line: 15 J).
    phase, offset = a_phase_over_a_step(reg, tmp_path)
    rows = once_a_second.call("GET", f"/v1/targets/{reg.id}/samples")[1]["samples"]
    assert_the_interpolated_integral(phase, rows, offset, tmp_path)


def a_phase_over_a_step(reg: client.Registration, tmp_path: Path) -> tuple[dict[str, Any], float]:
    """The phase "step" from half a second after a line at 5 W to half a second after
    the next, the one after at 15 W, then 5 W again; its final figures, and the
    offset of the wall clock (row times) from the monotonic one (the trace's)."""
    current = tmp_path / "curr1_input"
    offset = time.time() - time.monotonic()
    first = after_a_line(tmp_path)
    current.write_text("3000\n")  # 15 W from the next line on
    time.sleep(max(0.0, first + 0.5 - time.monotonic()))
    reg.phase("step")
    second = after_a_line(tmp_path)
    current.write_text("1000\n")
    time.sleep(max(0.0, second + 0.5 - time.monotonic()))
    ended = reg.end_phase()
    assert ended is not None and ended["final"] is False  # the next line is 0.5 s away
    [phase] = reg.summary(final_wait_s=5.0)["phases"]
    assert phase["final"] is True
    return phase, offset


def assert_the_interpolated_integral(
    phase: dict[str, Any], rows: list[dict[str, Any]], offset: float, tmp_path: Path
) -> None:
    """The phase over the 5, 15, 5 W steps: its edges are the samples taken at its start
    and end (its first row at or after each, on the monotonic clock: wall time less
    ``offset``), and its device energy the trace's integral between them (12.5 J),
    not what holding each line's power would give."""
    times = sorted(r["time"] for r in rows)
    start = min(t for t in times if t >= phase["started_at"] - 0.0005) - offset
    end = min(t for t in times if t >= phase["ended_at"] - 0.0005) - offset
    assert end - start == pytest.approx(phase["duration_s"], abs=0.0006)
    trace = [(t, w) for t, w in printed(tmp_path) if t <= end + 1.5]
    exact = integral(trace, start, end)
    held = held_at(trace, end) - held_at(trace, start)
    assert exact == pytest.approx(12.5, abs=0.2) and held - exact > 1.0, (exact, held)
    # Each line is the daemon's reading when it arrives, a fraction of a ms after it
    # was printed; with the power moving 10 W a second, one 10 ms late moves the
    # integral by 50 mJ at most.
    assert phase["device_energy_j"] == pytest.approx(exact, abs=0.05), (phase, exact, trace)


def integral(trace: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Joules of the readings ``trace`` between ``t0`` and ``t1``, the power linear
    between two readings (the trapezoid rule)."""
    total = 0.0
    for (a, pa), (b, pb) in zip(trace, trace[1:]):
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo:
            slope = (pb - pa) / (b - a)
            total += (pa + slope * ((lo + hi) / 2 - a)) * (hi - lo)  # the mean of a line
    return total


def held_at(trace: list[tuple[float, float]], t: float) -> float:
    """The device's energy at ``t`` as an edge takes it before the next line: the
    trace's integral to the last line before ``t``, then that line's power held."""
    last, watts = max((r for r in trace if r[0] <= t), key=lambda r: r[0])
    return integral(trace, trace[0][0], last) + watts * (t - last)


def test_asked_for_final_figures_a_summary_waits_at_most_the_time_given(
    reg: client.Registration, tmp_path: Path
) -> None:
    line = after_a_line(tmp_path)
    reg.phase("short")
    time.sleep(0.1)
    reg.end_phase()
    # The next line is 0.8 s away: asked to wait 0.3 s at most, the summary comes
    # then, not final; asked to wait 5 s, it comes once that line has, final.
    started = time.monotonic()
    early = reg.summary(final_wait_s=0.3)
    waited = time.monotonic() - started
    if none_printed(tmp_path, line + 0.5):  # the line came on time (a busy machine...)
        assert early["final"] is False and early["phases"][0]["final"] is False
    assert 0.3 <= waited < 0.45, waited
    started = time.monotonic()
    late = reg.summary(final_wait_s=5.0)
    waited = time.monotonic() - started
    assert late["final"] is True and late["phases"][0]["final"] is True
    next_line = min(t for t, _ in printed(tmp_path) if t > line)
    assert waited < 1.0 and time.monotonic() >= next_line, waited


def test_a_target_that_exits_between_two_lines_becomes_final(
    once_a_second: DaemonProcess, spawn: Any, tmp_path: Path
) -> None:
    # Its exit is its last edge, dated by the kernel: the line after it settles it, and
    # its summary, read after, holds the trace's integral up to its exit.
    daemon = once_a_second
    child = spawn("import sys; sys.stdin.readline()", stdin=subprocess.PIPE)
    target = daemon.register(child.pid)["id"]
    assert daemon.call("POST", f"/v1/targets/{target}/phase", {"name": "last"})[0] == 201
    after_a_line(tmp_path)
    child.stdin.close()  # it reads EOF and exits
    child.wait(timeout=5)
    exited = wait_for(
        lambda: (
            (s := daemon.call("GET", f"/v1/targets/{target}/summary")[1])["state"] == "exited" and s
        )
    )
    summary = daemon.call("GET", f"/v1/targets/{target}/summary?final=5")[1]
    assert summary["final"] is True and summary["phases"][0]["final"] is True, (exited, summary)
    assert summary["device_energy_j"] == pytest.approx(WATTS * summary["duration_s"], rel=0.01)
    [last] = summary["phases"]
    assert last["ended_at"] is not None
    assert last["device_energy_j"] == pytest.approx(WATTS * last["duration_s"], rel=0.01)
