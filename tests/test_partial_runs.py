"""A figure that covers part of a run says which part: the daemon restarted (the
summary covers the time since it restored the registration), or lost under a client
or `edgewatt run` (in-process sampling's figures since, and the interval between)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edgewatt import client
from tests.conftest import ROOT, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]


def test_a_restarted_daemons_summary_says_it_covers_the_time_since(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    state = tmp_path / "persist"
    first = daemon_factory(state_dir=state)
    sleeper = spawn("import time; time.sleep(60)")
    target = first.register(sleeper.pid)["id"]
    path = f"/v1/targets/{target}/summary?fresh=1"
    before = first.call("GET", path)[1]
    assert before["covers"] == {"whole": True}
    first.stop()
    restarted = time.time()
    second = daemon_factory(state_dir=state)
    wait_for(lambda: second.call("GET", path)[1].get("samples", 0) >= 1)
    after = second.call("GET", path)[1]
    covers = after["covers"]
    assert covers["whole"] is False and "daemon restarted" in covers["why"]
    assert covers["registered_at"] == before["registered_at"]
    assert covers["from"] >= round(restarted, 3) - 0.001
    shown = subprocess.run(
        [*EDGEWATT, "summary", "--socket", second.socket, target],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.lstrip().startswith("covers"))
    assert "PART of the run from" in line and "daemon restarted" in line, shown.stdout


def test_a_clients_summary_after_the_daemon_is_lost_says_since_when(daemon_factory: Any) -> None:
    daemon = daemon_factory()
    registration = client.register(socket=daemon.socket)
    try:
        assert registration.mode == "daemon"
        assert registration.summary()["covers"] == {"whole": True}
        daemon.stop(signal.SIGKILL)
        lost = time.time()
        summary = registration.summary()
        assert registration.mode == "local"
        covers = summary["covers"]
        assert covers["whole"] is False
        assert round(lost, 3) - 0.001 <= covers["from"] <= time.time()
        assert covers["registered_at"] < covers["from"]
        assert "stopped answering" in covers["why"] and "in-process" in covers["why"]
    finally:
        registration.close()


def test_edgewatt_run_says_which_part_when_the_daemon_dies(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory()
    out = tmp_path / "run.jsonl"
    code = (
        "import sys, time\n"
        "print('up', flush=True)\n"
        "sys.stdin.readline()\n"
        "end = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\n"
    )
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--no-cgroup",
         "--output", str(out), "--", sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert run.stdin is not None and run.stdout is not None and run.stderr is not None
    assert run.stdout.readline() == "up\n"
    daemon.stop(signal.SIGKILL)
    assert "stopped answering" in run.stderr.readline()  # the switch has happened
    _, stderr = run.communicate("go\n", timeout=60)
    assert run.returncode == 0, stderr
    line = next(x for x in stderr.splitlines() if x.lstrip().startswith("covers"))
    assert "PART of the run" in line and "not " in line and "counted by neither" in line, stderr
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    covers = summary["covers"]
    assert covers["whole"] is False
    ((daemon_last, in_process_first),) = covers["uncounted"]
    assert daemon_last <= in_process_first
