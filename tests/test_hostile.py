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
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import transport
from tests.conftest import ROOT, SYSTEM_PYTHON, DaemonProcess

NOBODY = 65534
STRANGER = 4242  # a second unprivileged user, without a passwd entry
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


def raw_call(path: str, request: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    """Send ``request`` as is over the Unix socket; (status, body) of the answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"content-length" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def post_json(path: str, url: str, text: str) -> tuple[int, dict[str, Any]]:
    body = text.encode()
    status, answer = raw_call(
        path,
        f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body,
    )
    return status, json.loads(answer)


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
    status, body = post_json(
        daemon.socket, f"/v1/targets/{target['id']}/phase", '{"name": "ep\\udcff"}'
    )
    assert (status, body["error"]) == (400, "invalid phase name")
    assert "lone surrogate" in body["detail"]
    status, body = post_json(daemon.socket, "/v1/targets", '{"labels": {"run": "a\\ud800"}}')
    assert (status, body["error"]) == (400, "invalid labels")
    assert body["detail"] == "the value of label 'run' is not valid Unicode (a lone surrogate)"
    assert "process_cpu_time_seconds_total" in daemon.metrics_text()


def test_an_executable_named_in_invalid_utf8_is_scraped_with_a_replacement(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # Its first 15 bytes (the kernel's comm) are valid; the invalid byte comes after.
    exe = os.path.join(os.fsencode(tmp_path), b"a-long-program-name-\xff")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    child = subprocess.Popen([exe, "30"])
    try:
        daemon.register(child.pid)
        text = daemon.metrics_text()  # answered, not an empty reply
        assert 'process_executable_name="a-long-program-name-\ufffd"' in text
    finally:
        child.kill()
        child.wait()


def test_bodies_that_broke_the_parser_are_400_not_500(daemon: DaemonProcess) -> None:
    nested = "[" * 30_000 + "]" * 30_000  # within the 64 KiB body limit
    assert post_json(daemon.socket, "/v1/targets", nested)[0] == 400
    status, body = raw_call(
        daemon.socket,
        b"POST /v1/targets HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n\r\n"
        b'{"pid": "\xff"}',
    )
    assert status == 400 and json.loads(body)["error"] == "invalid JSON"
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
    are answered within 1 s all along; that address gets 16 connections, and each is
    closed at its 5 s deadline however it trickles."""
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
