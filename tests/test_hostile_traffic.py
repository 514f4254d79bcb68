"""Cgroup targets' traffic counters attacked as a local user would (issue 38): a daemon
without CAP_NET_ADMIN, other programs' packet marks, nested targets, two targets on
one cgroup, and namespaces and counters a user controls. Real daemon, real nftables,
real cgroups, real network namespaces."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.sampling import cgroups, nftables
from tests.conftest import ROOT
from tests.test_cgroup_traffic import member, stop_server, tcp_server

WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)
WITHOUT_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]


def send_each(port: int, size: int) -> str:
    """A member's code: one connection to ``port`` carrying ``size`` bytes."""
    return (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}))\n"
        f"s.sendall(b'x' * {size}); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
    )


def test_without_net_admin_the_traffic_figure_is_absent_and_says_why(
    daemon_factory: Any, cgroup_dir: Path
) -> None:
    daemon = daemon_factory(interval=0.2, prefix=WITHOUT_NET_ADMIN)
    why = daemon.call("GET", "/healthz")[1]["cgroup_traffic"]
    assert why is not None and "CAP_NET_ADMIN" in why, why
    status, target = daemon.call("POST", "/v1/targets", {"cgroup": f"/{cgroup_dir.name}"})
    assert status == 201, target
    port, counts, thread = tcp_server(replies=0)
    senders = [member(cgroup_dir, send_each(port, 60_000)) for _ in range(5)]
    for proc in senders:
        proc.communicate(b"go\n")
        assert proc.returncode == 0
    stop_server(port, thread)
    assert counts["received"] == 5 * 60_000
    summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary?fresh=1")[1]
    assert summary["network_transmit_bytes"] is None, summary
    assert summary["network_receive_bytes"] is None
    assert summary["network_counts"] is None
    assert "CAP_NET_ADMIN" in summary["network_unknown"], summary
    assert summary["cpu_user_s"] is not None  # the cgroup's other figures are there
    assert daemon.series("process_network_io_bytes_total", edgewatt_target_id=target["id"]) == []
    assert daemon.series("process_cpu_time_seconds_total", edgewatt_target_id=target["id"])
    # One line at the start, not one per member process.
    assert len(re.findall("network bytes unavailable", daemon.log())) == 1, daemon.log()
    assert "cannot count the traffic" not in daemon.log()
    doctor = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    line = next(x for x in doctor.stdout.splitlines() if "cgroup targets" in x)
    assert line.startswith("warn") and "no network figures" in line, doctor.stdout
    assert "CAP_NET_ADMIN" in line
    shown = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "summary", target["id"], "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert re.search(r"network +unknown: .*CAP_NET_ADMIN", shown.stdout), shown.stdout


def test_run_cgroup_without_net_admin_says_ip_bytes_are_unknown(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(interval=0.2, prefix=WITHOUT_NET_ADMIN)
    port, counts, thread = tcp_server(replies=0)
    output = tmp_path / "run.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--cgroup", "--interval", "1",
         "--output", str(output), "--", sys.executable, "-c", send_each(port, 300_000)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
    )  # fmt: skip
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == 300_000
    assert "IP sent 0" not in done.stderr
    assert re.search(r"IP +sent and received unknown: .*CAP_NET_ADMIN", done.stderr), done.stderr
    assert '"network_transmit_bytes"' not in output.read_text().splitlines()[-1]
