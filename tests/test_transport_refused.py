"""A connection the daemon refuses (too many at once: a 429 written, then closed before
the request is read) reads as that refusal on the client's side, not as a broken pipe:
the user is told why the daemon did not take it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from edgewatt.core.transport import DaemonError, call_ok

BODY = b'{"error": "too many connections", "detail": "at most 32 at once"}'
REFUSAL = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode()
    + BODY
)


def test_a_refusal_written_before_the_request_was_read_is_what_the_client_sees(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "refusing.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    answered = threading.Event()

    def refuse() -> None:
        connection, _ = server.accept()
        connection.sendall(REFUSAL)
        connection.close()  # before the request comes: its write meets a closed peer
        answered.set()

    thread = threading.Thread(target=refuse)
    thread.start()
    try:
        original = socket.socket.sendall

        def after_the_refusal(sock: socket.socket, data: bytes) -> None:
            if data != REFUSAL:  # the client's request: once the daemon has closed
                assert answered.wait(5)
            original(sock, data)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(socket.socket, "sendall", after_the_refusal)
            with pytest.raises(DaemonError) as refused:
                call_ok(path, "GET", "/healthz")
    finally:
        thread.join()
        server.close()
    assert refused.value.status == 429
    assert refused.value.body == {"error": "too many connections", "detail": "at most 32 at once"}
