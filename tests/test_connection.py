"""The client's kept-open connection to the daemon (core/transport.py Connection):
reused between requests, sent again once when the daemon closed it while idle, never
shared with a forked child."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import transport
from tests.conftest import DaemonProcess


class OneRequestServer:
    """A Unix socket HTTP server that answers one request per connection and then
    closes it, as the daemon closes a connection left idle: counts connections."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.connections = 0
        self.requests: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if not data:
                    continue
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                while len(rest) < length:  # the whole request, as the daemon reads it
                    rest += conn.recv(4096)
                self.requests.append(data.split(b"\r\n")[0].decode())
                body = json.dumps({"n": len(self.requests)}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )


def test_requests_share_one_connection(daemon: DaemonProcess) -> None:
    conn = transport.Connection(daemon.socket)
    assert conn.call_ok("GET", "/healthz")["status"] == "ok"
    first = conn._conn.sock.fileno()
    peer = os.readlink(f"/proc/self/fd/{first}")
    for _ in range(5):
        assert conn.call_ok("GET", "/healthz")["status"] == "ok"
    assert os.readlink(f"/proc/self/fd/{conn._conn.sock.fileno()}") == peer  # same socket
    conn.close()
    assert conn._conn is None


def test_a_connection_closed_by_the_server_is_opened_again_once(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = OneRequestServer(path)
    conn = transport.Connection(path)
    answers = [conn.call_ok("POST", "/v1/targets/x/phase", {"name": "a"}) for _ in range(3)]
    # Each request after the first found the connection closed, and was sent again on
    # a new one: answered once each, nothing sent twice.
    assert [a["n"] for a in answers] == [1, 2, 3]
    assert server.requests == ["POST /v1/targets/x/phase HTTP/1.1"] * 3
    assert server.connections == 3


def test_nobody_listening_is_an_oserror_not_a_retry_loop(tmp_path: Path) -> None:
    conn = transport.Connection(str(tmp_path / "none.sock"))
    with pytest.raises(OSError):
        conn.call("GET", "/healthz")


def test_a_forked_child_opens_its_own(daemon: DaemonProcess) -> None:
    conn = transport.Connection(daemon.socket)
    conn.call_ok("GET", "/healthz")
    parent_socket = conn._conn.sock
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a request of its own, on a connection of its own
        ok: Any = False
        try:
            ok = conn.call_ok("GET", "/healthz")["status"] == "ok"
            ok = ok and conn._conn.sock is not parent_socket
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    # The parent's connection is still its own, and still answers.
    assert conn._conn.sock is parent_socket
    assert conn.call_ok("GET", "/healthz")["status"] == "ok"
