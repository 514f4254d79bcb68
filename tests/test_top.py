"""`edgewatt top` in a real terminal (tmux) against a real daemon reading the stand-in
tegrastats, with two registered targets doing known work; --once, --json, no daemon,
and a normal user against root's daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SYSTEM_PYTHON, DaemonProcess, wait_for

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
NOBODY = 65534
# Known work: one target burns a core in dd and is in phase "round-3"; the other holds
# 64 MiB it has written and sleeps.
BURNER = "import os; os.execv('/bin/dd', ['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=512'])"
HOLDER = "import time\nblock = b'x' * (64 << 20)\nwhile True: time.sleep(1)"


@pytest.fixture
def board(daemon_factory: Any, spawn: Any) -> tuple[DaemonProcess, str, str]:
    daemon = daemon_factory(
        interval=0.5,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "EDGEWATT_IDLE_POWER_W": "4.0",
            "EDGEWATT_POWER_SOURCES": "tegrastats",
        },
    )
    burner = daemon.register(spawn(BURNER).pid, labels={"role": "train"})["id"]
    holder = daemon.register(spawn(HOLDER).pid, labels={"role": "hold"})["id"]
    assert daemon.call("POST", f"/v1/targets/{burner}/phase", {"name": "round-3"})[0] == 201
    wait_for(
        lambda: daemon.value("edgewatt_process_energy_joules_total", edgewatt_target_id=burner)
    )
    return daemon, burner, holder


class Pane:
    """`edgewatt top` in a detached tmux session of a given size."""

    def __init__(self, command: list[str], width: int, height: int) -> None:
        self.name = f"edgewatt-top-{os.getpid()}-{time.monotonic_ns()}"
        subprocess.run(
            ["tmux", "new-session", "-d", "-x", str(width), "-y", str(height), "-s", self.name,
             " ".join(command)],
            check=True, cwd=ROOT,
        )  # fmt: skip

    def capture(self) -> list[str]:
        out = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return out.stdout.rstrip("\n").split("\n")

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def pane_factory() -> Iterator[Any]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    panes: list[Pane] = []

    def make(command: list[str], width: int = 80, height: int = 24) -> Pane:
        panes.append(Pane(command, width, height))
        return panes[-1]

    yield make
    for pane in panes:
        pane.close()


def row(lines: list[str], target_id: str) -> list[str]:
    """The target's row as cells (MEM's number and unit are one cell)."""
    [line] = [line for line in lines if line.startswith(target_id)]
    cells = line.split()
    return [*cells[:6], f"{cells[6]} {cells[7]}", *cells[8:]]


def table(lines: list[str]) -> list[str]:
    """The target ids in the order the table shows them."""
    start = next(i for i, line in enumerate(lines) if line.startswith("ID "))
    return [
        line.split()[0] for line in lines[start + 1 :] if line and line[0] in "0123456789abcdef"
    ]


def rails(daemon: DaemonProcess) -> dict[str, float]:
    return {labels["hw_name"]: v for labels, v in daemon.series("hw_power_watts")}


def test_the_live_view_shows_what_the_daemon_counts(board: Any, pane_factory: Any) -> None:
    daemon, burner, holder = board
    pane = pane_factory([*EDGEWATT, "top", "--socket", daemon.socket, "--interval", "1"])
    lines = wait_for(lambda: (lambda s: s if any(holder in x for x in s) else None)(pane.capture()))
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    # Each rail's watts as /metrics has them, to the two decimals shown.
    for name, watts in rails(daemon).items():
        assert f"{name} {watts:.2f}/" in text, (name, watts, text)
    # Each target's energy and CPU as the daemon counted them within one refresh: the
    # frame shown was fetched between the two summaries.
    cpus = daemon.call("GET", "/healthz")[1]["logical_cpus"]
    for target in (burner, holder):
        before = daemon.call("GET", f"/v1/targets/{target}/summary")[1]
        since = time.time() - 0.1
        time.sleep(1.6)  # at least one refresh after ``before``
        cells = row(pane.capture(), target)
        after = daemon.call("GET", f"/v1/targets/{target}/summary")[1]
        samples = daemon.call("GET", f"/v1/targets/{target}/samples?since={since - 1.5:.3f}")[1]
        joules = float(cells[3])
        assert round(before["energy_j"], 1) <= joules <= round(after["energy_j"], 1), (
            cells,
            before["energy_j"],
            after["energy_j"],
        )
        shown = {
            f"{s['cpu_utilization'] * cpus * 100:.1f}"
            for s in samples["samples"]
            if s["cpu_utilization"] is not None
        }
        assert cells[4] in shown, (cells, shown)
    assert row(pane.capture(), burner)[7] == "round-3"
    assert row(pane.capture(), holder)[7] == "-"
    # Sorting: by CPU the burner leads, by memory the 64 MiB holder does.
    pane.keys("c")
    wait_for(lambda: table(pane.capture()) == [burner, holder])
    assert "sort: cpu" in "\n".join(pane.capture())
    pane.keys("m")
    wait_for(lambda: table(pane.capture()) == [holder, burner])
    # Enter: the selected (first) target's detail, its labels and no phase.
    pane.keys("Enter")
    detail = "\n".join(
        wait_for(
            lambda: (lambda s: s if any(f"target {holder}" in x for x in s) else None)(
                pane.capture()
            )
        )
    )
    assert "labels: role=hold" in detail and "(no phases)" in detail
    assert f"members (1): {daemon.call('GET', f'/v1/targets/{holder}')[1]['pid']}" in detail
    # Down, Enter twice: back to the table, then the burner's detail with its phase.
    pane.keys("Enter")
    pane.keys("Down")
    pane.keys("Enter")
    detail = "\n".join(
        wait_for(
            lambda: (lambda s: s if any(f"target {burner}" in x for x in s) else None)(
                pane.capture()
            )
        )
    )
    assert "labels: role=train" in detail
    [phase] = [line for line in detail.split("\n") if line.startswith("round-3")]
    assert phase.endswith("(running)")
    pane.keys("q")
    wait_for(
        lambda: (
            subprocess.run(["tmux", "has-session", "-t", pane.name], capture_output=True).returncode
            != 0
        )
    )


def test_once_and_json_print_one_frame(board: Any) -> None:
    daemon, burner, holder = board
    once = subprocess.run(
        [*EDGEWATT, "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    assert "\x1b" not in once.stdout  # plain text, for a script or a log
    for name, watts in rails(daemon).items():
        assert f"{name} {watts:.2f}/" in once.stdout
    lines = once.stdout.splitlines()
    assert row(lines, burner)[7] == "round-3" and row(lines, holder)[7] == "-"
    assert all(len(line) <= 80 for line in lines)
    raw = subprocess.run(
        [*EDGEWATT, "top", "--json", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    document = json.loads(raw.stdout)
    power = document["device"]["power"]
    assert {n: r["power_w"] for n, r in power["rails"].items()} == rails(daemon)
    # The stand-in repeats one line: the minute's average is the same watts.
    for rail in power["rails"].values():
        assert rail["power_avg_w"] == pytest.approx(rail["power_w"], abs=1e-6)
    assert power["temperatures_c"] == {
        "tegrastats/cpu": 30.468,
        "tegrastats/tj": 31.218,
        "tegrastats/soc012": 30.218,
        "tegrastats/soc345": 31.218,
    }
    assert document["health"]["power_sources"] == ["tegrastats"]
    device = document["device"]
    assert len(device["cpu_core_utilization"]) == device["logical_cpus"]
    assert all(0 <= u <= 1 for u in device["cpu_core_utilization"])
    by_id = {t["id"]: t for t in document["targets"]}
    assert set(by_id) == {burner, holder}
    assert [p["name"] for p in by_id[burner]["summary"]["phases"]] == ["round-3"]


def test_no_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.sock")
    top = subprocess.run(
        [*EDGEWATT, "top", "--once", "--socket", missing], capture_output=True, text=True, cwd=ROOT
    )
    status = subprocess.run(
        [*EDGEWATT, "status", "--socket", missing], capture_output=True, text=True, cwd=ROOT
    )
    assert top.returncode == status.returncode == 1
    assert top.stderr == status.stderr.replace("edgewatt status:", "edgewatt top:")
    assert "Start one: sudo systemctl start edgewatt, or edgewatt serve" in top.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="changing users needs root")
def test_a_normal_user_sees_roots_daemon(daemon_factory: Any, spawn: Any, public_dir: Path) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    target = daemon.register(spawn("import time; time.sleep(60)").pid)["id"]
    for flag in ("--once", "--json"):
        out = subprocess.run(
            [SYSTEM_PYTHON, "-m", "edgewatt.cli", "top", flag, "--socket", daemon.socket],
            capture_output=True, text=True, user=NOBODY, group=NOBODY, cwd="/",
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir), "COLUMNS": "80"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert target in out.stdout


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_an_interval_that_never_refreshes_is_refused(interval: str) -> None:
    out = subprocess.run(
        [*EDGEWATT, "top", "--interval", interval], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 2
    assert "--interval must be above 0 s" in out.stderr


def test_each_core_is_read_from_its_own_line() -> None:
    from edgewatt.core.sampling.procfs import CLOCK_TICKS
    from edgewatt.core.sampling.system import parse_cpu

    stat = (
        b"cpu  300 0 100 1000 100 0 0 0 0 0\n"
        b"cpu0 200 0 50 400 50 0 0 0 0 0\n"
        b"cpu1 100 0 50 600 50 0 0 0 0 0\n"
        b"intr 1 2 3\n"
    )
    cpu = parse_cpu(stat)
    assert cpu.logical_cpus == 2
    # busy: all but idle and iowait; total: every column (guest is inside user).
    assert cpu.per_cpu == (
        (250 / CLOCK_TICKS, 700 / CLOCK_TICKS),
        (150 / CLOCK_TICKS, 800 / CLOCK_TICKS),
    )


def test_a_device_without_a_power_source_says_so(daemon: DaemonProcess) -> None:
    # No sensor here: one plain sentence, not a row of dashes for watts and hertz.
    once = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    lines = once.stdout.splitlines()
    assert lines[1] == "power: no power source on this device (edgewatt doctor says why)"
    assert " - W" not in once.stdout
