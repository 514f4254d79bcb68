"""What the command says when something is in the way: one line naming the problem
and the fix, the right exit status, no traceback, and nothing lost."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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


def _marker_command(marker: Path) -> list[str]:
    """A command whose only effect is a file: it ran if the file exists."""
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]


def test_an_unwritable_output_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for output, why in (
        (tmp_path / "no-such-dir" / "x.jsonl", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        result = edgewatt(
            "run", "--socket", str(tmp_path / "none.sock"), "--output", str(output), "--",
            *_marker_command(marker),
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"edgewatt run: --output {output}: cannot write: {why}; the command was not run\n"
        )
        assert not marker.exists()  # the command never started
    # The same command with a writable file runs, monitored.
    output = tmp_path / "ok.jsonl"
    result = edgewatt(
        "run", "--socket", str(tmp_path / "none.sock"), "--output", str(output), "--",
        *_marker_command(marker),
    )  # fmt: skip
    assert result.returncode == 0 and marker.exists(), result.stderr
    assert "monitored via local)" in result.stderr
    assert f"  samples written to {output}\n" in result.stderr


def test_a_command_that_cannot_be_executed_exits_126_without_a_table(tmp_path: Path) -> None:
    plain = tmp_path / "plain.sh"  # not executable
    plain.write_text("#!/bin/sh\necho hi\n")
    garbage = tmp_path / "garbage"  # executable, but no format the kernel runs: ENOEXEC
    garbage.write_bytes(b"\x7fELF" + b"\x00" * 60)
    garbage.chmod(0o755)
    output = tmp_path / "kept.jsonl"
    output.write_text('{"type": "header"}\n')  # an earlier run's, untouched
    cases = (
        (str(plain), 126, "Permission denied"),
        (str(tmp_path), 126, "Is a directory"),
        (str(garbage), 126, "Exec format error"),  # found only by the exec itself
        (str(tmp_path / "absent"), 127, "No such file or directory"),
        ("no-such-command-here", 127, "command not found"),
    )
    for command, status, why in cases:
        result = edgewatt(
            "run", "--socket", str(tmp_path / "none.sock"), "--output", str(output), "--", command
        )
        assert result.returncode == status, (command, result.stderr)
        lines = [line for line in result.stderr.splitlines() if not line.startswith("edgewatt: ")]
        # One line, as a shell says it; no table for a run that never started.
        assert lines == [f"edgewatt run: cannot start {command}: {why}"], result.stderr
        assert output.read_text() == '{"type": "header"}\n', command
    # A new --output file is not left behind by a command that never ran.
    fresh = tmp_path / "fresh.jsonl"
    result = edgewatt("run", "--socket", str(tmp_path / "n.sock"), "--output", str(fresh), "--",
                      str(garbage))  # fmt: skip
    assert result.returncode == 126 and not fresh.exists()
    # As the shell does.
    assert subprocess.run(["sh", "-c", f"'{plain}'"], capture_output=True).returncode == 126


def _energy_line(stderr: str) -> str:
    """The table's "energy" row (present where the energy is not known)."""
    rows = [line.split(None, 1) for line in stderr.splitlines() if line.startswith("  ")]
    return next(value for label, value in rows if label == "energy")


