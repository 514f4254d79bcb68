"""Registration API: HTTP/1.1 with JSON bodies over a Unix socket (design.md).

Every connection gets its own thread, and every request one deadline: all of it (the
wait for its first byte included) must arrive within ``REQUEST_TIMEOUT_S``, however it
is spread out, or the connection ends (408 once the headers are in). A client that
trickles a byte at a time holds its thread no longer than one that stalls. At most
``MAX_CONNECTIONS`` connections are served at once, and at most
``MAX_CONNECTIONS_PER_UID`` of one user other than root (SO_PEERCRED), so one user
cannot take the others' share; more are answered 429 at once. Every failure is a JSON
``{"error", "detail"}`` with a 4xx status; an unexpected exception is logged with its
traceback here and answered with a 500 that carries no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import socket
import socketserver
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgewatt.core.sampling import procfs
from edgewatt.core.targets import (
    Conflict,
    Forbidden,
    NotFound,
    TargetError,
    TargetTable,
    TooMany,
    TooManyLookups,
)
from edgewatt.core.transport import directory_problem, peer_credentials
from edgewatt.exporter.registration import (
    TARGET_ID,
    InvalidRegistration,
    parse_request,
    reject_unknown,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_UID = 32  # root is not held to it: its clients are the administrator's
REQUEST_TIMEOUT_S = 5.0
LOOKUP_HOLD_S = 1.0  # the longest a registration over its user's lookup bound is held
_TOP_MEMBERS = 32  # pids listed per target by GET /v1/top
_ROUTE = re.compile(r"^/v1/targets(?:/(?P<id>[^/]+)(?:/(?P<sub>samples|summary|phase))?)?$")


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str = "") -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail


# The status each refusal of the table is answered with (any other TargetError: 400).
_STATUS: dict[type[TargetError], int] = {NotFound: 404, Forbidden: 403, Conflict: 409, TooMany: 429}


def _status(exc: TargetError) -> int:
    return next((s for kind, s in _STATUS.items() if isinstance(exc, kind)), 400)


def _credentials(sock: socket.socket) -> tuple[int, int, int]:
    credentials = peer_credentials(sock)
    assert credentials is not None, "the daemon runs on Linux, which has SO_PEERCRED"
    return credentials


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only the time left until ``deadline``: the
    socket's own timeout would start again with every byte received."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = time.monotonic() + REQUEST_TIMEOUT_S

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S  # for writing an answer
    # An answer's headers and body go out in one write at its flush: one wake of the
    # client, not one for the headers and one for the body.
    wbufsize = io.DEFAULT_BUFFER_SIZE
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self.peer_pid, self.peer_uid, _ = _credentials(self.request)
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def version_string(self) -> str:
        return "edgewatt"

    def address_string(self) -> str:
        return f"pid {self.peer_pid}"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("api: %s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        # The standard loop, with every method routed to one dispatcher (the stdlib
        # answers unknown methods with an HTML 501) and timeouts ending the connection.
        self._reader.deadline = time.monotonic() + REQUEST_TIMEOUT_S
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self.connection.settimeout(REQUEST_TIMEOUT_S)  # the answer's own time
            self._dispatch()
            self.wfile.flush()
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        status = HTTPStatus(code)
        self._reply(
            status.value,
            {"error": message or status.phrase.lower(), "detail": explain or ""},
            close=True,
        )

    def _reply(self, status: int, body: Any, *, close: bool = False) -> None:
        data = json.dumps(body).encode()
        if self.request_version == "HTTP/0.9":  # a garbled request line: answer in 1.1
            self.request_version = "HTTP/1.1"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _dispatch(self) -> None:
        try:
            status, body = self._route()
        except ApiError as exc:
            self._reply(exc.status, {"error": exc.error, "detail": exc.detail}, close=True)
        except InvalidRegistration as exc:
            self._reply(400, {"error": exc.error, "detail": exc.detail})
        except TargetError as exc:
            self._reply(_status(exc), {"error": exc.error, "detail": exc.detail})
        except Exception:
            log.exception("api: unexpected error on %s %s", self.command, self.path)
            self._reply(500, {"error": "internal error", "detail": "see the daemon's log"})
        else:
            self._reply(status, body)

    # -- routing ------------------------------------------------------------------

    def _route(self) -> tuple[int, Any]:
        parts = urlsplit(self.path)
        path = parts.path
        if (
            not path.startswith("/")
            or "%" in self.path
            or "//" in path
            or "/./" in path + "/"
            or "/../" in path + "/"
        ):
            raise ApiError(400, "invalid path", f"{self.path[:200]!r} is not a valid API path")
        if path == "/healthz":
            self._allow("GET", "HEAD")
            return 200, self.server.health()
        if path == "/v1/host":
            self._allow("GET")
            return 200, self.server.host()
        if path == "/v1/top":
            self._allow("GET")
            return 200, self._top()
        match = _ROUTE.match(path)
        if match is None:
            raise ApiError(404, "not found", f"no endpoint at {path[:200]!r}")
        target_id, sub = match.group("id"), match.group("sub")
        if target_id is not None and not TARGET_ID.fullmatch(target_id):
            raise ApiError(404, "no such target", f"{target_id[:80]!r} is not a target id")
        table = self.server.table
        if target_id is None:
            if self._allow("GET", "POST") == "POST":
                return self._register()
            member = parse_qs(parts.query).get("member")
            if member is None:
                return 200, {"targets": table.describe_all()}
            if len(member) != 1 or not member[0].isdigit() or len(member[0]) > 10:
                raise ApiError(400, "invalid member", "member must be one process id")
            self.server.sample_now(None)  # a process forked since the last pass is known
            return 200, {"targets": table.describe_all(int(member[0]))}
        if sub is None:
            if self._allow("GET", "DELETE") == "DELETE":
                self._read_body()
                return 200, table.delete(target_id, self.peer_uid).describe()
            if parse_qs(parts.query).get("fresh") == ["1"]:
                self._fresh(target_id)
            return 200, table.describe(target_id)
        if sub == "phase":
            # A phase's edges are samples: the pass taken here closes the phase that
            # ends and opens the one that starts, so adjacent phases add up.
            if self._allow("POST", "DELETE") == "DELETE":
                self._read_body()
                ended = table.end_phase(target_id, self.peer_uid)
                if ended is None:
                    return 200, {"target": target_id, "ended": None, "phase": None}
                self.server.sample_now(target_id)
                return 200, {
                    "target": target_id,
                    "ended": ended.name,
                    "phase": table.phase_summary(target_id, ended, self.server.logical_cpus),
                }
            body = self._read_json()
            reject_unknown(body, {"name"})
            phase = table.start_phase(target_id, body.get("name"), self.peer_uid)
            self.server.sample_now(target_id)
            return 201, {"target": target_id, "name": phase.name, "started_at": phase.started_at}
        self._allow("GET")
        if sub == "summary":
            # To now: a running target is sampled first (a script's summary at its
            # end holds its last second too).
            fresh = parse_qs(parts.query).get("fresh") == ["1"]
            if fresh and table.get(target_id).state == "running":
                self.server.sample_now(target_id)
            return 200, table.summary(target_id, self.server.logical_cpus)
        since = _since(parts.query)
        return 200, {
            "target": target_id,
            "units": self.server.sample_units,
            "samples": table.samples(target_id, since),
        }

    def _top(self) -> dict[str, Any]:
        """`edgewatt top`'s one request a refresh: the device, the daemon's health and
        every target with its summary, all from the snapshot and tables the sampler built."""
        table, cpus = self.server.table, self.server.logical_cpus
        targets = []
        for target in table.describe_all():
            try:
                target["summary"] = table.summary(target["id"], cpus)
                members = table.get(target["id"]).members  # replaced whole each pass
            except TargetError:
                continue  # unregistered between the reads
            # The first pids only: a cgroup of thousands is one count, not a long list.
            target["members"], target["member_count"] = list(members[:_TOP_MEMBERS]), len(members)
            targets.append(target)
        return {"device": self.server.host(), "health": self.server.health(), "targets": targets}

    def _fresh(self, target_id: str) -> None:
        """A sample of a running target younger than min_interval: a monitor's read at
        its own cadence, whatever the daemon's interval."""
        target = self.server.table.describe(target_id)
        if target["state"] != "running":
            return
        latest = target["latest"]
        if latest is not None and time.time() - latest["time"] < self.server.min_interval:
            return
        self.server.sample_now(target_id)

    def _allow(self, *methods: str) -> str:
        if self.command not in methods:
            allowed = ", ".join(methods)
            raise ApiError(405, "method not allowed", f"{self.command} not allowed; use {allowed}")
        return self.command

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise ApiError(400, "chunked bodies are not supported", "send Content-Length")
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            return b""
        if not raw_length.strip().isdigit():
            raise ApiError(400, "invalid Content-Length", repr(raw_length[:40]))
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            raise ApiError(413, "body too large", f"{length} bytes; at most {MAX_BODY_BYTES}")
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            raise ApiError(
                408, "request timed out", f"request not received within {REQUEST_TIMEOUT_S:g} s"
            ) from None
        finally:
            self.connection.settimeout(REQUEST_TIMEOUT_S)  # the answer's own time
        if len(body) != length:
            raise ApiError(400, "truncated body", f"got {len(body)} of {length} bytes")
        return body

    def _read_json(self) -> dict[str, Any]:
        body = self._read_body()
        if not body:
            return {}
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "invalid JSON", str(exc)[:200]) from None
        except RecursionError:  # thousands of nested brackets
            raise ApiError(400, "invalid JSON", "nested too deeply") from None
        if not isinstance(data, dict):
            raise ApiError(400, "invalid body", "the body must be a JSON object")
        return data

    def _register(self) -> tuple[int, Any]:
        request = parse_request(self._read_json(), self.peer_pid, self.server.pid_max)
        if request.cgroup is not None:
            try:
                target, created = self.server.table.register_cgroup(
                    request.cgroup,
                    request.labels,
                    self.peer_uid,
                    procfs.groups(self.peer_pid, self.server.proc),
                )
            except TooManyLookups as refused:
                # The 429 comes when a lookup could run again (at most 1 s): a flood
                # over the bound then costs a request a second per connection, not
                # one per round trip.
                time.sleep(min(LOOKUP_HOLD_S, refused.retry_s or LOOKUP_HOLD_S))
                raise
        else:
            target, created = self.server.table.register(
                request.pid, request.labels, request.children, self.peer_uid
            )
        if created:
            # Registration is a sample: the summary's baseline is read now, so what the
            # process did before is excluded and nothing after it is lost.
            self.server.sample_now(target.id)
        info = target.describe()
        return (201 if created else 200), {
            "id": info["id"],
            "kind": info["kind"],
            "pid": info["pid"],
            "cgroup": info["cgroup"],
            "start_time": info["start_time"],
            "labels": info["labels"],
            "children": info["children"],
            "min_interval_s": self.server.min_interval,  # for monitors' fresh reads
        }


