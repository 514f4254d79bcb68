"""Phases wherever figures are shown (issue 41 item 2): a script under `edgewatt run`
opens two phases through its own register(); the daemon's figures of each must be in
run's table, its --output file, `edgewatt summary ID`, `edgewatt report` and the plot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from edgewatt.cli.phases import PEAK_POWER
from edgewatt.cli.report import layout, load
from edgewatt.cli.status import human_bytes
from tests.conftest import ROOT, DaemonProcess, free_port

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
WATTS = 16.802  # the stand-in's constant VDD_IN

# Each phase touches a buffer (kept: the second phase's peak holds both) and burns CPU
# time as the kernel counts it; end_phase() gives the daemon's figures of each.
SCRIPT = """
import json, sys, time
from edgewatt import client
reg = client.register(labels={"run": sys.argv[1]})
def work(mib, cpu_s):
    x = bytearray(mib * 2**20)
    for i in range(0, len(x), 4096): x[i] = 1
    end = time.process_time() + cpu_s
    while time.process_time() < end: pass
    return x
reg.phase("epoch-1")
a = work(40, 0.4)
first = reg.end_phase()
reg.phase("epoch-2")
b = work(80, 0.8)
second = reg.end_phase()
print(json.dumps({"id": reg.id, "mode": reg.mode, "phases": [first, second]}), flush=True)
sys.stdin.readline()  # held while the test reads `edgewatt summary`
"""

FIGURES = (
    "duration_s", "cpu_user_s", "cpu_system_s", "energy_j", "device_energy_j",
    "memory_rss_peak_bytes", "disk_read_bytes", "disk_write_bytes",
    "network_transmit_bytes", "network_receive_bytes",
)  # fmt: skip


@dataclass
class Run:
    phases: list[dict[str, Any]]  # the daemon's answers to the script's end_phase()
    table: str  # edgewatt run's stderr
    summary_text: str  # edgewatt summary ID, while the script still ran
    output: Path


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("phases")
    daemon = DaemonProcess(
        socket=str(tmp / "ew.sock"),
        port=free_port(),
        state_dir=tmp / "state",
        interval=0.2,
        log_path=tmp / "daemon.log",
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_IDLE_POWER_W": "4"},
    ).start()
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    label = f"phases-{os.getpid()}"
    output = tmp / "run.jsonl"
    try:
        proc = subprocess.Popen(
            # A process target: its phases' disk and network figures are the process
            # tree's, cell for cell (a cgroup's are its own accounts').
            [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--no-cgroup",
             "--label", f"run={label}", "--output", str(output), "--", sys.executable,
             str(script), label],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=ROOT,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdin is not None
        told = json.loads(proc.stdout.readline())
        assert told["mode"] == "daemon", told  # one target: the run's, through the daemon
        shown = subprocess.run(
            [*EDGEWATT, "summary", told["id"], "--socket", daemon.socket],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        _, table = proc.communicate("\n", timeout=60)
        assert proc.returncode == 0, table
    finally:
        daemon.stop()
    yield Run(told["phases"], table, shown.stdout, output)


def _row(text: str, name: str) -> list[str]:
    """The cells of the phase table's row ``name`` (cells are 2+ spaces apart)."""
    line = next(line for line in text.splitlines() if line.strip().startswith(name + " "))
    return re.split(r" {2,}", line.strip())


def _expected(item: dict[str, Any]) -> list[str]:
    """A phase's row as the table must show it, each figure with its unit."""
    duration, device = item["duration_s"], item["device_energy_j"]
    return [
        item["name"],
        f"{duration:.2f} s",
        f"{item['cpu_user_s'] + item['cpu_system_s']:.2f} s",
        f"{device:.1f} J",
        f"{item['energy_j']:.1f} J",
        f"{device / duration:.2f} W",
        # Peak power (issue 41 item 3): the daemon's figure once it measures one, else "-".
        "-" if item.get(PEAK_POWER) is None else f"{item[PEAK_POWER]:.2f} W",
        human_bytes(item["memory_rss_peak_bytes"]),
        f"{human_bytes(item['disk_read_bytes'])} / {human_bytes(item['disk_write_bytes'])}",
        f"{human_bytes(item['network_transmit_bytes'])} / "
        f"{human_bytes(item['network_receive_bytes'])}",
    ]


