"""The client's kept-open connection to the daemon (core/transport.py Connection):
reused between requests, sent again once when the daemon closed it while idle, never
shared with a forked child."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import transport
from tests.conftest import DaemonProcess


class OneRequestServer:
    """A Unix socket HTTP server that answers one request per connection and then
    closes it, as the daemon closes a connection left idle: counts connections. With
    ``answer``, that is what it answers, in two writes split at ``split`` (an answer
    that arrives in pieces)."""

    def __init__(self, path: str, answer: bytes | None = None, split: int = 0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.answer, self.split = answer, split
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
                if self.answer is not None:
                    conn.sendall(self.answer[: self.split])
                    time.sleep(0.01)
                    conn.sendall(self.answer[self.split :])
                    continue
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


OK_BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + OK_BODY


@pytest.mark.parametrize("split", [0, 20, len(OK) - 3], ids=["whole", "in-headers", "in-body"])
def test_an_answer_in_pieces_is_read_whole(tmp_path: Path, split: int) -> None:
    path = str(tmp_path / "s.sock")
    OneRequestServer(path, OK, split)
    assert transport.call(path, "GET", "/healthz") == (200, {"ok": True})


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "bad response from .*: 'SSH-2.0-OpenSSH'"),
        (b"HTTP/1.1 200 OK\r\n\r\n{}", "bad response from .*: no Content-Length"),
        (OK[:-4], "bad response from .*: it ended inside its body"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "bad response from .*: it ended inside its headers"),
        (b"", "closed the connection before answering"),
    ],
    ids=["not-http", "no-length", "short-body", "short-headers", "nothing"],
)
def test_a_broken_answer_is_an_oserror_that_says_what_was_wrong(
    tmp_path: Path, answer: bytes, message: str
) -> None:
    path = str(tmp_path / "s.sock")
    OneRequestServer(path, answer)
    with pytest.raises(OSError, match=message):
        transport.call(path, "GET", "/healthz")


def test_an_answer_that_closes_the_connection_is_followed_by_a_new_one(tmp_path: Path) -> None:
    # The daemon answers an error with "Connection: close"; the next request must not
    # be sent on the closed connection (and so is not sent twice either).
    path = str(tmp_path / "s.sock")
    closing = OK.replace(b"Content-Length", b"Connection: close\r\nContent-Length")
    OneRequestServer(path, closing)
    conn = transport.Connection(path)
    assert conn.call("GET", "/a") == (200, {"ok": True}) and conn._conn is None
    assert conn.call("GET", "/b") == (200, {"ok": True}) and conn._conn is None
