"""`edgewatt run --output`'s sample rows hold final device energy: the stand-in
tegrastats prints its board input once a second (as `sample_hz: 1` runs the real one),
and each row, written once the line after it has come, holds the trace's integral over
its own interval (linear between the lines), not the energy its reading saw with the
last line's power held; the plot's power panel draws those figures. Through the daemon
and in process (no daemon: the run's own sampler, its first reading before the first
line)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.report import amount
from edgewatt.client._samples import Reading
from tests.conftest import ROOT, wait_for
from tests.test_edges import STAND_IN, integral, printed
from tests.test_run_report import EDGEWATT, _drawn

LOW_MA, HIGH_MA = 1000, 3000  # 5 V times these: 5 W and 15 W


def flip_after_two_lines(current: Path, tmp_path: Path, stop: threading.Event) -> None:
    """Once two lines are printed (the run is sampling), the board input alternates
    between 15 W and 5 W every 0.7 s, out of step with the lines."""
    while len(printed(tmp_path)) < 2:
        if stop.wait(0.02):
            return
    high = True
    while True:
        current.write_text(f"{HIGH_MA if high else LOW_MA}\n")
        high = not high
        if stop.wait(0.7):
            return


def held_back(trace: list[tuple[float, float]], begin: float) -> list[tuple[float, float]]:
    """The trace as the sampler integrates it: the first line's power from ``begin`` on
    (its start: core/power/traces.py), then linear between the lines."""
    return [(begin, trace[0][1]), *trace] if begin < trace[0][0] else trace


@pytest.mark.parametrize("through", ["daemon", "in-process"])
def test_each_row_holds_the_trace_integral_over_its_interval(
    through: str, daemon_factory: Any, tmp_path: Path
) -> None:
    current = tmp_path / "curr1_input"
    current.write_text(f"{LOW_MA}\n")
    env = {
        **os.environ,
        "EDGEWATT_POWER_SAMPLE_HZ": "1",
        "FAKE_TEGRASTATS_POWER_FILE": str(current),
        "FAKE_TEGRASTATS_LINES": str(tmp_path / "lines.log"),
    }
    started = time.monotonic()
    if through == "daemon":
        env["EDGEWATT_POWER_SOURCES"] = "tegrastats"
        daemon = daemon_factory(interval=1.0, extra_args=["--tegrastats", STAND_IN], env=env)
        socket = daemon.socket
    else:
        (tmp_path / "sys").mkdir()  # no other power source
        env.update(EDGEWATT_SYSFS_PATH=str(tmp_path / "sys"), EDGEWATT_TEGRASTATS=STAND_IN)
        socket = str(tmp_path / "none.sock")
    stop = threading.Event()
    flipper = threading.Thread(target=flip_after_two_lines, args=(current, tmp_path, stop))
    flipper.start()
    out = tmp_path / "run.jsonl"
    try:
        proc = subprocess.Popen(
            [*EDGEWATT, "run", "--socket", socket, "--interval", "0.5", "--output", str(out),
             "--", "sleep", "4"],
            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Streamed: a row is in the file a reading after its end, while the run goes on.
        written = lambda: out.exists() and '"sample"' in out.read_text()  # noqa: E731
        wait_for(lambda: written() or proc.poll() is not None)
        assert proc.poll() is None, "no row written before the run ended"
        _, stderr = proc.communicate(timeout=60)
    finally:
        stop.set()
        flipper.join()
    assert proc.returncode == 0, stderr
    offset = time.time() - time.monotonic()  # row times are wall clock, lines monotonic
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [r for r in records if r["type"] == "sample"]
    summary = records[-1]
    assert summary["type"] == "summary" and len(rows) >= 6
    assert not any("final" in r for r in rows)  # every one final
    trace = held_back(printed(tmp_path), started)
    begins = [summary["start_time"], *(r["timestamp"] for r in rows[:-1])]
    held_off = 0
    for begin, row in zip(begins, rows):
        t0, t1 = begin - offset, row["timestamp"] - offset
        exact = integral(trace, t0, t1)
        # A line is read a fraction of a ms after it is printed; with the power moving
        # 10 W a second between two lines, 5 ms late moves a row by 50 mJ.
        assert row["energy_j"] == pytest.approx(exact, rel=0.01, abs=0.05), (row, exact)
        last = max(t for t, _ in trace if t <= t1)
        if abs(integral(trace, t0, last) + dict(trace)[last] * (t1 - last) - exact) > 0.5:
            held_off += 1  # what the row held at its pass was off by more than 0.5 J
    # Rows after the flipping began, between two lines: held, they were wrong.
    assert held_off >= 2, held_off
    # The plot's power panel draws each row's energy over its interval.
    drawn = _drawn(out, tmp_path)
    _, xs, watts = dict(drawn.panels)["device power (W)"][0]
    assert [round(w * (x1 - x0), 6) for x0, x1, w in zip(xs[::2], xs[1::2], watts[::2])] == [
        round(r["energy_j"], 6) for r in rows
    ]
    assert max(watts) <= 15.0 + 0.01 and min(watts) >= 5.0 - 0.01
    # The summary (the file's and the table's) says final, and its device energy is the
    # trace's integral over the run: in process too, not the rows' sum as it stood.
    assert summary["final"] is True, summary
    exact = integral(trace, summary["start_time"] - offset, summary["end_time"] - offset)
    assert summary["energy_j"] == pytest.approx(exact, rel=0.01, abs=0.05), (summary, exact)
    assert summary["energy_source"] == f"{through} (settled at the command's edges)"
    assert f"  device energy      {amount(summary['energy_j'], 1)} J" in stderr, stderr
    assert "not final" not in stderr, stderr


def test_a_row_never_settled_is_written_marked_not_final() -> None:
    from edgewatt.client._final_rows import FinalRows

    written: list[tuple[str, Any]] = []

    class Sink:
        final_rows = True

        def sample(self, sample: dict[str, Any], reading: Reading) -> None:
            written.append(("sample", dict(sample)))

        def phase(self, name: str, at: float) -> None:
            written.append(("phase", name))

    def reading(t: float, energy: float) -> Reading:
        return Reading(t, 0.0, 0.0, 1, 2, 0, 0, power_w=5.0, energy_j=energy, source="daemon")

    known = {1.0: 10.0, 2.0: 14.0}  # settled: the readings at 1 s and 2 s; 3 s not yet
    rows = FinalRows(Sink(), lambda readings, _wait: [known.get(r.time) for r in readings])
    r1, r2, r3 = reading(1.0, 10.0), reading(2.0, 15.0), reading(3.0, 20.0)
    rows.sample({"energy_j": 5.0}, r1, r2)
    rows.phase("next", 2.0)
    rows.sample({"energy_j": 5.0}, r2, r3)
    rows.flush()
    # The first row final (14 - 10 J, not the 5 J held), the mark after it; the second
    # held until the end, then written as it was, said not final.
    assert written == [("sample", {"energy_j": 4.0}), ("phase", "next")]
    rows.flush(last=True)
    assert written[2:] == [("sample", {"energy_j": 5.0, "final": False})]


def test_a_row_behind_a_settled_one_is_written_at_once_marked_not_final() -> None:
    # Rows settle oldest first: one that did not while a later one did never will (its
    # readings were a lost daemon's), and holds no row back.
    from edgewatt.client._final_rows import FinalRows

    written: list[dict[str, Any]] = []

    class Sink:
        final_rows = True

        def sample(self, sample: dict[str, Any], reading: Reading) -> None:
            written.append(dict(sample))

    def reading(t: float, energy: float) -> Reading:
        return Reading(t, 0.0, 0.0, 1, 2, 0, 0, power_w=5.0, energy_j=energy)

    known = {3.0: 30.0, 4.0: 36.0}  # the new sampler's; the lost one's at 1 s, 2 s never
    rows = FinalRows(Sink(), lambda readings, _wait: [known.get(r.time) for r in readings])
    rows.sample({"energy_j": 5.0}, reading(1.0, 10.0), reading(2.0, 15.0))
    rows.sample({"energy_j": 5.0}, reading(3.0, 30.0), reading(4.0, 35.0))
    rows.flush()
    # The newest row waits for the next reading (it may yet be extended).
    assert written == [{"energy_j": 5.0, "final": False}]
    # A source silent beyond its gap: rows without energy, nothing to settle; the one
    # held before them (its first line never came) is given up too.
    rows.sample({"energy_j": 1.0}, reading(5.0, 40.0), reading(6.0, 41.0))
    rows.sample({"cpu_usage": 1.0}, reading(6.0, 41.0), reading(7.0, 41.0))
    rows.flush()
    assert written[1:] == [{"energy_j": 6.0}, {"energy_j": 1.0, "final": False}]
    rows.flush(last=True)
    assert written[3:] == [{"cpu_usage": 1.0}]


def test_the_newest_row_waits_for_a_short_last_reading_merged_into_it() -> None:
    # stop() 0.05 s after an interval's reading (a quarter of the interval): the
    # recorder merges it into the last sample; the file's row of it waits for that, so
    # a phase read from the file holds its last 0.05 s of CPU, and the file the rows
    # its summary counts.
    from edgewatt.client._final_rows import FinalRows
    from edgewatt.client._samples import Recorder

    written: list[dict[str, Any]] = []

    class Sink:
        final_rows = True

        def sample(self, sample: dict[str, Any], reading: Reading) -> None:
            written.append(dict(sample, end=reading.time))

    def reading(t: float, cpu_s: float) -> Reading:
        return Reading(t, cpu_s, 0.0, 1, 2, None, None)

    recorder = Recorder({"cpu": True, "memory": False, "network": False, "power": False}, 1.0)
    rows = FinalRows(Sink(), lambda readings, _wait: [None] * len(readings))
    previous = None
    for t, cpu in ((0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (2.05, 1.04)):
        now = reading(t, cpu)
        sample = recorder.observe(now)
        if sample is not None and previous is not None:
            rows.sample(sample, previous, now)
        elif recorder.extended is not None:
            rows.extend(recorder.extended, now)
        rows.flush()
        previous = now
    assert [r["end"] for r in written] == [1.0]  # the newest row held: it may grow
    rows.flush(last=True)
    # 50 % of the first second, then 54 % of 1.05 s: the recorder's samples exactly.
    assert [(r["end"], round(r["cpu_usage"], 6)) for r in written] == [
        (1.0, 50.0), (2.05, round(0.54 / 1.05 * 100, 6))
    ]  # fmt: skip
    assert [round(s["cpu_usage"], 6) for s in recorder.samples] == [
        50.0,
        round(0.54 / 1.05 * 100, 6),
    ]


@pytest.mark.parametrize(
    ("final", "covers", "shown"),
    [
        (True, {"whole": True}, (40.0, "in-process (settled at the command's edges)", True)),
        (False, {"whole": True}, (38.5, None, False)),  # its reading never came: said so
        (True, {"whole": False}, (38.5, None, None)),  # in process since the daemon was lost
    ],
)
def test_an_in_process_runs_summary_is_its_samplers_settled_figure(
    final: bool, covers: dict[str, Any], shown: tuple[Any, ...]
) -> None:
    from edgewatt.cli import run

    asked: list[float] = []

    class Local:  # the run's own sampler's registration (client.Registration)
        mode, active = "local", True

        def summary(self, final_wait_s: float = 0.0) -> dict[str, Any]:
            asked.append(final_wait_s)
            return {"final": final, "covers": covers, "device_energy_j": 40.0,
                    "device_power_avg_w": 10.0, "energy_j": 1.5}  # fmt: skip

    settled_by = time.monotonic() + 3.0
    summary = run._final(None, 4.0, "present", None, settled_by)({"energy_j": 38.5}, Local())
    assert (summary["energy_j"], summary.get("energy_source"), summary.get("final")) == shown
    assert 2.5 < asked[0] <= 3.0  # waited for at most what is left of the run's 3 s
