"""Targets are named after what runs: the command line (``python train.py``), the
command's executable once `edgewatt run`'s held fork exec'd, and the command that run
registers it with until then (a cgroup run shorter than a pass included), bounded and
escaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt import client
from edgewatt.core import transport
from edgewatt.core.facts.commands import MAX_COMMAND, command_line
from edgewatt.core.labels import MAX_PERSON_LABEL_BYTES
from edgewatt.core.targets.access import label_refusal, label_room
from edgewatt.core.targets.history import History
from edgewatt.core.targets.target import Identity, Target
from edgewatt.exporter.registration import InvalidRegistration, parse_request, parse_saved
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


@pytest.mark.parametrize("mode", ["--no-cgroup", "--cgroup"])
def test_a_held_fork_takes_its_commands_executable_after_the_exec(daemon: Any, mode: str) -> None:
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", mode,
         "--", "sleep", "30"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        (target,) = wait_for(lambda: [t for t in targets(daemon) if t.get("command") == "sleep 30"])
        assert target["kind"] == ("cgroup" if mode == "--cgroup" else "process")
        wait_for(
            lambda: daemon.call("GET", f"/v1/targets/{target['id']}")[1]["executable"] == "sleep"
        )
        # Its series say so too: not the registrant's python3.11, nor a cgroup's path
        # (/edgewatt/run-PID).
        wait_for(
            lambda: daemon.series(
                "process_cpu_time_seconds_total",
                process_executable_name="sleep",
                edgewatt_target_id=target["id"],
            )
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


def test_a_cgroup_run_shorter_than_a_pass_is_named_after_its_command(
    daemon: Any, tmp_path: Path
) -> None:
    # The launcher is Python (`python3 -m edgewatt.cli`, `python3 .venv/bin/edgewatt`):
    # its held fork's command line, not /bin/true's, is all a pass could read.
    done = subprocess.run(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--cgroup", "--label", "run=t",
         "--", "/bin/true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (target,) = targets(daemon)
    assert target["kind"] == "cgroup"
    assert (target["command"], target["executable"]) == ("true", "true")
    summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary")[1]
    assert summary["command"] == "true"
    shown = {}
    for what in (["status"], ["summary", target["id"]]):
        shown[what[0]] = subprocess.run(
            [*EDGEWATT, *what, "--socket", daemon.socket],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        ).stdout  # fmt: skip
    row = next(x for x in shown["status"].splitlines() if x.startswith(target["id"]))
    assert row.split()[2:3] == ["true"], shown["status"]
    assert "  command    true\n" in shown["summary"], shown["summary"]


def test_the_command_field_is_named_bounded_escaped_and_kept() -> None:
    def named(argv: Any) -> Any:
        return parse_request({"command": argv}, 1234, 2**22).command

    assert named(["/usr/bin/python3", "train.py", "--epochs", "3"]) == "python3 train.py --epochs 3"
    assert named(["sleep", "", "1"]) == "sleep 1"
    assert named(["echo", "\x1b[31mred\u202e"]) == "echo \\x1b[31mred\\u202e"
    long = named(["python3", "x" * 5000])
    assert len(long) == MAX_COMMAND and long.endswith("...")
    assert parse_request({"cgroup": "/edgewatt/run-1", "command": ["true"]}, 1, 2**22).command == (
        "true"
    )
    assert parse_request({}, 1234, 2**22).command is None
    for bad in ("true", [], [""], ["true", 1], {"argv": ["true"]}):
        with pytest.raises(InvalidRegistration) as refused:
            named(bad)
        assert refused.value.error == "invalid command"
    # The state file keeps the name: a restarted daemon names the held fork so too.
    entry = {"id": "a1", "pid": 7, "start_ticks": 1, "uid": 0, "registered_at": 1.0}
    assert parse_saved({**entry, "command": "sleep 30"}, 2**22).registration.command == "sleep 30"
    for bad in ("x" * (MAX_COMMAND + 1), "a\nb", 3):
        with pytest.raises(InvalidRegistration):
            parse_saved({**entry, "command": bad}, 2**22)


def _target(labels: dict[str, str], command: str | None) -> Target:
    identity = Identity(
        id="t", pid=1, start_ticks=1, start_time=1.0, labels=labels, children=True,
        uid=1000, registered_at=1.0, command=command,
    )  # fmt: skip
    return Target(identity, History(10))


def test_a_command_counts_in_its_persons_label_bytes() -> None:
    command = "python3 " + "x" * 72  # 80 bytes, the most a command's name holds
    held = _target({"k": "v" * (MAX_PERSON_LABEL_BYTES - 200)}, command)
    room = label_room([held], 1000, lambda uid: uid)
    assert room is not None and room.left == 200 - 1 - 80
    # Labels that fit alone, and not with their command: refused, and the reason says so.
    labels = {"k": "v" * (room.left - 1)}
    assert label_refusal(_target(labels, None).identity, room) is None
    refused = label_refusal(_target(labels, "true").identity, room)
    assert refused is not None and "and the command" in str(refused)
    assert "123 asked, 119 left" in str(refused)


def test_a_daemon_without_the_command_field_is_asked_again_without_it() -> None:
    bodies: list[dict[str, Any]] = []

    class Older:  # the registration's connection to a daemon of before the field
        def call_ok(self, method: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
            bodies.append(body)
            unknown = sorted(set(body) - {"labels", "children", "pid", "cgroup"})
            if unknown:  # it refuses the field by name
                detail = f"{unknown[0]!r}; known fields: cgroup, children, labels, pid"
                raise transport.DaemonError(400, {"error": "unknown field", "detail": detail})
            return {"id": "a1"}

    older: Any = Older()
    assert client._post(older, {"labels": {}, "command": ["true"]}) == {"id": "a1"}
    assert bodies == [{"labels": {}, "command": ["true"]}, {"labels": {}}]
    with pytest.raises(transport.DaemonError):  # any other refusal stands
        client._post(older, {"labels": {}, "command": ["true"], "unit": 1})
