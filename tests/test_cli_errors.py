"""What the command says when something is in the way: one line naming the problem
and the fix, the right exit status, no traceback, and nothing lost."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, DaemonProcess

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]


def edgewatt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGEWATT, *args], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_port_in_use_is_one_line_and_status_2(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = edgewatt(
            "serve", "--socket", str(tmp_path / "ew.sock"), "--listen", f"127.0.0.1:{port}",
            "--state-dir", str(tmp_path),
        )  # fmt: skip
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.endswith(
        f"cannot start: cannot listen for /metrics on 127.0.0.1:{port}: Address already in use; "
        "another edgewatt or exporter has it? choose another with --listen HOST:PORT"
    )
    assert not (tmp_path / "ew.sock").exists()  # nothing half-started is left


def test_a_regular_file_at_the_socket_path_is_kept(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    result = edgewatt(
        "serve", "--socket", str(precious), "--listen", "127.0.0.1:0",
        "--state-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    assert f"{precious} exists and is not a socket; refusing to remove it" in result.stderr
    assert precious.read_text() == "keep me"


def test_a_wrong_flag_gets_the_subcommands_usage_and_the_closest_flag() -> None:
    result = edgewatt("serve", "--port", "9000")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: edgewatt serve ")
    assert result.stderr.splitlines()[-1] == (
        "edgewatt serve: error: unknown flag --port (did you mean --listen HOST:PORT?)"
    )
    result = edgewatt("run", "--lable", "a=b", "--", "true")
    assert result.stderr.splitlines()[-1] == (
        "edgewatt run: error: unknown flag --lable (did you mean --label?)"
    )
    result = edgewatt("status", "--jsn")
    assert result.stderr.splitlines()[-1] == (
        "edgewatt status: error: unknown flag --jsn (did you mean --json?)"
    )


def test_a_label_the_daemon_refuses_is_named_before_the_command_runs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = edgewatt(
        "run", "--socket", daemon.socket, "--label", "host.name=x", "--",
        "touch", str(marker),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "edgewatt run: label name 'host.name' is reserved: edgewatt or Prometheus sets "
        "'host_name' on its series; choose another name\n"
    )
    assert not marker.exists()
    # The daemon says the same, word for word, to a registration.
    status, body = daemon.call("POST", "/v1/targets", {"labels": {"host.name": "x"}})
    assert status == 400 and body["detail"] in result.stderr


def test_track_without_a_daemon_warns_once_per_process(tmp_path: Path) -> None:
    code = (
        "from edgewatt import client\n"
        "@client.track('step')\n"
        "def step(): sum(range(10000))\n"
        "for _ in range(5): step()\n"
        "with client.track('eval'): pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={"PATH": "/usr/bin:/bin", "EDGEWATT_SOCKET": str(tmp_path / "none.sock")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"edgewatt: no daemon answering at {tmp_path / 'none.sock'} (EDGEWATT_SOCKET): "
        f"no such socket; monitoring pid {_pid_in(result.stderr)} in-process"
    ]


def _pid_in(text: str) -> str:
    return text.split("monitoring pid ", 1)[1].split()[0]


def test_doctor_never_contradicts_itself(daemon_factory: Any, tmp_path: Path) -> None:
    # A daemon with no power source, checked by a doctor whose own user could find one
    # (the stand-in tegrastats): the daemon's view is the one that counts.
    daemon = daemon_factory(extra_args=["--tegrastats", str(tmp_path / "absent")])
    result = edgewatt(
        "doctor", "--socket", daemon.socket,
        env={"EDGEWATT_TEGRASTATS": str(ROOT / "tests" / "bin" / "tegrastats"),
             "EDGEWATT_LISTEN": f"127.0.0.1:{daemon.port}"},
    )  # fmt: skip
    lines = result.stdout.splitlines()
    assert lines[0].endswith("0 targets, power: none")
    power = [line for line in lines if "power source" in line]
    assert power == [
        "warn  the daemon found no power source: on Jetson check /sys/bus/i2c/drivers/ina3221* "
        "or the tegrastats path in its config; on x86 RAPL needs root; NVIDIA GPUs need pip "
        "install 'edgewatt[nvidia]' in the daemon's environment"
    ]