def test_the_daemons_phase_figures_are_what_the_kernel_and_the_sensor_counted(
    real_run: Run,
) -> None:
    first, second = real_run.phases
    assert [first["name"], second["name"]] == ["epoch-1", "epoch-2"]
    # CPU burnt as process_time counts it; memory touched, the first buffer still held.
    assert first["cpu_user_s"] + first["cpu_system_s"] >= 0.4 - 0.02
    assert second["cpu_user_s"] + second["cpu_system_s"] >= 0.8 - 0.02
    assert first["memory_rss_peak_bytes"] >= 40 * 2**20
    assert second["memory_rss_peak_bytes"] >= 120 * 2**20
    for item in (first, second):
        assert item["device_energy_j"] / item["duration_s"] == pytest.approx(WATTS, abs=0.05)
        assert 0 < item["energy_j"] < item["device_energy_j"]


def test_run_prints_each_phase_with_its_figures(real_run: Run) -> None:
    assert "  phases:" in real_run.table
    header = _row(real_run.table, "phase")
    assert header == ["phase", "duration", "CPU", "device energy", "attributed", "avg power",
                      "peak power", "peak RSS", "disk read / written",
                      "network sent / received"]  # fmt: skip
    for item in real_run.phases:
        assert _row(real_run.table, item["name"]) == _expected(item)


def test_run_output_has_a_phase_record_per_phase(real_run: Run) -> None:
    records = [json.loads(line) for line in real_run.output.read_text().splitlines()]
    phases = [r for r in records if r["type"] == "phase"]
    assert [p["name"] for p in phases] == ["epoch-1", "epoch-2"]
    for record, item in zip(phases, real_run.phases):
        assert record["timestamp"] == item["started_at"]
        assert record["ended_at"] == item["ended_at"]
        assert {k: record[k] for k in FIGURES} == {k: item[k] for k in FIGURES}
    kinds = [r["type"] for r in records]
    assert kinds.index("summary") > max(i for i, k in enumerate(kinds) if k == "phase")


def test_summary_id_prints_the_phase_table_under_the_totals(real_run: Run) -> None:
    text = real_run.summary_text
    assert text.index("  energy ") < text.index("  phases:")
    for item in real_run.phases:
        assert _row(text, item["name"]) == _expected(item)


def test_report_prints_the_phase_table_of_a_run_file(real_run: Run) -> None:
    result = subprocess.run(
        [*EDGEWATT, "report", str(real_run.output)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for item in real_run.phases:
        assert _row(result.stdout, item["name"]) == _expected(item)


def test_the_plot_shades_each_phase_from_its_start_to_its_end(real_run: Run) -> None:
    header, samples, phases, summary = load(str(real_run.output))
    assert summary is not None
    drawn = layout(header, samples, phases, summary)
    t0 = summary["start_time"]
    assert [(name, round(a, 6), round(b, 6)) for name, a, b in drawn.phases] == [
        (item["name"], round(item["started_at"] - t0, 6), round(item["ended_at"] - t0, 6))
        for item in real_run.phases
    ]
    # The gap between the phases (the script's own code between them) is not shaded.
    (_, _, first_end), (_, second_start, _) = drawn.phases
    assert 0 < first_end <= second_start < drawn.end_s
    out = os.environ.get("EDGEWATT_TEST_PLOTS")
    if out:  # for a person to look at
        subprocess.run(
            [*EDGEWATT, "report", str(real_run.output), "--plot", f"{out}/run-phases.png"],
            check=True, cwd=ROOT, capture_output=True, timeout=60,
        )  # fmt: skip
