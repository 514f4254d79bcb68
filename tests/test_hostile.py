"""The hostile-input suite: what a hostile local user, a slow network client and bad
input try against the real daemon, over its real Unix socket and real TCP on loopback.

Each test bounds its own duration. Tests that need a second user run code as
``nobody`` (and as uid 4242, a user with no name), so they need root.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import transport
from edgewatt.exporter.statefile import StateFile
from edgewatt.exporter.write_budget import WriteBudget
from tests.conftest import ROOT, SYSTEM_PYTHON, DaemonProcess, call_as, post, raw, wait_for

NOBODY = 65534
STRANGER = 4242  # a second unprivileged user, without a passwd entry
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


def timed_scrape(port: int, source: str = "127.0.0.1") -> tuple[float, bytes]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    return time.monotonic() - started, data


def timed_health(path: str) -> float:
    started = time.monotonic()
    status, _ = transport.call(path, "GET", "/healthz", timeout=5)
    assert status == 200
    return time.monotonic() - started


def run_as(uid: int, code: str, **kw: Any) -> subprocess.Popen:
    """The system Python running ``code`` as ``uid`` (stdlib only)."""
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", code], user=uid, group=uid, cwd="/",
        env={"PATH": "/usr/bin:/bin"}, **kw,
    )  # fmt: skip


# -- 1. one target must not break every scrape -------------------------------------


def test_lone_surrogates_are_refused_with_400_and_scrapes_go_on(daemon: DaemonProcess) -> None:
    target = daemon.register(os.getpid())
    status, body = raw(
        daemon.socket, post(f"/v1/targets/{target['id']}/phase", b'{"name": "ep\\udcff"}')
    )
    assert (status, body["error"]) == (400, "invalid phase name")
    assert "lone surrogate" in body["detail"]
    status, body = raw(daemon.socket, post("/v1/targets", b'{"labels": {"run": "a\\ud800"}}'))
    assert (status, body["error"]) == (400, "invalid labels")
    assert body["detail"] == "the value of label 'run' is not valid Unicode (a lone surrogate)"
    # The registration's series follow its answer (its pass's rest): the scrape goes on.
    wait_for(lambda: "process_cpu_time_seconds_total" in daemon.metrics_text())


def test_an_executable_named_in_invalid_utf8_is_scraped_with_a_replacement(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # Its first 15 bytes (the kernel's comm) are valid; the invalid byte comes after.
    exe = os.path.join(os.fsencode(tmp_path), b"a-long-program-name-\xff")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    child = subprocess.Popen([exe, "30"])
    try:
        daemon.register(child.pid)
        name = 'process_executable_name="a-long-program-name-\ufffd"'
        # Answered, not an empty reply; its series follow the registration's answer.
        wait_for(lambda: name in daemon.metrics_text())
    finally:
        child.kill()
        child.wait()


def test_bodies_that_broke_the_parser_are_400_not_500(daemon: DaemonProcess) -> None:
    nested = b"[" * 30_000 + b"]" * 30_000  # within the 64 KiB body limit
    assert raw(daemon.socket, post("/v1/targets", nested))[0] == 400
    status, body = raw(daemon.socket, post("/v1/targets", b'{"pid": "\xff"}'))
    assert status == 400 and body["error"] == "invalid JSON"
    assert "Traceback" not in daemon.log()


# -- 2. slow TCP clients -----------------------------------------------------------


def trickle(sock: socket.socket, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        try:
            sock.send(b"G")
        except OSError:
            return


def test_slow_tcp_clients_never_stall_a_scrape(daemon: DaemonProcess) -> None:
    """40 connections from another address trickle a header byte a second: scrapes
    are answered within 1 s all along, and each is closed at its 5 s deadline however
    it trickles (root's: held to the total alone, not to a peer's 16)."""
    stop = threading.Event()
    held: list[socket.socket] = []
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", daemon.port), source_address=("127.0.0.2", 0))
        held.append(s)
        threading.Thread(target=trickle, args=(s, stop, 1.0), daemon=True).start()
    opened = time.monotonic()
    try:
        worst = 0.0
        while time.monotonic() - opened < 7:
            took, data = timed_scrape(daemon.port)
            assert data.startswith(b"HTTP/1.1 200") and b"system_cpu_time" in data
            worst = max(worst, took)
            time.sleep(0.25)
        assert worst < 1.0
        closed = []
        for s in held:
            s.settimeout(0.1)
            try:
                closed.append(s.recv(1) == b"")
            except OSError:
                closed.append(True)  # reset
        assert all(closed)  # past the deadline, trickling or not; the excess at once
    finally:
        stop.set()
        for s in held:
            s.close()


def test_gzip_q0_is_refused(daemon: DaemonProcess) -> None:
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    for header, gzipped in (("gzip;q=0", False), ("gzip", True), ("identity, *;q=0.5", True)):
        request = urllib.request.Request(url, headers={"Accept-Encoding": header})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert (r.headers.get("Content-Encoding") == "gzip") is gzipped, header


# -- 3. the Unix socket: tricklers of one user --------------------------------------

TRICKLER = """
import socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
time.sleep(0.5)
refused = 0
for s in held:
    s.settimeout(0.05)
    try:
        refused += s.recv(12) == b"HTTP/1.1 429"
    except OSError:
        pass
