"""Phases wherever figures are shown: a script under `edgewatt run`
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
from tests.conftest import ROOT, DaemonProcess, free_port, rounded_quotient, wait_for

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
    # edgewatt summary ID and its --json once the run ended (its figures final).
    final_text: str
    final: dict[str, Any]


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
    # The sensor read before the run registers: every figure of its energy is then
    # the constant line's over a time the sensor covered (exact to its rounding).
    wait_for(lambda: daemon.call("GET", "/healthz")[1]["power_sources"] == ["tegrastats"])
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
        final_text, final = (
            subprocess.run(
                [*EDGEWATT, "summary", told["id"], "--socket", daemon.socket, *flag],
                capture_output=True, text=True, cwd=ROOT, timeout=30, check=True,
            ).stdout
            for flag in ([], ["--json"])
        )  # fmt: skip
    finally:
        daemon.stop()
    yield Run(told["phases"], table, shown.stdout, output, final_text, json.loads(final))


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
        # Peak power: the daemon's figure once it measures one, else "-".
        "-" if item.get(PEAK_POWER) is None else f"{item[PEAK_POWER]:.2f} W",
        human_bytes(item["memory_pss_peak_bytes"]),  # what it held: its PSS
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
    # One process: its PSS is at most its RSS, and holds the buffers it touched.
    assert 40 * 2**20 <= first["memory_pss_peak_bytes"] <= first["memory_rss_peak_bytes"]
    assert 120 * 2**20 <= second["memory_pss_peak_bytes"] <= second["memory_rss_peak_bytes"]
    for item in (first, second):
        # The constant line over the phase's own time, each figure rounded (to the mJ,
        # the ms, the mW): as exact as those roundings allow.
        low, high = rounded_quotient(item["device_energy_j"], item["duration_s"])
        assert low <= WATTS <= high, item
        assert item["device_power_avg_w"] == WATTS, item
        assert 0 < item["energy_j"] < item["device_energy_j"]


def test_run_prints_each_phase_with_its_figures(real_run: Run) -> None:
    assert "  phases:" in real_run.table
    header = _row(real_run.table, "phase")
    assert header == ["phase", "duration", "CPU", "device energy", "attributed", "avg power",
                      "peak power", "peak PSS", "disk read / written",
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


def _spreads(summary: dict[str, Any]) -> dict[str, str]:
    """The run's lowest, mean and highest power, CPU use and memory as the tables must
    show them, from the summary JSON, each number with its unit."""
    power = [summary[k] for k in ("power_min_w", "device_power_avg_w", "power_max_w")]
    cpu = [summary[k] for k in ("cpu_utilization_min", "cpu_avg_utilization",
                                "cpu_utilization_max")]  # fmt: skip
    memory = [summary[k] for k in ("memory_rss_min_bytes", "memory_rss_avg_bytes",
                                   "memory_rss_peak_bytes")]  # fmt: skip
    return {
        "power": "min {:.2f} W, mean {:.2f} W, max {:.2f} W (the device's)".format(*power),
        "CPU use": "min {:.1f} %, mean {:.1f} %, max {:.1f} % of all cores".format(
            *(u * 100 for u in cpu)
        ),
        "RSS sum": "min {}, mean {}, max {} (each sample)".format(*map(human_bytes, memory)),
    }


def _spread_lines(text: str) -> dict[str, str]:
    """The table's rows of the run's spreads: {label: what follows it}."""
    found = {}
    for line in text.splitlines():
        label, _, rest = line.strip().partition("  ")
        if label in ("power", "CPU use", "RSS sum") and rest.strip().startswith("min "):
            assert len(line) <= 80, line  # readable on an 80-column terminal
            found[label] = rest.strip()
    return found


def test_the_run_level_min_mean_and_max_are_in_each_table(real_run: Run) -> None:
    records = [json.loads(line) for line in real_run.output.read_text().splitlines()]
    [recorded] = [r for r in records if r["type"] == "summary"]
    final = real_run.final
    # What was measured: the stand-in's one VDD_IN line, the phases' CPU burnt and
    # buffers held (120 MiB at the end), and a mean between the lowest and highest.
    assert final["power_min_w"] == final["power_max_w"] == WATTS
    assert final["device_power_avg_w"] == WATTS
    assert 0 <= final["cpu_utilization_min"] < final["cpu_avg_utilization"]
    assert final["cpu_avg_utilization"] < final["cpu_utilization_max"] <= 1
    # At least a Python interpreter's, never the 0 B of the pass that found the command
    # exited and not yet reaped.
    assert 4 * 2**20 < final["memory_rss_min_bytes"] < final["memory_rss_avg_bytes"]
    assert final["memory_rss_peak_bytes"] >= 120 * 2**20
    # edgewatt run's file and table hold the daemon's final figures (its peak RSS the
    # larger of the daemon's and the kernel's peak of the tree), but for the CPU use's
    # mean: the CPU time row's, over the whole run.
    keys = ("power_min_w", "device_power_avg_w", "power_max_w", "cpu_utilization_min",
            "cpu_utilization_max", "memory_rss_min_bytes", "memory_rss_avg_bytes")  # fmt: skip
    assert {k: recorded[k] for k in keys} == {k: final[k] for k in keys}
    cores = os.cpu_count() or 1
    run_mean = recorded["cpu_time_s"] / recorded["duration_s"] / cores
    assert recorded["cpu_avg_utilization"] == pytest.approx(run_mean, rel=1e-9)
    assert recorded["memory_rss_peak_bytes"] >= final["memory_rss_peak_bytes"]
    assert _spread_lines(real_run.table) == _spreads(recorded)
    assert _spread_lines(real_run.final_text) == _spreads(final)
    report = subprocess.run(
        [*EDGEWATT, "report", str(real_run.output)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert _spread_lines(report.stdout) == _spreads(recorded)
