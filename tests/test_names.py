"""Targets are named after what runs: the command line (``python train.py``), the
command's executable once `edgewatt run`'s held fork exec'd, bounded and escaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgewatt.core.facts.commands import MAX_COMMAND, command_line
from tests.conftest import ROOT, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]


def targets(daemon: Any) -> list[dict[str, Any]]:
    return daemon.call("GET", "/v1/targets")[1]["targets"]


def test_a_run_is_named_after_its_command_not_edgewatts_python(daemon: Any, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import sys\nsys.stdin.readline()\n")
    python = os.path.basename(sys.executable)
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--no-cgroup",
         "--label", "run=r1", "--", sys.executable, "train.py"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        (target,) = wait_for(
            lambda: [t for t in targets(daemon) if t.get("command") == f"{python} train.py"]
        )
        status = subprocess.run(
            [*EDGEWATT, "status", "--socket", daemon.socket],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        )  # fmt: skip
        row = next(x for x in status.stdout.splitlines() if x.startswith(target["id"]))
        assert f"{python} train.py" in row and "run=r1" in row, status.stdout
    finally:
        run.communicate("\n", timeout=60)
    assert run.returncode == 0


def test_a_held_fork_takes_its_commands_executable_after_the_exec(
    daemon: Any, tmp_path: Path
) -> None:
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--no-cgroup",
         "--", "sleep", "30"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        (target,) = wait_for(lambda: [t for t in targets(daemon) if t.get("command") == "sleep 30"])
        wait_for(
            lambda: daemon.call("GET", f"/v1/targets/{target['id']}")[1]["executable"] == "sleep"
        )
        # Its series say so too: not the registrant's python3.11.
        wait_for(
            lambda: daemon.series("process_cpu_time_seconds_total", process_executable_name="sleep")
        )
    finally:
        run.send_signal(signal.SIGTERM)  # forwarded to the command
        run.communicate(timeout=60)


def test_a_command_line_is_bounded_and_escaped(spawn: Any) -> None:
    long = spawn(
        "import time; time.sleep(60)  # \x1b[31m" + "x" * 5000,
    )
    shown = wait_for(lambda: command_line(long.pid))
    assert len(shown) == MAX_COMMAND and shown.endswith("...")
    assert "\x1b" not in shown and "\\x1b[31m" in shown
    assert shown.startswith(os.path.basename(sys.executable) + " -c import time")
    assert command_line(2**22 + 1) is None  # no such process