print(refused, flush=True)
while True:
    for s in held:
        try:
            s.send(b"G")
        except OSError:
            pass
    time.sleep(1)
"""


@as_root
def test_one_user_cannot_lock_the_api_for_the_others(daemon_factory: Any, public_dir: Path) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    attacker = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", TRICKLER, daemon.socket, "64"], user=NOBODY, group=NOBODY,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Its own share: 32 connections at once; the other 32 were answered 429.
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "32"
        deadline = time.monotonic() + 6
        worst = 0.0
        while time.monotonic() < deadline:
            worst = max(worst, timed_health(daemon.socket))  # root
            other = run_as(
                STRANGER,
                "import socket\n"
                f"s = socket.socket(socket.AF_UNIX); s.connect({daemon.socket!r})\n"
                "s.sendall(b'GET /healthz HTTP/1.1\\r\\nConnection: close\\r\\n\\r\\n')\n"
                "print(s.recv(100).split()[1].decode())",
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert other.communicate(timeout=5)[0].strip() == "200"  # another user
            time.sleep(0.5)
        assert worst < 1.0
    finally:
        attacker.kill()
        attacker.wait()


def test_a_trickled_body_gets_408_at_the_deadline(daemon: DaemonProcess) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        s.sendall(b"POST /v1/targets HTTP/1.1\r\nContent-Length: 40\r\n\r\n")
        started = time.monotonic()
        s.settimeout(0.5)
        answer = b""
        while time.monotonic() - started < 15 and not answer:
            try:
                s.send(b" ")  # one byte every 0.5 s: 20 s for the whole body
                answer = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408")
    assert 4.5 < waited < 6.5


# -- 4. many distinct label names -------------------------------------------------


def test_metrics_grow_linearly_with_targets_of_distinct_label_names(
    daemon: DaemonProcess, spawn: Any
) -> None:
    """Targets with 64 label names of 100 bytes each, all distinct: each point carries
    its own (the union on every point made 149 MB of 40 such targets)."""
    sizes = {}
    for n in range(40):
        child = spawn("import time; time.sleep(120)")
        labels = {f"t{n:02d}_{i:02d}_" + "x" * 94: "v" for i in range(64)}
        daemon.register(child.pid, labels=labels)
        if n + 1 in (20, 40):
            # Compare like with like: a target's utilization (2 series) appears from its
            # second pass on, so scrape once every target has had one (a scrape taken
            # with the last few at their first pass read 2.23x, not 2x, in one CI).
            def steady(n: int = n) -> bool:
                return timed_scrape(daemon.port)[1].count(b"\nprocess_cpu_utilization{") == 2 * (
                    n + 1
                )

            wait_for(steady)
            took, data = timed_scrape(daemon.port)
            assert took < 1.0
            sizes[n + 1] = len(data)
    assert sizes[40] < 2.2 * sizes[20]  # linear (the union: 4x)
    assert sizes[40] < 8 * 2**20


# -- 5. a broken or hostile tegrastats ---------------------------------------------


def test_power_keeps_flowing_through_ten_seconds_of_hostile_tegrastats_output(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(
        interval=0.25,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "FAKE_TEGRASTATS_HOSTILE": "1",
            "EDGEWATT_POWER_SOURCES": "tegrastats",
        },
    )
    wait_for(lambda: daemon.value("hw_host_power_watts") is not None, timeout=10)
    started = time.monotonic()
    rails: set[str] = set()
    while time.monotonic() - started < 10:
        took, data = timed_scrape(daemon.port)
        assert took < 1.0
        text = data.decode()
        assert "hw_host_power_watts" in text  # never gone for good
        rails |= {
            line.split('hw_id="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("hw_power_watts{")
        }
        health = daemon.call("GET", "/healthz")[1]
        assert health["power_sources"] == ["tegrastats"], health
        time.sleep(0.5)
    # The garbage made no series beyond one line's bound; the daemon stayed small.
    assert len(rails) <= 32 + 3
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()  # type: ignore[union-attr]
    peak_kib = int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1])
    assert peak_kib < 200 * 1024
    assert "Traceback" not in daemon.log()


# -- 6. socket squatting -----------------------------------------------------------


def serve_once(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "serve", "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip


@as_root
def test_the_daemon_refuses_a_socket_directory_another_user_owns_or_may_write(
    tmp_path: Path,
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    for directory, problem in ((theirs, f"it belongs to uid {NOBODY}"),
                               (shared, "other users may write to it (mode 1777)")):  # fmt: skip
        result = serve_once("--socket", str(directory / "ew.sock"),
                            "--state-dir", str(tmp_path / "state"))  # fmt: skip
        assert result.returncode == 2
        assert f"refusing socket directory {directory}: {problem}" in result.stderr
        assert not (directory / "ew.sock").exists()


# -- 7. a malformed state file -----------------------------------------------------


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def saved_entry(pid: int, **fields: Any) -> dict[str, Any]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    start = int(stat[stat.rindex(")") + 2 :].split()[19])
    return {"id": f"{pid:012x}", "pid": pid, "start_ticks": start, "labels": {},
            "children": True, "uid": 0, "registered_at": 1.0, "holders": 1, **fields}  # fmt: skip


@as_root
def test_a_malformed_state_file_is_checked_entry_by_entry(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    good, other = spawn("import time; time.sleep(60)"), spawn("import time; time.sleep(60)")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    entries: list[Any] = [
        [1, 2],
        "abc",
        {**saved_entry(good.pid), "pid": 1e999},
        saved_entry(other.pid, labels={"run": ["a", "list"]}),
        saved_entry(other.pid, uid=NOBODY),  # root's process, said to be nobody's
        saved_entry(other.pid, labels={"job": "forged"}),
        saved_entry(good.pid, labels={"run": "kept"}),
    ]
    (state / "targets.json").write_text(
        json.dumps({"version": 1, "boot_id": boot_id(), "targets": entries})
    )
    daemon = daemon_factory(state_dir=state)
    listing = daemon.call("GET", "/v1/targets")[1]["targets"]
    assert [(t["pid"], t["labels"]) for t in listing] == [(good.pid, {"run": "kept"})]
    skipped = [line for line in daemon.log().splitlines() if "not restoring registration" in line]
    assert [line.split("not restoring registration ")[1] for line in skipped] == [
        "#1: invalid entry: an object is needed, got list",
        "#2: invalid entry: an object is needed, got str",
        f"{good.pid:012x}: invalid pid: pid must be an integer, got inf",
        f"{other.pid:012x}: invalid labels: label 'run' must have a string value, got list",
        f"{other.pid:012x}: not your process: pid {other.pid} belongs to uid 0, you are uid "
        f"{NOBODY}",
        f"{other.pid:012x}: invalid labels: label name 'job' is reserved: edgewatt or "
        "Prometheus sets 'job' on its series; choose another name",
    ]
    assert 'run="kept"' in daemon.metrics_text()


# -- 8. the state directory --------------------------------------------------------


@as_root
def test_the_daemon_refuses_a_state_directory_another_user_may_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "targets.json.tmp").symlink_to(victim)  # what that user would plant
    result = serve_once("--socket", str(tmp_path / "ew.sock"), "--state-dir", str(state))
    assert result.returncode == 2
    assert (
        f"refusing state directory {state}: it belongs to uid {NOBODY}, not to the daemon's "
        "uid 0" in result.stderr
    )
    assert victim.read_text() == "precious\n"


def test_a_link_at_the_temporary_name_is_replaced_not_followed(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    names = ("targets.json.tmp", "targets.journal.tmp", "targets.journal")
    for name in names:  # links left in the daemon's own dir
        (state / name).symlink_to(victim)
    daemon = daemon_factory(state_dir=state)
    daemon.register(spawn("import time; time.sleep(60)").pid)
    assert victim.read_text() == "precious\n"
    assert not (state / "targets.json.tmp").exists()
    assert not (state / "targets.journal.tmp").exists()
    assert not (state / "targets.journal").is_symlink()
    assert len(StateFile(state, boot_id(), WriteBudget(1 << 20)).load()) == 1


# -- 9. a YAML alias bomb ----------------------------------------------------------

BOMB = (
    "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
        for prev, name in zip([None, *"abcdefgh"], "abcdefghi")
    )
    + "interval: *i\n"
)


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(BOMB)
    assert len(BOMB) < 500  # 9**9 values once expanded
    result = serve_once("--config", str(config), "--socket", str(tmp_path / "ew.sock"))
    assert result.returncode == 2
    assert result.stderr == (
        f"edgewatt: config error: config file {config}: refused: aliases expand to more than "
        "10000 values\n"
    )


# -- 10, 11. who may register what -------------------------------------------------

NOT_DUMPABLE = (
    "import ctypes, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0\n"
    "print(flush=True)\ntime.sleep(60)"
)


@as_root
def test_a_user_may_not_watch_a_setuid_or_undumpable_process_it_started(
    daemon_factory: Any, public_dir: Path
) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    setuid_sleep = public_dir / "setuid-sleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", setuid_sleep)
    setuid_sleep.chmod(0o4755)  # owned by root: runs with effective uid 0
    started = run_as(NOBODY, f"import os; os.execv({str(setuid_sleep)!r}, ['s', '60'])")
    undumpable = run_as(NOBODY, NOT_DUMPABLE, stdout=subprocess.PIPE)
    try:
        wait_for(lambda: Path(f"/proc/{started.pid}/exe").resolve() == setuid_sleep)
        status, body = call_as(
            NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", {"pid": started.pid}
        )
        assert (status, body["error"]) == (403, "not your process")
        assert body["detail"] == (
            f"pid {started.pid} belongs to uid {NOBODY} (runs as 0: setuid), you are uid {NOBODY}"
        )
        assert undumpable.stdout is not None and undumpable.stdout.readline() == b"\n"
        status, body = call_as(
            NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", {"pid": undumpable.pid}
        )
        assert (status, body["error"]) == (403, "not your process")
        assert body["detail"] == (
            f"pid {undumpable.pid} is not dumpable (a setuid program, or prctl): only root "
            "may watch it"
        )
        assert daemon.register(undumpable.pid)["pid"] == undumpable.pid  # root may
    finally:
        for p in (started, undumpable):
            p.kill()
            p.wait()


def test_the_owner_is_checked_on_the_opened_process(spawn: Any) -> None:
    from edgewatt.core.facts import procfs

    child = spawn("import time; time.sleep(60)")
    handle = procfs.ProcHandle(child.pid)
    assert handle.refuses(os.getuid()) is None
    child.kill()
    child.wait()
    # Gone after the handle was opened: whoever has its pid now is not this process.
    assert handle.refuses(os.getuid()) == f"pid {child.pid} has exited"
    handle.close()


# -- 12. one user's share of targets -----------------------------------------------


@as_root
def test_one_user_cannot_fill_max_targets(daemon_factory: Any, public_dir: Path) -> None:
    daemon = daemon_factory(socket_dir=public_dir, env={"EDGEWATT_MAX_TARGETS_PER_UID": "2"})
    sleepers = [run_as(NOBODY, "import time; time.sleep(60)") for _ in range(3)]
    try:
        answers = [
            call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", {"pid": p.pid})
            for p in sleepers
        ]
        assert [status for status, _ in answers] == [201, 201, 429]
        assert answers[2][1]["detail"] == "at most 2 per user may run at once"
        assert daemon.register(sleepers[2].pid)["pid"] == sleepers[2].pid  # root is exempt
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


# -- 13. what the CLI prints -------------------------------------------------------


def test_status_escapes_control_characters(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    daemon.register(child.pid, labels={"note": "\x1b]0;pwned\x07\x1b[2J\nfake row"})
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "status", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    row = next(line for line in result.stdout.splitlines() if str(child.pid) in line)
    assert row.endswith("note=\\x1b]0;pwned\\x07\\x1b[2J\\x0afake row")


# BiDi overrides and isolates, invisible format characters, a line separator: each
# changes how a line reads without being a control character.
INVISIBLE = "\u202e\u2066\u200b\u2060\ufeff\u2028\u00ad"


def test_every_command_escapes_what_changes_how_text_reads(
    daemon: DaemonProcess, spawn: Any
) -> None:
    child = spawn("import time; time.sleep(60)")
    note = "\u202egnp.exe"  # shown raw, reads "exe.png"
    target = daemon.register(child.pid, labels={"note": note, "run": f"a{INVISIBLE}b"})
    cli = [sys.executable, "-m", "edgewatt.cli"]
    shown = {}
    for what in ("status", f"summary {target['id']}", "top --once"):
        shown[what] = subprocess.run(
            [*cli, *what.split(), "--socket", daemon.socket],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        )  # fmt: skip
    for what, result in shown.items():
        assert result.returncode == 0, (what, result.stderr)
        out = result.stdout + result.stderr
        assert not set(INVISIBLE) & set(out), (what, out)
    row = next(x for x in shown["status"].stdout.splitlines() if str(child.pid) in x)
    assert "note=\\u202egnp.exe" in row, row
    assert "run=a\\u202e\\u2066\\u200b\\u2060\\ufeff\\u2028\\xadb" in row, row


# -- smaller: save ordering --------------------------------------------------------


def test_an_older_save_never_overwrites_a_newer_one(spawn: Any) -> None:
    from edgewatt.core.facts import procfs
    from edgewatt.core.targets import Limits, Resolver, TargetTable

    saved: list[list[int]] = []
    first = threading.Event()

    def slow_save(state: list[dict[str, Any]]) -> None:
        if not first.is_set():  # the first save is slow (a busy disk)
            first.set()
            time.sleep(0.5)
        saved.append(sorted(t["pid"] for t in state))

    table = TargetTable(
        Limits(max_targets=10, history_samples=10, exited_retention_s=60),
        Resolver(procfs.boot_time(), procfs.CLOCK_TICKS),
        on_change=slow_save,
    )
    a, b = spawn("import time; time.sleep(60)"), spawn("import time; time.sleep(60)")
    slow = threading.Thread(target=table.register, args=(a.pid, {}, True, 0))
    slow.start()
    first.wait(5)
    table.register(b.pid, {}, True, 0)  # while the first save is under way
    slow.join()
    assert saved[-1] == sorted([a.pid, b.pid])  # the last write holds both