def test_no_power_source_is_said_only_where_there_is_none(tmp_path: Path) -> None:
    from tests.power_standin import build_tree

    build_tree(tmp_path / "board")  # an INA3221 at 5 V, 800 mA on the board input: 4 W
    (tmp_path / "bare").mkdir()  # a sysfs with no power sensor
    env = {"EDGEWATT_POWER_SOURCES": "ina3221"}
    bare = edgewatt("run", "--socket", str(tmp_path / "none.sock"), "--", "sleep", "0.3",
                    env={**env, "EDGEWATT_SYSFS_PATH": str(tmp_path / "bare")})  # fmt: skip
    assert bare.returncode == 0, bare.stderr
    assert _energy_line(bare.stderr) == "unknown: no power source on this device"
    # Beside one busy loop per core, as training runs: a pass then reads its target
    # milliseconds after its power edge.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]  # fmt: skip
    try:
        board = edgewatt("run", "--socket", str(tmp_path / "none.sock"), "--output",
                         str(tmp_path / "board.jsonl"), "--", "sleep", "0.3",
                         env={**env, "EDGEWATT_SYSFS_PATH": str(tmp_path / "board")})  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert board.returncode == 0, board.stderr
    watts = re.search(
        r"^  device energy +[\d.]+ J \([\d.]+ Wh\), avg ([\d.]+) W$", board.stderr, re.M
    )
    assert watts is not None, board.stderr
    # The sensor's constant 4 W, to float rounding: a sample's device energy is taken
    # at the instant its duration is measured from (when the pass read its target, not
    # the pass's power edge, which a busy machine parted from it by up to ~15 ms of
    # this 0.3 s run: 3.99 to 4.24 W), and a constant power integrates exactly between
    # readings and held past the last one.
    assert watts[1] == "4.00"
    (summary,) = [json.loads(line) for line in (tmp_path / "board.jsonl").open()
                  if '"summary"' in line]  # fmt: skip
    assert summary["avg_power_w"] == pytest.approx(4.0, rel=1e-9)
    assert "no power source" not in board.stderr


@pytest.mark.parametrize(
    ("summary", "power", "said"),
    [
        # A power source, but the run ended before the monitor's second reading.
        (
            {"samples": 0, "duration_s": 0.1},
            "present",
            "unknown: the run (0.10 s) ended before a second reading",
        ),
        # Readings, but none from the power source while the run lasted.
        (
            {"samples": 3, "duration_s": 1.5},
            "present",
            "unknown: the power source gave no reading during the run (1.50 s)",
        ),
        ({"samples": 3, "duration_s": 1.5}, "none", "unknown: no power source on this device"),
        (
            {"samples": 3, "duration_s": 1.5},
            "off",
            "not recorded (the monitor's power metric was off)",
        ),
        # A file that does not say (an older edgewatt's): only what is known.
        ({"samples": 3, "duration_s": 1.5}, None, "unknown: no power reading recorded"),
    ],
)  # fmt: skip
def test_missing_energy_says_why(summary: dict[str, Any], power: str | None, said: str) -> None:
    from edgewatt.cli.report import summary_table

    rows = [line.split(None, 1) for line in summary_table(summary, "t", power).splitlines()[1:]]
    assert ["energy", said] in rows


def test_a_power_off_monitor_file_says_energy_was_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    code = (
        "import time\n"
        "from edgewatt.client.thread_monitor import FileMonitor\n"
        f"m = FileMonitor({str(path)!r}, 0.1, records='edgewatt', socket={str(tmp_path / 'x')!r})\n"
        "m.start(); time.sleep(0.35); m.stop()\n"
    )  # FileMonitor's default metrics: power off, as heflwr's
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    result = edgewatt("report", str(path))
    assert result.returncode == 0, result.stderr
    assert _energy_line(result.stdout) == "not recorded (the monitor's power metric was off)"


def test_a_power_source_without_a_reading_yet_is_not_no_power_source(
    daemon_factory: Any, tmp_path: Path
) -> None:
    # A tegrastats that prints its first line 30 s after it starts (a board still
    # booting its sensors): the daemon has a power source, not yet a reading.
    slow = tmp_path / "slow-tegrastats"
    slow.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--stop*) exit 0;; esac\n'
        f'sleep 30; exec {ROOT / "tests" / "bin" / "tegrastats"} "$@"\n'
    )
    slow.chmod(0o755)
    daemon = daemon_factory(interval=0.2, extra_args=["--tegrastats", str(slow)])
    result = edgewatt("run", "--socket", daemon.socket, "--", "sleep", "0.3")
    assert result.returncode == 0, result.stderr
    said = _energy_line(result.stderr)
    assert re.fullmatch(
        r"unknown: the power source gave no reading during the run \((\d\.\d\d) s\)", said
    ), said
    # No energy attributed out of no energy measured.
    assert "attributed energy" not in result.stderr
