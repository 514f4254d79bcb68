"""`edgewatt top` in a real terminal (tmux) against a real daemon reading the stand-in
tegrastats, with two registered targets doing known work; --once, --json, no daemon,
and a normal user against root's daemon."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
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


def stand_in(daemon_factory: Any, model: str = "Jetson AGX Thor", **kw: Any) -> DaemonProcess:
    """A daemon reading the stand-in tegrastats replaying ``model``'s lines (Thor's
    is one line: its rails hold still)."""
    return daemon_factory(
        interval=0.5,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "FAKE_TEGRASTATS_MODEL": model,
            "EDGEWATT_IDLE_POWER_W": "4.0",
            "EDGEWATT_POWER_SOURCES": "tegrastats",
        },
        **kw,
    )


@pytest.fixture
def board(daemon_factory: Any, spawn: Any) -> tuple[DaemonProcess, str, str]:
    daemon = stand_in(daemon_factory)
    burner = daemon.register(spawn(BURNER).pid, labels={"role": "train"})["id"]
    holder = daemon.register(spawn(HOLDER).pid, labels={"role": "hold"})["id"]
    assert daemon.call("POST", f"/v1/targets/{burner}/phase", {"name": "round-3"})[0] == 201
    wait_for(
        lambda: daemon.value("edgewatt_process_energy_joules_total", edgewatt_target_id=burner)
    )
    return daemon, burner, holder


class Pane:
    """`edgewatt top` in a detached tmux session of a given size, on a tmux server of
    its own, run as ``user`` (None: this test's) with ``env`` (None: this test's)."""

    def __init__(
        self,
        command: list[str],
        width: int,
        height: int,
        user: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = f"edgewatt-top-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux = ["tmux", "-L", self.name, "-f", "/dev/null"]
        self.as_user: dict[str, Any] = {"env": env}
        if user is not None:
            self.as_user.update(user=user, group=user)
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-x", str(width), "-y", str(height),
             "-s", self.name, " ".join(command)],
            check=True, cwd=ROOT if user is None else "/", **self.as_user,
        )  # fmt: skip

    def _tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.tmux, *args], capture_output=True, text=True, **self.as_user)

    def capture(self) -> list[str]:
        return self._tmux("capture-pane", "-p", "-t", self.name).stdout.rstrip("\n").split("\n")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys).check_returncode()

    def pid(self) -> int:
        return int(self._tmux("display-message", "-p", "-t", self.name, "#{pane_pid}").stdout)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", self.name).returncode == 0

    def close(self) -> None:
        self._tmux("kill-server")


@pytest.fixture
def pane_factory() -> Iterator[Any]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    panes: list[Pane] = []

    def make(command: list[str], width: int = 80, height: int = 24, **as_user: Any) -> Pane:
        panes.append(Pane(command, width, height, **as_user))
        return panes[-1]

    yield make
    for pane in panes:
        pane.close()


def row(lines: list[str], target_id: str) -> dict[str, str]:
    """The target's row as {column: cell}, under the table's header (columns that do
    not fit the width are left out: which ones is the view's choice)."""
    [line] = [line for line in lines if line.startswith(target_id)]
    header = next(x for x in lines if x.startswith(("ID ", "NAME ")) and "PHASE" in x)
    return cells_of(header, line)


def shown_row(pane: Any, target_id: str) -> dict[str, str]:
    """The target's row in the pane once a capture has it (one taken while the view
    redraws, on a loaded machine, can miss it)."""
    return wait_for(
        lambda: (lambda s: row(s, target_id) if any(x.startswith(target_id) for x in s) else None)(
            pane.capture()
        )
    )


def cells_of(header: str, line: str) -> dict[str, str]:
    # Columns are two spaces apart or more; a cell ("7.3 MiB") or a header ("PHASE J")
    # holds one at most.
    return dict(zip(re.split(r"  +", header.strip()), re.split(r"  +", line.strip())))


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
        cells = shown_row(pane, target)
        after = daemon.call("GET", f"/v1/targets/{target}/summary")[1]
        samples = daemon.call("GET", f"/v1/targets/{target}/samples?since={since - 1.5:.3f}")[1]
        joules = float(cells["J"])
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
        assert cells["CPU%"] in shown, (cells, shown)
    assert shown_row(pane, burner)["PHASE"] == "round-3"
    assert shown_row(pane, holder)["PHASE"] == "-"
    # Sorting: by CPU the burner leads, by memory the 64 MiB holder does.
    pane.keys("c")

    # (The power sort already has the burner first: wait for the key's redraw.)
    def sorted_by(key: str) -> list[str] | None:
        lines = pane.capture()
        return table(lines) if f"sort: {key}" in "\n".join(lines) else None

    assert wait_for(lambda: sorted_by("cpu")) == [burner, holder]
    pane.keys("m")
    wait_for(lambda: sorted_by("memory") == [holder, burner])
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
    wait_for(lambda: not pane.alive())


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
    assert row(lines, burner)["PHASE"] == "round-3" and row(lines, holder)["PHASE"] == "-"
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
    # By CPU number: this VM's CPUs are all online, numbered from 0.
    cores = device["cpu_core_utilization"]
    assert list(cores) == [str(n) for n in range(device["logical_cpus"])]
    assert all(0 <= u <= 1 for u in cores.values())
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


@pytest.mark.skipif(os.geteuid() != 0, reason="changing users needs root")
def test_a_normal_user_watches_roots_daemon_live(
    daemon_factory: Any, spawn: Any, public_dir: Path, pane_factory: Any
) -> None:
    """The live view in tmux, tmux and all run as nobody, against root's daemon on
    the stand-in board: the frame nobody sees has the rails /metrics has and root's
    target with its phase."""
    daemon = stand_in(daemon_factory, socket_dir=public_dir)
    burner = daemon.register(spawn(BURNER).pid, labels={"role": "train"})["id"]
    assert daemon.call("POST", f"/v1/targets/{burner}/phase", {"name": "round-1"})[0] == 201
    pane = pane_factory(
        [SYSTEM_PYTHON, "-m", "edgewatt.cli", "top", "--socket", daemon.socket],
        user=NOBODY,
        # SHELL: tmux runs the command with it, else nobody's login shell, nologin.
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir), "SHELL": "/bin/sh"},
    )
    assert os.stat(f"/proc/{pane.pid()}").st_uid == NOBODY
    lines = wait_for(
        lambda: (lambda s: s if any(x.startswith(burner) for x in s) else None)(pane.capture())
    )
    print("\n".join(lines))  # the frame, for the record (pytest -s)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("edgewatt top ")
    text = "\n".join(lines)
    assert rails(daemon) and all(f"{n} {w:.2f}/" in text for n, w in rails(daemon).items())
    # The sensor, its rail and the rate tegrastats prints at (source.py, AUTO_PUSH_HZ).
    assert lines[1].endswith(" J since start; tegrastats VIN at 10 Hz")
    assert row(lines, burner)["PHASE"] == "round-1"
    pane.keys("q")
    wait_for(lambda: not pane.alive())


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_an_interval_that_never_refreshes_is_refused(interval: str) -> None:
    out = subprocess.run(
        [*EDGEWATT, "top", "--interval", interval], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 2
    assert "--interval must be above 0 s" in out.stderr


def stat(cores: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat of the online CPUs ``cores``: {number: (user ticks, idle ticks)}."""
    user, idle = (sum(c[i] for c in cores.values()) for i in (0, 1))
    lines = [f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {u} 0 0 {i} 0 0 0 0 0 0" for n, (u, i) in sorted(cores.items())]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 10", ""])


def test_each_core_is_labelled_by_its_number_across_hotplug(tmp_path: Path) -> None:
    """/proc/stat lists online CPUs only: with cpu2 offline, then cpu1 taken offline and
    cpu2 brought online, a core's figure is its own CPU's, under its number."""
    from edgewatt.cli.top import device_lines
    from edgewatt.core.facts.procfs import CLOCK_TICKS
    from edgewatt.core.platforms.linux import LinuxPlatform
    from edgewatt.core.sampling.host import HostReader
    from edgewatt.core.snapshot import Snapshot
    from edgewatt.exporter.documents import host

    (tmp_path / "net").mkdir()
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 400 kB\n")
    (tmp_path / "net" / "dev").write_text("Inter-|\n face |\n")
    (tmp_path / "stat").write_text(stat({0: (100, 900), 1: (500, 500), 3: (0, 1000)}))
    reader = HostReader(LinuxPlatform(str(tmp_path)))
    first = reader.read()
    assert first is not None and first.cpu.per_cpu == {
        0: (100 / CLOCK_TICKS, 1000 / CLOCK_TICKS),
        1: (500 / CLOCK_TICKS, 1000 / CLOCK_TICKS),
        3: (0.0, 1000 / CLOCK_TICKS),
    }
    assert first.core_utilization == {0: None, 1: None, 3: None}  # no interval yet
    # 100 ticks later: cpu0 busy 50 of them, cpu3 25, cpu1 offline, cpu2 online.
    (tmp_path / "stat").write_text(stat({0: (150, 950), 2: (7, 3), 3: (25, 1075)}))
    second = reader.read()
    assert second is not None and second.cpu.logical_cpus == 3
    assert second.core_utilization == {0: 0.5, 2: None, 3: 0.25}
    document = {"device": host(Snapshot(time=0.0, sequence=2, host=second)), "targets": []}
    assert document["device"]["cpu_core_utilization"] == {"0": 0.5, "2": None, "3": 0.25}
    assert "cpu% per core: 0:50  1:off  2:-  3:25" in device_lines(document, 80)
    # A run of offline CPUs is one item, however many: the line stays bounded.
    document["device"]["cpu_core_utilization"] = {"0": 0.5, "4": 0.25, "4095": 1.0}
    assert "cpu% per core: 0:50  1-3:off  4:25  5-4094:off  4095:100" in device_lines(document, 80)


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


def test_the_network_rate_is_over_the_last_intervals_not_since_registration() -> None:
    """A target that sent 1,000,000 bytes at first and 4,000 per half second since: its
    rate is the last two intervals' 8,000 B/s, not the 672,000 B/s average."""
    from edgewatt.cli.top import View, frame
    from edgewatt.core.targets.history import History
    from edgewatt.core.targets.row import SAMPLE_FIELDS, SampleRow

    history = History(capacity=10)
    assert history.network_rate() is None
    for step, sent in enumerate((0, 1_000_000, 1_004_000, 1_008_000)):
        row = dict.fromkeys(SAMPLE_FIELDS, 0)
        row.update(time=1000.0 + step / 2, network_transmit_bytes=sent)
        row.update(network_receive_bytes=3 * step)  # 3 bytes a row
        history.add(SampleRow(**row, monotonic=10.0 + step / 2))
    rate = history.network_rate()
    assert rate == {
        "transmit_bytes_per_s": 8000.0,
        "receive_bytes_per_s": 6.0,
        "window_s": 1.0,
        "from_time": 1000.5,
        "to_time": 1001.5,
    }
    # Shown with its unit in each cell, sent/received; where the row has room.
    document = {
        "device": {"time": 0.0, "logical_cpus": 2},
        "targets": [
            {"id": "a1", "state": "running", "executable": "sender", "labels": {},
             "registered_at": 0.0, "latest": {"processes": 1}, "network_rate": rate},
        ],
    }  # fmt: skip
    lines = frame(document, View(), 120)
    header = next(line for line in lines if line.startswith("ID "))
    [cell] = [c for c in lines[lines.index(header) + 1].split("  ") if "/" in c]
    assert (header.split().index("TX/RX"), cell) == (6, "7.8KiB/6B")
    lines = frame({**document, "targets": [{**document["targets"][0], "summary": {}}]},
                  View(detail=True), 120)  # fmt: skip
    assert (
        "network rate: 7.8 KiB/s sent, 6 B/s received (TCP payload, over the last 1.0 s)" in lines
    )
    # A counter unknown (no accounting) or gone back: no rate, not a negative one.
    history.add(history.rows[-1]._replace(network_transmit_bytes=5, monotonic=12.0))
    assert history.network_rate() is None


SENDER = """
import socket, sys, time
port = int(sys.stdin.readline())   # once registered
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"x" * 4_000_000)   # a burst, then a trickle
while True:
    c.sendall(b"y" * 2_000)
    time.sleep(0.1)
"""
SINK = """
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
while conn.recv(1 << 16):
    pass
"""


def test_the_daemon_serves_each_targets_rate_from_its_last_samples(
    daemon_factory: Any, spawn: Any
) -> None:
    daemon = daemon_factory(interval=0.5)
    sink = spawn(SINK, stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    sender = spawn(SENDER, stdin=subprocess.PIPE, text=True)
    target = daemon.register(sender.pid)["id"]
    sender.stdin.write(f"{port}\n")
    sender.stdin.flush()

    def document() -> dict[str, Any]:
        [top] = daemon.call("GET", "/v1/top")[1]["targets"]
        return top

    def after(when: float) -> dict[str, Any] | None:
        """The document once its window starts at ``when`` or later."""
        top = document()
        rate = top["network_rate"]
        return top if rate is not None and rate["from_time"] >= when else None

    def burst() -> float | None:
        latest = document()["latest"] or {}
        return latest["time"] if latest.get("network_transmit_bytes", 0) > 4_000_000 else None

    # The first sample past the burst, then a window that starts there: the trickle's.
    first_past = wait_for(burst)
    top = wait_for(lambda: after(first_past))
    rate = top["network_rate"]
    rows = {r["time"]: r for r in daemon.call("GET", f"/v1/targets/{target}/samples")[1]["samples"]}
    first, last = rows[rate["from_time"]], rows[rate["to_time"]]
    sent = last["network_transmit_bytes"] - first["network_transmit_bytes"]
    assert rate["transmit_bytes_per_s"] == pytest.approx(sent / rate["window_s"], abs=0.1)
    assert rate["receive_bytes_per_s"] == 0.0  # the sink answers nothing
    # The trickle's rate, far below the average the burst makes since registration.
    summary = top["summary"]
    assert 0 < rate["window_s"] < summary["duration_s"]
    assert (
        rate["transmit_bytes_per_s"] < summary["network_transmit_bytes"] / summary["duration_s"] / 2
    )


def test_the_gpu_line_shows_the_frequency_the_board_reports(daemon_factory: Any) -> None:
    """JetPack 6 and 7 print GR3D_FREQ as load@[MHz of each GPC]: the device lines
    show the load and the clock, as the line has them."""
    from edgewatt.core.power.child import Timed
    from edgewatt.core.power.tegrastats import _reading, parse_line

    fixtures = (ROOT / "tests" / "fixtures" / "tegrastats-samples.txt").read_text()
    lines = [line for line in fixtures.splitlines() if "@[" in line and line[0] != "#"]
    gpus = [_reading(Timed(0.0, parse_line(line))).gpus[0] for line in lines]
    shown = [(round(g.utilization * 100), g.frequency_mhz) for g in gpus]
    assert shown == [(84, 713), (63, 621), (0, 305), (87, 305), (31, 305), (12, 1300), (0, 510)]
    daemon = stand_in(daemon_factory, "AGX Orin Developer Kit 64GB")  # 12%@[1300,1300]
    wait_for(lambda: daemon.call("GET", "/v1/host")[1]["power"])
    raw = subprocess.run(
        [*EDGEWATT, "top", "--json", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    [gpu] = json.loads(raw.stdout)["device"]["power"]["gpus"]
    assert (gpu["utilization"], gpu["frequency_mhz"]) == (0.12, 1300)
    once = subprocess.run(
        [*EDGEWATT, "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert "gpu: GR3D 12% load at 1300 MHz" in once.stdout.splitlines(), once.stdout


def finished_cells(target: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """A finished target's final figures as its row shows them (the summary's): end,
    how, exit status, CPU, energy, peak memory."""
    from edgewatt.cli.status import amount, human_bytes

    code = summary["exit_status"]
    return [
        time.strftime("%H:%M:%S UTC", time.gmtime(target["exited_at"])),
        target["state"],
        "-" if code is None else str(code),
        f"{amount(summary['cpu_user_s'] + summary['cpu_system_s'], 2)} s",
        "-" if summary["energy_j"] is None else f"{summary['energy_j']:.3g} J",
        human_bytes(summary["memory_pss_peak_bytes"]),
    ]


# Known work that ends: 0.5 s of CPU over 32 MiB it wrote, then exit status 3.
FINISHER = (
    "import sys, time\n"
    "sys.stdin.readline()\n"
    "x = bytearray(32 << 20)\n"
    "for i in range(0, len(x), 4096): x[i] = 1\n"
    "end = time.process_time() + 0.5\n"
    "while time.process_time() < end: pass\n"
    "raise SystemExit(3)\n"
)


def test_finished_targets_are_listed_below_dimmed_with_their_final_figures(
    board: Any, spawn: Any, pane_factory: Any
) -> None:
    """One target exits with status 3 after known work, another is let go by its last
    registration: both are listed below the running ones, the last ended first, dimmed
    (SGR 2 in the pane's escape codes, the running rows not), each with its end, how it
    ended, exit status, CPU, J and peak memory as its summary has them; on 80x24 and on
    a wider pane, in --once and in --json."""
    daemon, burner, holder = board
    worker = spawn(FINISHER, stdin=subprocess.PIPE, text=True)
    exited = daemon.register(worker.pid, labels={"role": "done"})["id"]
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.wait(timeout=60) == 3
    by_id = lambda: {t["id"]: t for t in daemon.call("GET", "/v1/targets")[1]["targets"]}  # noqa: E731
    wait_for(lambda: by_id()[exited]["state"] == "exited")
    let_go = daemon.register(spawn("import time; time.sleep(60)").pid, labels={"role": "gone"})
    assert daemon.call("DELETE", f"/v1/targets/{let_go['id']}")[0] == 200
    targets = by_id()
    finished = [targets[let_go["id"]], targets[exited]]  # the last ended first
    assert [t["state"] for t in finished] == ["unregistered", "exited"]
    summaries = [daemon.call("GET", f"/v1/targets/{t['id']}/summary")[1] for t in finished]
    expected = [finished_cells(t, s) for t, s in zip(finished, summaries)]
    code = 3 if os.geteuid() == 0 else None  # from the kernel's exit record, read as root
    assert summaries[1]["exit_status"] == code and summaries[1]["energy_j"] > 0
    assert summaries[1]["cpu_user_s"] + summaries[1]["cpu_system_s"] >= 0.5
    assert summaries[1]["memory_pss_peak_bytes"] >= 32 << 20

    def shown(lines: list[str]) -> list[list[str]]:
        """The finished rows' final figures (their cells from ENDED to PSS PEAK)."""
        start = next(i for i, x in enumerate(lines) if x.startswith("finished, kept 600 s"))
        header = re.split(r"  +", lines[start + 1].strip())
        first = header.index("ENDED")
        rows = [re.split(r"  +", x.strip()) for x in lines[start + 2 : start + 4]]
        return [row[first : first + 6] for row in rows]

    # pytest sets COLUMNS=80 and LINES=24, which curses would take over the pane's size.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def look(width: int, height: int) -> None:
        pane = pane_factory(
            [*EDGEWATT, "top", "--socket", daemon.socket, "--interval", "1"], width, height, env=env
        )
        lines = wait_for(
            lambda: (lambda s: s if any("finished, kept" in x for x in s) else None)(pane.capture())
        )
        assert len(lines) <= height and all(len(line) <= width for line in lines)
        assert shown(lines) == expected, (width, "\n".join(lines))
        # Below the live rows: both running targets' rows come before the title.
        title = next(i for i, x in enumerate(lines) if x.startswith("finished, kept"))
        assert set(table(lines[:title])) == {burner, holder}
        # Dimmed: SGR 2 begins each finished line (its title, header and rows), and
        # none of the others.
        escaped = pane._tmux("capture-pane", "-e", "-p", "-t", pane.name).stdout.split("\n")
        dim = [i for i, x in enumerate(escaped) if re.match(r"(\x1b\[[0-9;]*m)*\x1b\[2m", x)]
        assert dim == [title, title + 1, title + 2, title + 3], "\n".join(map(repr, escaped))
        ids = [x.split()[0] for x in lines[title + 2 : title + 4]]
        # On 80 columns the ids are left out (Enter shows them); on 160 they are shown.
        # On 80 its name, what runs: the command line's first word here.
        key = "id" if width > 100 else "command"
        assert ids == [t[key].split()[0] for t in finished]
        pane.keys("q")
        wait_for(lambda: not pane.alive())

    look(80, 24)
    look(160, 40)

    once = subprocess.run(
        [*EDGEWATT, "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert once.returncode == 0 and "\x1b" not in once.stdout, once.stderr
    assert shown(once.stdout.splitlines()) == expected, once.stdout
    raw = subprocess.run(
        [*EDGEWATT, "top", "--json", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    document = {t["id"]: t for t in json.loads(raw.stdout)["targets"]}
    for target, summary in zip(finished, summaries):
        got = document[target["id"]]
        assert (got["state"], got["exited_at"]) == (target["state"], target["exited_at"])
        assert finished_cells(got, got["summary"]) == finished_cells(target, summary)
    assert json.loads(raw.stdout)["health"]["exited_retention_s"] == 600


def test_many_finished_targets_fit_the_screen_and_the_selection_stays_on_it() -> None:
    """A process registering and letting go in a loop leaves up to max_targets finished
    targets: the screen shows the last ended that fit, then how many more; the selection
    moves over the shown rows only, a finished one drawn reversed and dimmed."""
    from edgewatt.cli.top import View, styled_frame

    finished = [
        {"id": f"{n:012x}", "state": "unregistered", "pid": 100 + n, "executable": "loop",
         "labels": {}, "registered_at": 0.0, "exited_at": 1000.0 + n,
         "summary": {"cpu_user_s": 0.5, "cpu_system_s": 0.25, "energy_j": float(n),
                     "exit_status": None, "memory_pss_peak_bytes": 2**20}}
        for n in range(500)
    ]  # fmt: skip
    running = {"id": "a" * 12, "state": "running", "executable": "train", "labels": {},
               "registered_at": 0.0, "latest": {"processes": 1}, "summary": {}}  # fmt: skip
    document = {"device": {"time": 0.0, "logical_cpus": 2}, "health": {},
                "targets": [*finished, running]}  # fmt: skip
    view = View(selected=10**6)
    lines = styled_frame(document, view, 80, 24)
    assert len(lines) == 24 and all(len(line.text) <= 80 for line in lines)
    title = next(i for i, x in enumerate(lines) if x.text.startswith("finished"))
    rows = lines[title + 2 : -2]  # then the count, then the footer
    # The last ended first (energy n of target n), as many as fit.
    assert [float(r.text.split()[-4]) for r in rows] == [499.0 - n for n in range(len(rows))]
    assert lines[-2].text == f"({500 - len(rows)} more finished: edgewatt status lists them)"
    assert all(line.finished for line in lines[title:-1]) and not lines[-1].finished
    # The selection went past the end: it is on the last row shown, reversed and dimmed.
    assert view.selected == len(rows)
    assert [line for line in lines if line.selected] == [rows[-1]]
    assert rows[-1].finished
    # --once: at most 20, however tall the frame.
    tall = styled_frame(document, View(), 80, 10**6)
    assert sum(" unregistered " in line.text for line in tall) == 19
    assert "(481 more finished: edgewatt status lists them)" in [x.text for x in tall]


def test_a_row_one_column_too_wide_leaves_out_procs_before_the_id() -> None:
    """The ID names a target for `edgewatt summary ID` and the detail: on 80 columns a
    busy target's row ("100.0" % of one core, a 3-digit J) once lost it first."""
    from edgewatt.cli.top import COLUMNS, table_lines

    busy = ("8f769edb0869", "python3.11", "12.25", "190.7", "100.0", "107.3 MiB",
            "0 B/0 B", "1", "round-12", "101.5", "role=train")  # fmt: skip
    assert len(busy) == len(COLUMNS)
    header, line = table_lines([busy], 80)
    assert header.split()[:2] == ["ID", "NAME"] and "PROCS" not in header
    assert line.startswith("8f769edb0869  python3.11") and len(line) <= 80
    # The labels where there is room: the phase's joules leave first.
    assert "round-12" in line and line.endswith("role=train") and "101.5" not in line
    wide_header, _ = table_lines([busy], 160)  # room for every column
    assert wide_header.split() == [*" ".join(COLUMNS).split()]


class SlowDaemon:
    """A socket answering GET /v1/top with ``document``, its ``slow``-th answer
    ``delay_s`` late (a daemon on a device under stress)."""

    def __init__(self, path: str, document: dict[str, Any], slow: int, delay_s: float) -> None:
        self.document, self.slow, self.delay_s = document, slow, delay_s
        self.answers = 0
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                if not conn.recv(65536):
                    continue  # a probe: whether something listens (transport.find_daemon)
                self.answers += 1
                if self.answers == self.slow:
                    time.sleep(self.delay_s)
                body = json.dumps(self.document).encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                conn.sendall(head.encode() + b"\r\n" + body)

    def close(self) -> None:
        self.server.close()


def test_top_stays_up_through_a_slow_answer_and_says_how_old_its_figures_are(
    daemon: DaemonProcess, pane_factory: Any, tmp_path: Path
) -> None:
    document = daemon.call("GET", "/v1/top")[1]
    slow = SlowDaemon(str(tmp_path / "slow.sock"), document, slow=2, delay_s=4.0)
    try:
        command = [*EDGEWATT, "top", "--socket", slow.server.getsockname(), "--interval", "0.5"]
        pane = pane_factory(command, width=120)
        wait_for(lambda: any(line.startswith("edgewatt top") for line in pane.capture()))
        # The second answer is 4 s late: the view stays, with its figures' age.
        stale = wait_for(lambda: [x for x in pane.capture() if "s old" in x], timeout=8)
        assert "has not answered" in stale[0]
        assert pane.alive()
        # Then it answers again, and the view is fresh.
        wait_for(lambda: slow.answers >= 3 and not any("s old" in x for x in pane.capture()))
        assert pane.alive()
    finally:
        slow.close()
