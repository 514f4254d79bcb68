"""HTTP/1.1 over the daemon's Unix socket, with the standard library only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import struct
import threading
import time
from typing import Any, NamedTuple

CONNECT_TIMEOUT_S = 0.25
REQUEST_TIMEOUT_S = 0.5

# Where the system service (the systemd unit, as root) listens.
SYSTEM_SOCKET = "/run/edgewatt/edgewatt.sock"
# The daemon's `socket` key as a variable (core/options.variable("socket"), written out
# here: importing the declarations would cost the client's import ~10 ms; a test
# keeps the two equal).
SOCKET_VARIABLE = "EDGEWATT_SOCKET"


def user_socket() -> str:
    """This user's own daemon socket: the system one as root, else XDG_RUNTIME_DIR,
    else a directory of the user's own in the temp directory (in the shared temp
    directory itself, another user could take the socket's name first)."""
    if current_uid() == 0:
        return SYSTEM_SOCKET
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "edgewatt.sock")
    import tempfile  # only here: it costs a few ms at import

    return os.path.join(tempfile.gettempdir(), f"edgewatt-{current_uid()}", "edgewatt.sock")


def default_socket() -> str:
    """Where `edgewatt serve` listens: EDGEWATT_SOCKET, else the user's own socket."""
    return os.environ.get(SOCKET_VARIABLE) or user_socket()


class Found(NamedTuple):
    """The outcome of looking for a daemon (a NamedTuple: dataclasses cost ~6 ms)."""

    path: str | None  # the socket that answered; None when none did
    looked: str  # where it looked, in order, and what each place said
    # The connection that found it, open for the caller's requests (find_daemon's keep).
    connection: Connection | None = None


def candidates(explicit: str | None = None) -> list[tuple[str, str]]:
    """(socket, why it is looked at), in order. A socket the caller names (argument or
    EDGEWATT_SOCKET) is the only one: a named daemon is never silently swapped for
    another. Otherwise the user's own daemon, then the system service."""
    if explicit:
        return [(explicit, "given")]
    if os.environ.get(SOCKET_VARIABLE):
        return [(os.environ[SOCKET_VARIABLE], SOCKET_VARIABLE)]
    own = user_socket()
    if own == SYSTEM_SOCKET:
        return [(own, "the system service")]
    return [(own, "your own daemon"), (SYSTEM_SOCKET, "the system service")]


def find_daemon(explicit: str | None = None, keep: bool = False) -> Found:
    """The first candidate socket whose server answers and may be trusted (root or
    this user, checked before anything is sent); ``keep``: with the connection that
    found it, for the caller's requests (a registration's first is then no connect
    and no new serving thread in the daemon)."""
    looked = []
    for path, why in candidates(explicit):
        try:
            sock = _connect(path, CONNECT_TIMEOUT_S)
        except OSError as exc:
            looked.append(f"{path} ({why}): {_reason(exc)}")
            continue
        if not keep:
            sock.close()
            return Found(path, f"{path} ({why})")
        return Found(path, f"{path} ({why})", Connection(path, connected=sock))
    return Found(None, "; ".join(looked))


def _reason(exc: OSError) -> str:
    if isinstance(exc, UntrustedServer):
        return exc.strerror
    if exc.errno == errno.ENOENT:
        return "no such socket"
    if exc.errno == errno.ECONNREFUSED:
        return "nobody listening (a stale socket)"
    return exc.strerror or str(exc)


def current_uid() -> int:
    """This process's user id; 0 where the OS has none (Windows: one user per client)."""
    return os.getuid() if hasattr(os, "getuid") else 0


class UntrustedServer(PermissionError):
    """The socket is served by another user: labels and pids are not sent to it."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket, as
    the kernel recorded them at connect(); None where the platform cannot say (no
    SO_PEERCRED). The daemon asks it of its clients, a client of its server."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _check_server(sock: socket.socket, path: str) -> None:
    """Trust a server run by root or by the caller, or one whose socket only root could
    have placed (the systemd unit runs the daemon as a dynamic user in a directory it
    made for it: /run/edgewatt). Another user listening where this user's daemon is
    expected (a shared temp directory) would otherwise see every label and pid."""
    credentials = peer_credentials(sock)
    uid = credentials[1] if credentials is not None else None
    if uid is None or uid in (0, current_uid()) or placed_by_root(path, uid):
        return
    raise UntrustedServer(
        errno.EPERM,
        f"served by uid {uid}, neither root nor you, from a directory that root did not "
        "give it: not trusted",
        path,
    )


def directory_problem(info: os.stat_result, owners: tuple[int, ...], whose: str) -> str | None:
    """Why a directory (``info``: its stat) is not safe for a socket or state: a user
    other than ``owners`` (described as ``whose``) owns it, or others may write to it
    and so plant or replace what is in it. None when it is safe."""
    if info.st_uid not in owners:
        return f"it belongs to uid {info.st_uid}, not to {whose}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users may write to it (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def placed_by_root(path: str, owner: int) -> bool:
    """Whether only root could have put ``path`` there: every directory above its own
    is root's and writable by nobody else, and its own is root's or ``owner``'s (the
    service's, made for it by root) and writable by nobody else."""
    directory = os.path.dirname(os.path.realpath(path))
    try:
        if directory_problem(os.stat(directory), (0, owner), "root or the server"):
            return False
        parent = directory
        while parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
            if directory_problem(os.stat(parent), (0,), "root"):
                return False
    except OSError:
        return False
    return True


