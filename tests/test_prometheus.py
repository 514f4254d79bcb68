"""A real Prometheus server scrapes the real daemon; promtool lints the exposition."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, binary, query, wait_for


@pytest.fixture
def prometheus(prometheus_factory: Any, daemon: DaemonProcess) -> str:
    return prometheus_factory(daemon)


def test_prometheus_scrapes_target_series_with_labels(
    prometheus: str, daemon: DaemonProcess, spawn: Any
) -> None:
    child = spawn("import time\nwhile True: pass")
    tid = daemon.register(child.pid, labels={"run": "e2e", "team.name": "edge"})["id"]
    result = wait_for(
        lambda: query(prometheus, 'process_cpu_time_seconds_total{run="e2e"}'),
        timeout=30,
        step=0.5,
    )
    assert {r["metric"]["cpu_mode"] for r in result} <= {"user", "system"}
    metric = result[0]["metric"]
    assert metric["edgewatt_target_id"] == tid
    assert metric["process_pid"] == str(child.pid)
    assert metric["team_name"] == "edge"
    assert metric["host_name"] and metric["process_executable_name"]
    assert metric["job"] == "edgewatt" and metric["instance"] == f"127.0.0.1:{daemon.port}"
    # Its share of all cores by mode (cpu.mode, required by the conventions); the
    # modes add up to a share (how much the scheduler gave it is not ours to promise).
    shares = wait_for(
        lambda: query(prometheus, f'process_cpu_utilization{{edgewatt_target_id="{tid}"}}'),
        timeout=30,
        step=0.5,
    )
    assert {r["metric"]["cpu_mode"] for r in shares} == {"user", "system"}
    whole = query(prometheus, f'sum(process_cpu_utilization{{edgewatt_target_id="{tid}"}})')
    assert 0 <= float(whole[0]["value"][1]) <= 1
    # The counter is the kernel's count of the child's CPU: stopped, its utime + stime
    # no longer move, and what Prometheus stored comes to them (to a 10 ms tick), on a
    # busy machine as on an idle one.
    os.kill(child.pid, signal.SIGSTOP)
    wait_for(lambda: _stat(child.pid)[0] == "T")
    fields = _stat(child.pid)
    kernel = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total = f'sum(process_cpu_time_seconds_total{{edgewatt_target_id="{tid}"}})'
    stored = wait_for(
        lambda: (v := float(query(prometheus, total)[0]["value"][1])) >= kernel - 0.011 and v,
        timeout=30,
        step=0.5,
    )
    os.kill(child.pid, signal.SIGCONT)
    assert kernel > 0 and stored == pytest.approx(kernel, abs=0.011)
    up = query(prometheus, 'up{job="edgewatt"}')
    assert up[0]["value"][1] == "1"
    info = query(prometheus, "target_info")
    assert info[0]["metric"]["service_name"] == "edgewatt"


def test_promtool_accepts_the_metrics(daemon: DaemonProcess, spawn: Any) -> None:
    promtool = binary("promtool")
    child = spawn("import time; time.sleep(60)")
    tid = daemon.register(child.pid, labels={"run": "lint"})["id"]
    wait_for(lambda: daemon.series("process_memory_usage_bytes", edgewatt_target_id=tid))
    text = daemon.metrics_text()
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == ""


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: state first, utime at 11."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