def _since(query: str) -> float | None:
    values = parse_qs(query).get("since")
    if not values:
        return None
    try:
        return float(values[0])
    except ValueError:
        raise ApiError(400, "invalid since", "since must be a unix timestamp in seconds") from None


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a burst of connects must not hit a full backlog (EAGAIN)

    def __init__(
        self,
        path: str,
        table: TargetTable,
        *,
        logical_cpus: int,
        health: Callable[[], dict[str, Any]],
        host: Callable[[], dict[str, Any]],
        sample_units: dict[str, str],
        proc: str = "/proc",
        sample_now: Callable[[str], Any] = lambda target_id: None,
        min_interval: float = 0.1,
    ) -> None:
        self.min_interval = min_interval  # seconds; a reload may change it
        self.table = table
        self.sample_now = sample_now  # a pass that starts after the call, waited for
        self.logical_cpus = logical_cpus
        self.health = health
        self.host = host
        self.sample_units = sample_units
        self.proc = proc
        self.pid_max = procfs.pid_max(proc)
        self._open: Counter[int] = Counter()  # connections being served, by uid
        self._open_lock = threading.Lock()
        _own_directory(os.path.dirname(path) or ".")
        _clear_stale_socket(path)
        super().__init__(path, _Handler)
        # Any local user may register their own processes; SO_PEERCRED enforces the rest.
        os.chmod(path, 0o666)
        self.path = path

    def process_request(self, request: Any, client_address: Any) -> None:
        uid = _credentials(request)[1]
        with self._open_lock:
            if sum(self._open.values()) >= MAX_CONNECTIONS:  # Counter.total() is 3.10+
                refused = f"at most {MAX_CONNECTIONS} at once"
            elif uid != 0 and self._open[uid] >= MAX_CONNECTIONS_PER_UID:
                refused = f"at most {MAX_CONNECTIONS_PER_UID} at once per user"
            else:
                refused = ""
                self._open[uid] += 1
        if refused:
            _refuse(request, refused)
            self.shutdown_request(request)
            return
        super().process_request(request, (uid, client_address))

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        uid, address = client_address
        try:
            super().process_request_thread(request, address)
        finally:
            with self._open_lock:
                self._open[uid] -= 1
                if self._open[uid] <= 0:
                    del self._open[uid]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _refuse(request: socket.socket, detail: str) -> None:
    body = json.dumps({"error": "too many connections", "detail": detail}).encode()
    try:
        request.settimeout(0.5)
        request.sendall(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
    except OSError:
        pass


def _own_directory(directory: str) -> None:
    """Create the socket's directory, or refuse one that another user owns or may write
    to: there, that user could take the socket's name first (a fake daemon that reads
    every label and pid sent to it), or replace the socket later."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    euid = os.geteuid()
    problem = directory_problem(os.stat(directory), (0, euid), f"root or the daemon's uid {euid}")
    if problem is None:
        return
    raise OSError(
        f"refusing socket directory {directory}: {problem}; another user could take the "
        "socket's name; use a directory of your own (--socket)"
    )


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file left by a crashed daemon; refuse if a live one answers."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise OSError(f"socket {path} is in use by a running daemon")
    finally:
        probe.close()
