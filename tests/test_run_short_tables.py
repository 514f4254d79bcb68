"""What the table of a run shorter than the readings says of its spread: never a mean
outside its own lowest and highest, never a lone "-, mean, -", and the mean CPU use the
table's own CPU time over the run (every figure says what it is)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

from edgewatt.cli.report import amount
from edgewatt.cli.spreads import TOO_SHORT, spread_rows
from tests.conftest import ROOT

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")


def test_a_spread_whose_mean_is_not_within_it_says_the_run_was_too_short() -> None:
    # A daemon's summary of a 3 ms command between two 10 Hz readings (measured here):
    # its power interpolated over the span, the one reading around it both min and max.
    summary = {
        "power_min_w": 12.479, "device_power_avg_w": 9.285, "power_max_w": 12.479,
        "cpu_utilization_min": None, "cpu_avg_utilization": 0.5175, "cpu_utilization_max": None,
        "memory_rss_min_bytes": None, "memory_rss_avg_bytes": None,
        "memory_rss_peak_bytes": 1 << 20,
    }  # fmt: skip
    assert spread_rows(summary) == [
        ("power", f"mean 9.29 W (the device's); {TOO_SHORT}"),
        ("CPU use", f"mean 51.7 % of all cores; {TOO_SHORT}"),
    ]
    summary.update(power_min_w=4.5, cpu_utilization_min=0.2, cpu_utilization_max=0.6)
    assert spread_rows(summary) == [
        ("power", "min 4.50 W, mean 9.29 W, max 12.48 W (the device's)"),
        ("CPU use", "min 20.0 %, mean 51.7 %, max 60.0 % of all cores"),
    ]
    # `edgewatt run`'s mean is its CPU time over the whole run (its start included),
    # which the intervals inside it need not bracket: both said, neither hidden.
    summary.update(cpu_avg_utilization=0.65)
    assert spread_rows(summary)[1] == (
        "CPU use", "min 20.0 %, max 60.0 % per interval; mean 65.0 % of all cores over the run"
    )  # fmt: skip


def test_a_short_runs_table_has_no_contradiction(daemon_factory: Any) -> None:
    daemon = daemon_factory(
        extra_args=["--tegrastats", STAND_IN], env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor"}
    )
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--no-cgroup", "--socket", daemon.socket,
         "--", "/bin/true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = dict(re.findall(r"^  (\S[\w ]*?\S)  +(\S.*)$", result.stderr, re.M))
    cpu = re.match(r"([\d.]+) s \(avg ([\d.]+) % of one core\)", rows["CPU time"])
    assert cpu is not None, result.stderr
    use = re.match(r"(?:min [\d.]+ %, )?mean ([\d.]+) %", rows["CPU use"])
    assert use is not None, result.stderr
    # The same CPU time over the same run: per core of all of them, to the rounding.
    assert abs(float(use[1]) - float(cpu[2]) / (os.cpu_count() or 1)) <= 0.1, result.stderr
    for label in ("power", "CPU use", "RSS sum"):
        shown = rows.get(label, "")
        assert "min -" not in shown and "max -" not in shown, result.stderr
        numbers = re.match(r"min ([\d.]+) \S+, mean ([\d.]+) \S+, max ([\d.]+)", shown)
        if numbers:
            low, mean, high = map(float, numbers.groups())
            assert low <= mean <= high, result.stderr


def test_a_figure_below_1_keeps_two_significant_digits() -> None:
    from edgewatt.cli.report import amount, summary_table

    assert [amount(x, 1) for x in (0.0, 0.024, 0.61, 0.065, 5.26, 208.46)] == [
        "0.0", "0.024", "0.61", "0.065", "5.3", "208.5"
    ]  # fmt: skip
    assert amount(0.0027, 2) == "0.0027" and amount(4.615, 2) == "4.62"
    assert amount(0.065 / 3600, 4) == "0.000018"
    table = summary_table(
        {"duration_s": 0.036, "cpu_time_s": 0.0027, "avg_cpu_usage": 7.5, "energy_j": 0.065,
         "avg_power_w": 4.82, "process_energy_j": 0.0056}, "t", "present",
    )  # fmt: skip
    assert "  duration           0.036 s\n" in table
    assert "  CPU time           0.0027 s (avg 7.5 % of one core)\n" in table
    assert "  device energy      0.065 J (0.000018 Wh), avg 4.82 W\n" in table
    assert "  attributed energy  0.0056 J (0.0000016 Wh) above idle" in table


def test_a_short_runs_energy_is_the_daemons_settled_figure(
    daemon_factory: Any, tmp_path: Any
) -> None:
    """The stand-in's readings alternate 4.76 and 12.48 W at 10 Hz: a command of a few
    ms between two of them. The table and the file hold the device energy and the
    attributed share the daemon settled at the command's edges (the monitor's sum of
    its readings' energies read -0.3 J, 44 W, an attributed share above the device's)."""
    from edgewatt.core import transport

    daemon = daemon_factory(extra_args=["--tegrastats", STAND_IN])
    for n, mode in enumerate((["--no-cgroup"], [], ["--no-cgroup"], [])):
        out = tmp_path / f"{n}.jsonl"
        result = subprocess.run(
            [sys.executable, "-m", "edgewatt.cli", "run", *mode, "--socket", daemon.socket,
             "--label", f"n={n}", "--output", str(out), "--", "/bin/true"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = [json.loads(line) for line in out.read_text().splitlines()][-1]
        (target,) = [
            t for t in transport.call_ok(daemon.socket, "GET", "/v1/targets")["targets"]
            if t["labels"].get("n") == str(n)
        ]  # fmt: skip
        api = transport.call_ok(daemon.socket, "GET", f"/v1/targets/{target['id']}/summary")
        assert api["final"] is True, api
        assert summary["energy_j"] == api["device_energy_j"] >= 0, (summary, api)
        assert summary["process_energy_j"] == api["energy_j"] <= api["device_energy_j"]
        assert summary["avg_power_w"] == api["device_power_avg_w"]
        if summary["avg_power_w"] is not None:
            assert 4.5 <= summary["avg_power_w"] <= 12.5, summary
        # The table never writes -0.0 (the API's figure of a span between two readings
        # can be).
        shown = f"  device energy      {amount(api['device_energy_j'] + 0.0, 1)} J"
        assert shown in result.stderr, result.stderr


def test_a_command_no_pass_saw_alive_is_named_after_it(daemon_factory: Any) -> None:
    """`edgewatt run --no-cgroup -- /bin/true`: the daemon's one pass finds it a zombie
    (its cmdline gone, its comm left): the target is named `true`, never the fork of
    edgewatt run (`python3 ... edgewatt run ...`) it was registered as."""
    from edgewatt.core import transport

    daemon = daemon_factory(interval=5.0)
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--no-cgroup", "--socket", daemon.socket,
         "--label", "named=yes", "--", "/bin/true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (target,) = [
        t for t in transport.call_ok(daemon.socket, "GET", "/v1/targets")["targets"]
        if t["labels"].get("named") == "yes"
    ]  # fmt: skip
    assert (target["command"], target["executable"]) == ("true", "true"), target


def test_a_finished_short_targets_cpu_is_not_zero_in_top_and_status() -> None:
    from edgewatt.cli.status import finished_rows

    target = {"id": "a1", "pid": 7, "command": "true", "state": "exited", "exited_at": 0.0}
    summary = {"cpu_user_s": 0.002, "cpu_system_s": 0.0007, "exit_status": 0}
    (row,) = finished_rows([(target, summary)])[1:]
    assert row[6] == "0.0027 s"


def test_edgewatt_summary_says_why_a_short_targets_pss_is_missing(daemon_factory: Any) -> None:
    """No bare "-": a command no pass read alive has no PSS, and the summary says why."""
    daemon = daemon_factory(interval=5.0)
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--no-cgroup", "--socket", daemon.socket,
         "--label", "pss=short", "--", "/bin/true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "summary", "--socket", daemon.socket,
         "pss=short"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    (memory,) = [line for line in shown.stdout.splitlines() if line.startswith("  memory")]
    assert memory.startswith(
        "  memory     peak PSS not measured (sampled only: no pass read it; the kernel keeps "
        "none at an exit), largest process's peak RSS "
    ), memory
