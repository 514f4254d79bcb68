"""HTTP/1.1 with JSON bodies over a Unix socket: the mechanics under the registration
API (api.py holds its endpoints).

Every connection gets its own thread (one kept from an earlier connection where one
waits: workers.py), and every request one deadline: all of it (the
wait for its first byte included) must arrive within ``REQUEST_TIMEOUT_S``, however it
is spread out, or the connection ends (408 once the headers are in). A client that
trickles a byte at a time holds its thread no longer than one that stalls. At most
``MAX_CONNECTIONS`` connections are served at once. Users together hold at most all
but ``RESERVED_CONNECTIONS`` of them, which only root and the daemon's own uid may
take: a flood of users' connections never keeps the administrator out. One person (a
user, her subordinate uids and whoever runs in her user namespaces: core/persons.py,
from SO_PEERCRED's pid and uid) holds at
most ``MAX_CONNECTIONS_PER_PERSON``, so one user cannot take the others' share; more
are answered 429 at once. Her requests' CPU has a budget too (cpu_budget.py: 5 % of
a core): past it her connections are read later, root's and others' at once. Every
failure is a JSON ``{"error", "detail"}`` with a 4xx status; an unexpected exception
is logged with its traceback here and answered with a 500 that carries no traceback.

Requests are read and answers written here (heads parsed by ``http_head``), not by
``http.server``, whose import costs the daemon ~7 MiB of RSS (``http.client``, ``ssl``,
``email``); its answers are kept: status, message, headers (Server, Date,
Content-Type, Content-Length, Connection: close when it ends the connection).

The accepting thread sleeps until a connection or the shutdown arrives: no timeout
(socketserver's own loop wakes every poll interval, five times a second, to look for
a shutdown); the shutdown writes to a socket pair that it watches beside the listener.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import selectors
import socket
import socketserver
import stat
import threading
import time
import typing
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgewatt.core.transport import directory_problem, peer_credentials
from edgewatt.core.user_namespaces import peer_pidfd
from edgewatt.exporter import documents
from edgewatt.exporter.cpu_budget import CpuBudget
from edgewatt.exporter.http_head import BadHead, Head, parse_fields, parse_request_line
from edgewatt.exporter.shared_answer import Encoded
from edgewatt.exporter.workers import Workers

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
MAX_LINE_BYTES = 65536  # the request line, and each header line
MAX_HEADERS = 100
MAX_CONNECTIONS = 128
RESERVED_CONNECTIONS = 16  # root's and the daemon's own uid's: the administrator's clients
MAX_CONNECTIONS_PER_PERSON = 32  # of a user with her subordinate uids
REQUEST_TIMEOUT_S = 5.0
MAX_PARTS = 512  # an answer's parts given to one sendmsg (the kernel takes up to 1,024)
# What a socket's timeout raises: socket.timeout, a TimeoutError only from Python 3.10
# (both caught, or a stalled body on Python 3.8 and 3.9 would be answered 500, not 408).
TIMEOUTS = (TimeoutError, socket.timeout)


class HttpError(BadHead):
    """A request refused before any endpoint acted on it; answered with the connection
    closed (what follows on it may be out of step)."""


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # encoded as JSON (an Encoded body: as it is)
    close: bool = False  # end the connection after it
    # Run once the answer is written (or could not be): an edge's pass ends there.
    after: Callable[[], None] | None = None


@dataclass
class Request:
    """One request as an endpoint sees it: who sent it (SO_PEERCRED), what it asks, and
    its body, read on demand within the request's deadline."""

    method: str
    path: str  # without the query
    query: str
    peer_pid: int
    peer_uid: int
    read_body: Callable[[], bytes] = field(repr=False)
    params: dict[str, str] = field(default_factory=dict)  # the path's {names}, by the router
    person: int | None = None  # whose share the connection took (None: an administrator's)
    _arguments: dict[str, list[str]] | None = field(default=None, repr=False)

    def argument(self, name: str) -> list[str] | None:
        """The query's values for ``name``; None when it has none."""
        if self._arguments is None:  # parsed once, however many the endpoint reads
            self._arguments = _arguments(self.query)
        return self._arguments.get(name)

    def body(self) -> bytes:
        return self.read_body()

    def json(self) -> dict[str, Any]:
        """The body as a JSON object; {} when there is none."""
        body = self.read_body()
        if not body:
            return {}
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, "invalid JSON", str(exc)[:200]) from None
        except RecursionError:  # thousands of nested brackets
            raise HttpError(400, "invalid JSON", "nested too deeply") from None
        if not isinstance(data, dict):
            raise HttpError(400, "invalid body", "the body must be a JSON object")
        return data


