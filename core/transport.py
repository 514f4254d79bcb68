"""HTTP/1.1 over the daemon's Unix socket, with the standard library only."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

CONNECT_TIMEOUT_S = 0.25
REQUEST_TIMEOUT_S = 0.5


def default_socket() -> str:
    """design.md: EDGEWATT_SOCKET, else /run as root, else XDG_RUNTIME_DIR, else temp."""
    if os.environ.get("EDGEWATT_SOCKET"):
        return os.environ["EDGEWATT_SOCKET"]
    if current_uid() == 0:
        return "/run/edgewatt/edgewatt.sock"
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "edgewatt.sock")
    import tempfile  # only here: it costs a few ms at import

    return os.path.join(tempfile.gettempdir(), f"edgewatt-{current_uid()}.sock")


def current_uid() -> int:
    """This process's user id; 0 where the OS has none (Windows: one user per client)."""
    return os.getuid() if hasattr(os, "getuid") else 0


class DaemonError(Exception):
    """The daemon answered with an error; ``status`` and ``body`` say which."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('error')}: {body.get('detail', '')}")
        self.status = status
        self.body = body


def _connection(path: str, timeout: float) -> Any:
    # http.client (with ssl and email) costs ~20 ms to import: only on first use.
    import http.client

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = _connect(path, self.timeout)

    return UnixConnection("localhost", timeout=timeout)


def _connect(path: str, timeout: float | None) -> socket.socket:
    limit = min(CONNECT_TIMEOUT_S, timeout or CONNECT_TIMEOUT_S)
    deadline = time.monotonic() + limit
    if not hasattr(socket, "AF_UNIX"):  # Windows builds of Python: no daemon to find
        raise OSError(f"Unix sockets are not available here, so no daemon at {path}")
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(limit)
            sock.connect(path)
            sock.settimeout(timeout)
        except BlockingIOError:
            # A Unix socket answers EAGAIN at once when its backlog is full.
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
            continue
        except OSError:
            sock.close()
            raise
        return sock


def call(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> tuple[int, Any]:
    """One request; returns (status, decoded JSON). OSError when nobody answers."""
    import http.client

    conn = _connection(socket_path, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = {"error": "invalid response", "detail": raw[:200].decode("utf-8", "replace")}
        return response.status, decoded
    except http.client.HTTPException as exc:
        raise OSError(f"bad response from {socket_path}: {exc}") from exc
    finally:
        conn.close()


def call_ok(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> Any:
    status, decoded = call(socket_path, method, path, body, timeout)
    if status >= 400:
        raise DaemonError(status, decoded if isinstance(decoded, dict) else {})
    return decoded
