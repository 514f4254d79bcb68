"""The small things a user meets: doctor's port check as the
daemon binds, each message once, no traceback on a closed pipe, "did you mean"."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgewatt.cli.doctor import metrics_port
from tests.conftest import ROOT, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]


def test_doctor_passes_a_port_whose_last_connection_is_in_time_wait() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    peer = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server's side closes first: it waits in TIME-WAIT
    peer.recv(1)
    peer.close()
    listener.close()  # a stopped daemon: nothing listens
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what doctor did: refused for the TIME-WAIT
    verdict, text = metrics_port(
        SimpleNamespace(config=SimpleNamespace(listen=("127.0.0.1", port)))
    )
    assert verdict == "ok", text
    assert text == f"port {port} is free for /metrics"


def test_a_mistyped_command_gets_its_closest() -> None:
    result = subprocess.run(
        [*EDGEWATT, "sumary", "abc"], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert result.returncode == 2
    assert "unknown command 'sumary' (did you mean summary?)" in result.stderr
    assert "invalid choice" not in result.stderr


def test_a_closed_pipe_is_no_traceback(daemon: Any, spawn: Any) -> None:
    sleeper = spawn("import time; time.sleep(60)")
    target = daemon.register(sleeper.pid)["id"]
    wait_for(lambda: daemon.call("GET", f"/v1/targets/{target}/summary")[1]["samples"] >= 1)
    reader = subprocess.Popen(
        [*EDGEWATT, "summary", "--socket", daemon.socket, target],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # `| head` that read nothing yet: every write meets a closed pipe
    errors = reader.stderr.read()
    assert reader.wait(timeout=30) == 141  # 128 + SIGPIPE, as a shell's own
    assert errors == ""


@pytest.mark.parametrize("told", ["EDGEWATT_SOCKET", "--socket", "nothing"])
def test_edgewatt_run_says_no_daemon_once(told: str, tmp_path: Path) -> None:
    # Told a socket by the variable or the flag (the command's clients then look at
    # the same one), or nothing: the defaults, the user's own daemon and the service's.
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nfrom edgewatt import client\n"
        "print(client.register().mode, os.environ.get('EDGEWATT_SOCKET'))\n"
    )
    none = str(tmp_path / "none.sock")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path)}
    flag = ["--socket", none] if told == "--socket" else []
    if told == "EDGEWATT_SOCKET":
        env["EDGEWATT_SOCKET"] = none
    result = subprocess.run(
        [*EDGEWATT, "run", *flag, "--", sys.executable, str(script)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The script's own register() found none either, where the run looked.
    assert result.stdout == f"local {none if told != 'nothing' else None}\n", result.stdout
    assert result.stderr.count("no daemon answering") == 1, result.stderr


def test_tops_detail_fits_80x24_whole_words_and_scrolls_its_phases() -> None:
    from edgewatt.cli.top import View, frame

    phases = [
        {"name": f"epoch-{n}", "duration_s": 1.0, "cpu_user_s": 0.5, "cpu_system_s": 0.1,
         "energy_j": 2.0, "power_avg_w": 2.0, "ended_at": 1.0}
        for n in range(22)
    ]  # fmt: skip
    target = {
        "id": "8f769edb0869", "kind": "process", "pid": 4242, "state": "running",
        "executable": "python3.11", "command": "python train.py", "labels": {"run": "r1"},
        "registered_at": 0.0, "latest": {"processes": 1}, "members": list(range(1000, 1030)),
        "member_count": 30, "summary": {"phases": phases},
    }  # fmt: skip
    document = {"device": {"time": 0.0, "logical_cpus": 2}, "targets": [target]}
    view = View(detail=True)
    lines = frame(document, view, 80, 24)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    # No sentence cut: the network line (92 characters) goes on in the next line.
    text = " ".join(line.strip() for line in lines)
    assert "a running target whose bytes are counted)" in text
    assert "1029" in text  # the members' last pid, on a line of its own
    marker = next(line for line in lines if line.startswith("phases ") and "scroll" in line)
    assert marker.endswith("of 22: up/down scroll") and "epoch-0 " in text
    view.scroll = 100  # past the end: held at the last rows
    lines = frame(document, view, 80, 24)
    assert any(line.startswith("epoch-21 ") for line in lines)
    assert any(line.startswith("phases ") and "-22 of 22" in line for line in lines)


def test_a_process_targets_tcp_bytes_say_they_are_a_lower_bound(daemon_factory: Any) -> None:
    # Opened, used and closed within ms, between two passes 2 s apart (as a rule: a
    # busy machine may run one meanwhile): what such a socket carried can escape.
    daemon = daemon_factory(interval=2.0)
    code = (
        "import socket, sys, threading\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "def sink():\n"
        "    peer, _ = server.accept()\n"
        "    while peer.recv(65536): pass\n"
        "threading.Thread(target=sink, daemon=True).start()\n"
        "print('up', flush=True)\n"
        "sys.stdin.readline()\n"
        "with socket.create_connection(server.getsockname()) as c: c.sendall(b'x' * 6_000_000)\n"
        "print('sent', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "2", "--no-cgroup",
         "--", sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert run.stdin is not None and run.stdout is not None
    assert run.stdout.readline() == "up\n"
    run.stdin.write("\n")
    run.stdin.flush()
    assert run.stdout.readline() == "sent\n"
    (target,) = daemon.call("GET", "/v1/targets")[1]["targets"]
    summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary")[1]
    assert summary["network_counts"] == "tcp-payload" and summary["network_lower_bound"] is True
    shown = subprocess.run(
        [*EDGEWATT, "summary", "--socket", daemon.socket, target["id"]],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert "network    sent at least " in shown.stdout, shown.stdout
    _, stderr = run.communicate("\n", timeout=60)
    assert run.returncode == 0, stderr
    assert re.search(r"^  network +sent at least [\d.]+ \S+, received at least ", stderr, re.M)


@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_an_install_prints_no_setuptools_warning(editable: bool, tmp_path: Path) -> None:
    """`pip install .` and `pip install -e .` in a fresh venv build with the setuptools
    pyproject.toml asks for (isolated, as a user's pip does): nothing the build says is a
    warning (a TOML license table, the experimental ext-modules table, the editable
    notice). pip -v shows all the build says, whichever pip the venv has."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    pip = [str(tmp_path / "venv" / "bin" / "pip"), "install", "--no-deps", "-v"]
    target = ["-e", str(ROOT)] if editable else [str(ROOT)]
    done = subprocess.run([*pip, *target], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    said = done.stdout + done.stderr
    if done.returncode != 0 and re.search(r"No matching distribution|Could not find", said):
        pytest.skip("setuptools cannot be fetched here (no package index)")
    assert done.returncode == 0, said[-3000:]
    warned = [
        line
        for line in said.splitlines()
        if re.search(r"Warning|!!|deprecated|experimental", line)
        and "byte-compiling is disabled" not in line  # distutils' note under pip -v
        and "WARNING: Location" not in line  # pip's own, of an index configured here
    ]
    assert warned == [], said[-3000:]
