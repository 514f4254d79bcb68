"""A real Prometheus server scrapes the real daemon; promtool lints the exposition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, free_port, wait_for


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run must install Debian's prometheus")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return path


@pytest.fixture
def prometheus(tmp_path: Path, daemon: DaemonProcess) -> Iterator[str]:
    binary = _binary("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: edgewatt\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{daemon.port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout=30, step=0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


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
    # The counter grows the way the busy child does: about one core second per second.
    time.sleep(6)
    rate = wait_for(
        lambda: query(
            prometheus,
            f'sum(rate(process_cpu_time_seconds_total{{edgewatt_target_id="{tid}"}}[5s]))',
        ),
        timeout=30,
        step=0.5,
    )
    assert 0.5 < float(rate[0]["value"][1]) < 1.2
    up = query(prometheus, 'up{job="edgewatt"}')
    assert up[0]["value"][1] == "1"
    info = query(prometheus, "target_info")
    assert info[0]["metric"]["service_name"] == "edgewatt"


def test_promtool_accepts_the_metrics(daemon: DaemonProcess, spawn: Any) -> None:
    promtool = _binary("promtool")
    child = spawn("import time; time.sleep(60)")
    tid = daemon.register(child.pid, labels={"run": "lint"})["id"]
    wait_for(lambda: daemon.series("process_memory_usage_bytes", edgewatt_target_id=tid))
    text = daemon.metrics_text()
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == ""