Application = typing.Callable[[Request], Response]  # 3.8: abc.Callable takes no [...]
# The person of a peer from its (pid, uid, pidfd or None): Persons.of_peer.
PeerPerson = typing.Callable[[int, int, typing.Optional[int]], int]


def credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the connected peer."""
    found = peer_credentials(sock)
    assert found is not None, "the daemon runs on Linux, which has SO_PEERCRED"
    return found


class DeadlineReader(io.RawIOBase):
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


def _arguments(query: str) -> dict[str, list[str]]:
    """``parse_qs(query)``; a query with nothing to decode (an edge's ``depth=0``) split
    as parse_qs would, in 1 us where parse_qs takes 8: fields without "=" or without a
    value dropped."""
    if "%" in query or "+" in query:
        return parse_qs(query)
    found: dict[str, list[str]] = {}
    for item in query.split("&"):
        name, equals, value = item.partition("=")
        if equals and value:
            found.setdefault(name, []).append(value)
    return found


def _valid_path(raw: str, path: str) -> bool:
    return (
        path.startswith("/")
        and "%" not in raw
        and "//" not in path
        and "/./" not in path + "/"
        and "/../" not in path + "/"
    )


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def send(
    sock: socket.socket,
    parts: tuple[bytes, ...],
    before_waiting: Callable[[], None] | None = None,
) -> None:
    """Send ``parts`` one after the other, all within REQUEST_TIMEOUT_S (socket.timeout
    past it), never joined: a reader that does not read holds no copy of them. The
    first write is tried at once; ``before_waiting`` is called once, before any wait
    for the reader (what must never wait on one: an edge's pass)."""
    views = [memoryview(part) for part in parts if part]
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    first, tried = 0, False
    while first < len(views):
        if tried:
            if before_waiting is not None:
                before_waiting, waited = None, before_waiting
                waited()
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the answer was not read in time")
            sock.settimeout(left)
        else:
            sock.settimeout(0.0)
            tried = True
        try:
            sent = sock.sendmsg(views[first : first + MAX_PARTS])
        except BlockingIOError:
            continue  # the reader's buffer is full: wait for it
        while first < len(views) and sent >= len(views[first]):
            sent -= len(views[first])
            first += 1
        if sent:
            views[first] = views[first][sent:]


def _nothing() -> None:
    pass


def http_date(seconds: float) -> str:
    """An answer's Date (RFC 9110 5.6.7), in English whatever the locale."""
    t = time.gmtime(seconds)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def read_head(rfile: io.BufferedReader) -> Head | None:
    """The next request's head; None when the connection ends (or sends an empty
    line) before one starts. Bounded: the request line at ``MAX_LINE_BYTES`` (414),
    each header line too and at most ``MAX_HEADERS`` of them (431)."""
    line = rfile.readline(MAX_LINE_BYTES + 1)
    if len(line) > MAX_LINE_BYTES:
        raise HttpError(414, HTTPStatus.REQUEST_URI_TOO_LONG.phrase.lower())
    request_line = line.decode("latin-1").rstrip("\r\n")
    if not request_line.split():
        return None
    method, target, version = parse_request_line(request_line)
    lines = []
    while True:
        line = rfile.readline(MAX_LINE_BYTES + 1)
        if len(line) > MAX_LINE_BYTES:
            raise HttpError(
                431,
                "Line too long",
                f"got more than {MAX_LINE_BYTES} bytes when reading header line",
            )
        if line in (b"\r\n", b"\n"):
            return Head(method, target, version, parse_fields(lines))
        if not line.endswith(b"\n"):
            raise HttpError(400, "truncated request", "the connection ended inside the headers")
        if len(lines) == MAX_HEADERS:
            raise HttpError(431, "Too many headers", f"got more than {MAX_HEADERS} headers")
        lines.append(line.decode("latin-1").rstrip("\r\n"))


class _Handler(socketserver.BaseRequestHandler):
    """One connection: its requests, one after another (keep-alive)."""

    server: UnixHttpServer

    def setup(self) -> None:
        # Its thread served other connections before (workers.py): its CPU from here.
        self._cpu_start = time.thread_time()
        self.peer_pid, self.peer_uid, _ = credentials(self.request)
        self._person: int | None = self.client_address[0]  # None: an administrator's
        self._reader = DeadlineReader(self.request)
        self._rfile = io.BufferedReader(self._reader)

    def handle(self) -> None:
        person, budget = self._person, self.server.budget
        with contextlib.suppress(*TIMEOUTS, ConnectionError):  # the connection just ends
            if person is None:
                while self._one_request():
                    pass
                return
            charged = self._cpu_start  # the connection's CPU from its setup on
            while True:
                budget.wait(person)  # her request waits in the socket, unread
                try:
                    more = self._one_request()
                finally:
                    spent = time.thread_time()
                    budget.charge(person, spent - charged)
                    charged = spent
                if not more:
                    return

    def _one_request(self) -> bool:
        """Read, dispatch and answer one request; whether the connection stays open."""
        self._reader.deadline = time.monotonic() + REQUEST_TIMEOUT_S
        self._head = Head("", "", (1, 1), {})  # what an answer to a bad head refers to
        self._body: bytes | None = None  # read once the endpoint asks for it
        try:
            head = read_head(self._rfile)
        except BadHead as exc:
            return self._reply(Response(exc.status, documents.error(exc.error, exc.detail), True))
        if head is None:
            return False
        self._head = head
        response = self._dispatch()
        after = _once(response.after)
        try:
            if self._body is None and (
                head.headers.get("content-length", "0").strip() != "0"
                or "transfer-encoding" in head.headers
            ):
                # A body the endpoint never read would be taken for the next request.
                response = dataclasses.replace(response, close=True)
            return self._reply(response, after) and head.keeps_alive()
        finally:
            after()

    def _reply(self, response: Response, before_waiting: Callable[[], None] | None = None) -> bool:
        """Write the answer, headers and body in one send (one wake of the client);
        whether the connection may stay open after it. ``before_waiting``: called
        before any wait for the client to read (send)."""
        body = response.body
        parts = body.parts if isinstance(body, Encoded) else (json.dumps(body).encode(),)
        status = HTTPStatus(response.status)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            "Server: edgewatt",
            f"Date: {http_date(time.time())}",
            "Content-Type: application/json",
            f"Content-Length: {sum(map(len, parts))}",
        ]
        if response.close:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # The answer's own time; its parts as they are (a shared answer: never copied).
        send(
            self.request, (head,) if self._head.method == "HEAD" else (head, *parts), before_waiting
        )
        log.debug(
            "api: pid %d %s %s %d",
            self.peer_pid,
            self._head.method,
            self._head.target[:200],
            status.value,
        )
        return not response.close

    def _dispatch(self) -> Response:
        head = self._head
        try:
            parts = urlsplit(head.target)
            if not _valid_path(head.target, parts.path):
                raise HttpError(
                    400, "invalid path", f"{head.target[:200]!r} is not a valid API path"
                )
            request = Request(
                head.method,
                parts.path,
                parts.query,
                self.peer_pid,
                self.peer_uid,
                self._read_body,
                person=self._person,
            )
            return self.server.application(request)
        except HttpError as exc:
            return Response(exc.status, documents.error(exc.error, exc.detail), close=True)
        except Exception:
            log.exception("api: unexpected error on %s %s", head.method, head.target[:200])
            return Response(500, documents.error("internal error", "see the daemon's log"))

    def _read_body(self) -> bytes:
        if self._body is None:
            self._body = self._receive_body()
        return self._body

    def _receive_body(self) -> bytes:
        headers = self._head.headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(400, "chunked bodies are not supported", "send Content-Length")
        try:
            length = self._head.content_length()
        except BadHead as exc:
            raise HttpError(exc.status, exc.error, exc.detail) from None
        if length is None:
            return b""
        if length > MAX_BODY_BYTES:
            raise HttpError(413, "body too large", f"{length} bytes; at most {MAX_BODY_BYTES}")
        if headers.get("expect", "").lower() == "100-continue" and self._head.version >= (1, 1):
            self.request.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # go on: it may come
        try:
            body = self._rfile.read(length)
        except TIMEOUTS:
            raise HttpError(
                408, "request timed out", f"request not received within {REQUEST_TIMEOUT_S:g} s"
            ) from None
        except ConnectionError:  # reset: nothing more will come
            body = b""
        if len(body) != length:
            raise HttpError(400, "truncated body", f"got {len(body)} of {length} bytes")
        return body


def _once(action: Callable[[], None] | None) -> Callable[[], None]:
    """``action``, run by the first call only (None: nothing)."""
    if action is None:
        return _nothing
    left = [action]

    def run() -> None:
        if left:
            left.pop()()

    return run


class UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves ``application`` at ``path``, a socket any local user may connect to (the
    application decides what each may do, by the peer's uid)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a burst of connects must not hit a full backlog (EAGAIN)

    def __init__(self, path: str, application: Application, person: PeerPerson) -> None:
        """``person``: the person a peer is, whose share its connections take."""
        self.application = application
        self._person = person
        self.budget = CpuBudget()  # the CPU each person's requests may take
        self._administrators = frozenset({0, os.geteuid()})  # held to the total alone
        # Connections being served, by person; the administrators' under None.
        self._open: Counter[int | None] = Counter()
        self._open_lock = threading.Lock()
        own_directory(os.path.dirname(path) or ".")
        clear_stale_socket(path)
        super().__init__(path, _Handler)
        # Any local user may register their own processes; SO_PEERCRED enforces the rest.
        os.chmod(path, 0o666)
        self.path = path
        self._wake_r, self._wake_w = socket.socketpair()
        self._serving = threading.Lock()  # held by serve_forever while it runs
        self._workers = Workers()  # each connection's thread, kept for the next

    def serve_forever(self, poll_interval: float = 0.0) -> None:
        """Accept until :meth:`shutdown`, asleep between connections (``poll_interval``
        is socketserver's signature only: nothing polls)."""
        with self._serving, selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                self._handle_request_noblock()

    def shutdown(self) -> None:
        """End :meth:`serve_forever` now, and wait until it has (from another thread)."""
        with contextlib.suppress(OSError):  # already woken, and closed
            self._wake_w.send(b"x")
        with self._serving:  # serve_forever returned (or never ran)
            pass

    def process_request(self, request: Any, client_address: Any) -> None:
        pid, uid, _ = credentials(request)
        share = None if uid in self._administrators else self._peer_person(request, pid, uid)
        with self._open_lock:
            total = sum(self._open.values())  # Counter.total() is 3.10+
            users = MAX_CONNECTIONS - RESERVED_CONNECTIONS
            if total >= MAX_CONNECTIONS:
                refused = f"at most {MAX_CONNECTIONS} at once"
            elif share is not None and total - self._open[None] >= users:
                refused = (
                    f"at most {users} at once for users ({RESERVED_CONNECTIONS} kept for root)"
                )
            elif share is not None and self._open[share] >= MAX_CONNECTIONS_PER_PERSON:
                refused = f"at most {MAX_CONNECTIONS_PER_PERSON} at once per user"
            else:
                refused = ""
                self._open[share] += 1
        if refused:
            refuse(request, refused)
            self.shutdown_request(request)
            return
        # ThreadingMixIn's per-connection work, in a kept thread rather than a new one.
        served = (share, client_address)
        self._workers.run(functools.partial(self.process_request_thread, request, served))

    def _peer_person(self, request: socket.socket, pid: int, uid: int) -> int:
        pidfd = peer_pidfd(request)
        try:
            return self._person(pid, uid, pidfd)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        share, _ = client_address
        try:  # the handler finds its person in client_address
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open[share] -= 1
                if self._open[share] <= 0:
                    del self._open[share]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._workers.close()
        self._wake_r.close()
        self._wake_w.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def refuse(request: socket.socket, detail: str) -> None:
    """A 429 written straight to a connection that gets no thread."""
    body = json.dumps(documents.error("too many connections", detail)).encode()
    try:
        request.settimeout(0.5)
        request.sendall(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
    except OSError:
        pass


def own_directory(directory: str) -> None:
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


def clear_stale_socket(path: str) -> None:
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