class DaemonError(Exception):
    """The daemon answered with an error; ``status`` and ``body`` say which."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('error')}: {body.get('detail', '')}")
        self.status = status
        self.body = body


class _Channel:
    """One HTTP/1.1 connection to the daemon. A request goes out in one write and its
    answer comes in one read (the daemon writes it whole): one wake of each side per
    request, where http.client wrote a body apart from its headers and parsed the
    answer's headers with the email package (benchmarks/track.py)."""

    def __init__(self, path: str, timeout: float, connected: socket.socket | None = None) -> None:
        """``connected``: a socket connected to ``path`` and its server checked."""
        self.path = path
        if connected is None:
            self.sock = _connect(path, timeout)
        else:
            self.sock = connected
            connected.settimeout(timeout)

    def exchange(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes, bool]:
        """(status, body, whether the daemon closes the connection after it)."""
        head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        # A daemon that refuses a connection (429: too many) writes its answer and
        # closes without reading: the answer is there to read all the same.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall((head + "\r\n").encode("latin-1") + (body or b""))
        data = self._recv(b"")
        if not data:
            raise _Closed(f"{self.path} closed the connection before answering")
        while b"\r\n\r\n" not in data:
            data = self._recv(data, "its headers")
            if len(data) > 65536:
                raise OSError(f"bad response from {self.path}: headers over 64 KiB")
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        version, _, status_text = lines[0].partition(" ")
        status = status_text[:3]
        if not version.startswith("HTTP/1.") or not status.isdigit():
            raise OSError(f"bad response from {self.path}: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if not headers.get("content-length", "").isdigit():
            raise OSError(f"bad response from {self.path}: no Content-Length")
        length = int(headers["content-length"])
        while len(rest) < length:
            rest = self._recv(rest, "its body")
        close = headers.get("connection", "").lower() == "close"
        return int(status), rest[:length], close

    def _recv(self, data: bytes, part: str = "") -> bytes:
        chunk = self.sock.recv(65536)
        if part and not chunk:
            raise OSError(f"bad response from {self.path}: it ended inside {part}")
        return data + chunk

    def close(self) -> None:
        self.sock.close()


class _Closed(ConnectionError):
    """The daemon closed the connection before any answer (it had not read the
    request: a connection it let go while idle)."""


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
            _check_server(sock, path)
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


def _exchange(channel: _Channel, method: str, path: str, body: Any) -> tuple[int, Any, bool]:
    data = None if body is None else json.dumps(body).encode()
    status, raw, close = channel.exchange(method, path, data)
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = {"error": "invalid response", "detail": raw[:200].decode("utf-8", "replace")}
    return status, decoded, close


def call(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> tuple[int, Any]:
    """One request on a connection of its own; returns (status, decoded JSON).
    OSError when nobody answers."""
    channel = _Channel(socket_path, timeout)
    try:
        return _exchange(channel, method, path, body)[:2]
    finally:
        channel.close()


class Connection:
    """Requests to one daemon on a connection kept open between them: a phase edge
    or a ``track`` call is then one round trip, without a connect, the server's
    credential check and a new serving thread each time (benchmarks/track.py). The
    daemon closes a connection idle longer than its request timeout; a request that
    finds it closed before any answer came is sent again once, on a new one (the
    daemon had not read it). Thread-safe: one request at a time."""

    def __init__(
        self,
        socket_path: str,
        timeout: float = REQUEST_TIMEOUT_S,
        connected: socket.socket | None = None,
    ) -> None:
        """``connected``: the first connection, open already (find_daemon's)."""
        self.socket_path = socket_path
        self.timeout = timeout
        self._conn = None if connected is None else _Channel(socket_path, timeout, connected)
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """``timeout``: this request's, where the daemon may wait longer (?final=S)."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked child (a DataLoader worker) gets a connection of its own:
                # its copy of the parent's is closed here (a close, not a shutdown:
                # the parent's stays open).
                self._close()
                self._pid = os.getpid()
            reused = self._conn is not None
            try:
                return self._exchange(method, path, body, timeout)
            except OSError as exc:
                self._close()
                idle_closed = isinstance(exc, (_Closed, BrokenPipeError, ConnectionResetError))
                if not (reused and idle_closed):
                    raise
            try:
                return self._exchange(method, path, body, timeout)
            except OSError:
                self._close()
                raise

    def _exchange(
        self, method: str, path: str, body: Any, timeout: float | None
    ) -> tuple[int, Any]:
        if self._conn is None:
            self._conn = _Channel(self.socket_path, self.timeout)
        if timeout is not None:
            self._conn.sock.settimeout(timeout)
        status, decoded, close = _exchange(self._conn, method, path, body)
        if close:  # the daemon ends it after an error: the next request opens anew
            self._close()
        elif timeout is not None:
            self._conn.sock.settimeout(self.timeout)
        return status, decoded

    def call_ok(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        return _ok(*self.call(method, path, body, timeout))

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close()


def call_ok(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> Any:
    return _ok(*call(socket_path, method, path, body, timeout))


def _ok(status: int, decoded: Any) -> Any:
    """The decoded answer; DaemonError for an error status."""
    if status >= 400:
        raise DaemonError(status, decoded if isinstance(decoded, dict) else {})
    return decoded
