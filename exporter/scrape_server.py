"""The HTTP server behind /metrics: one thread, one selector, no thread per scrape.

A scraper's request is read without blocking, so a client that trickles its request
(or never sends it, or never reads the answer) holds no worker and delays no other
scrape. Each connection has one deadline for all of its request and one for all of its
answer; a timeout that restarted with every byte would let one byte every few seconds
hold a connection for ever.

Connections are counted by peer: a local one (its end of the connection found on this
host by the kernel's socket diagnostics) by the person of the uid that holds it
(core/persons.py), whatever loopback address it comes from; a remote one by its
address (an IPv6 one by its /64, what one host is given). A peer holds at most
``MAX_PER_PEER`` connections at once, more are closed at once; root and the daemon's
own uid, the administrator's clients, are one peer held to the total alone. The
server holds ``MAX_CONNECTIONS``; with all of them taken, a newcomer is not refused
while a peer holds more than the newcomer's would with it: the oldest connection of
the peer that holds the most is closed to make room. So a scraper gets in unless
every open connection is a different peer's (256 persons or hosts), however many one
user holds.

An answer is the render's own bytes, shared by every connection that sends it, never
copied. A scraper that does not read holds no more than its socket's send buffer
(``SEND_BUFFER_BYTES``) and its share of the renders kept for such readers: while
older answers than the newest one held by connections pass ``MAX_HELD_BYTES``, the
connections that hold the oldest are closed (a scraper that reads takes less than a
pass; its next scrape gets the newest).

One thread also keeps the host's pid counter still: a thread per scrape would take a
new pid every scrape, and the parent index (``procfs.ParentIndex``) lists /proc again
whenever the host's last pid moves.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgewatt.core.compat import name_thread
from edgewatt.core.kernel.sockets import SockDiag
from edgewatt.core.uids import alone
from edgewatt.exporter.http_head import BadHead, parse_head

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
MAX_CONNECTIONS = 256
MAX_PER_PEER = 16
ADMINISTRATOR = "administrator"  # root and the daemon's uid: one peer, held to the total alone
REQUEST_DEADLINE_S = 5.0  # from accept to the end of the request's headers
ANSWER_DEADLINE_S = 60.0  # from the end of the request to the last byte of the answer
# Older answers than the newest kept for connections still sending them, all together.
MAX_HELD_BYTES = 16 << 20
# The kernel's buffer of each connection (it doubles it: 128 KiB), in place of TCP's
# autotuning up to 4 MiB, charged to the daemon's cgroup (MemoryMax), however many
# connections do not read: 256 take at most 32 MiB.
SEND_BUFFER_BYTES = 64 << 10


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    headers: dict[str, str]  # names in lower case


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class _Connection:
    sock: socket.socket
    peer: str  # whose share it takes: "uid N" (a person), "address A" or ADMINISTRATOR
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    # Set once the request is answered: what is left to send, head and body apart (sent
    # with one sendmsg, never copied into one buffer: the body is ~500 KB at 200 targets).
    outbox: list[memoryview] | None = None
    body: bytes = b""  # the answer's, shared with the render: what it keeps alive


class ScrapeServer:
    """Serves ``respond``'s answers to GET and HEAD requests, one per connection."""

    def __init__(
        self,
        host: str,
        port: int,
        respond: Callable[[Request], Answer],
        person: Callable[[int], int] = alone,
    ) -> None:
        """``person``: the person a local peer's uid is, whose share it takes."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here: a port in use raises OSError before anything else started.
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._respond = respond
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._person = person
        self._administrators = frozenset({0, os.geteuid()})
        self._diag = _sock_diag()
        self._connections: dict[socket.socket, _Connection] = {}  # oldest first
        self._per_peer: Counter[str] = Counter()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="metrics", daemon=True)
        self._thread.start()
        name_thread(self._thread)

    def close(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for connection in list(self._connections.values()):
            self._drop(connection)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._diag is not None:
            self._diag.close()

    # -- the loop -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select(self._timeout()):
                try:
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        return
                    else:
                        self._service(self._connections[key.fileobj], events)  # type: ignore[index]
                except Exception:  # one connection's trouble never ends the server
                    log.exception("metrics endpoint: unexpected error")
                    if key.fileobj in self._connections:
                        self._drop(self._connections[key.fileobj])  # type: ignore[index]
            now = time.monotonic()
            for connection in [c for c in self._connections.values() if c.deadline < now]:
                self._drop(connection)

    def _timeout(self) -> float | None:
        """Until the first connection's deadline; none without connections: asleep until
        one arrives or close() writes to the wake socket."""
        if not self._connections:
            return None
        return max(0.0, min(c.deadline for c in self._connections.values()) - time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # what the backlog holds, without starving the others
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("metrics endpoint: cannot accept: %s", exc.strerror)
                    return
                raise
            peer = self._peer(sock, address)
            capped = peer != ADMINISTRATOR and self._per_peer[peer] >= MAX_PER_PEER
            if capped or not self._room_for(peer):
                sock.close()  # a scraper retries; holding it would cost the others
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            connection = _Connection(sock, peer, time.monotonic() + REQUEST_DEADLINE_S)
            self._connections[sock] = connection
            self._per_peer[peer] += 1
            self._selector.register(sock, selectors.EVENT_READ)

    def _peer(self, sock: socket.socket, address: tuple[Any, ...]) -> str:
        """Whose share a connection takes: a local peer's person, else its address."""
        if self._diag is not None:
            try:
                uid = self._diag.peer_uid(sock.getsockname(), address)
            except OSError:  # counted by its address
                uid = None
            if uid in self._administrators:
                return ADMINISTRATOR
            if uid is not None:
                return f"uid {self._person(uid)}"
        host = address[0].split("%", 1)[0]
        if ":" in host and not host.startswith("::ffff:"):
            packed = socket.inet_pton(socket.AF_INET6, host)
            host = socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"
        return f"address {host}"

    def _room_for(self, peer: str) -> bool:
        """Whether a connection of ``peer`` fits: with every one taken, the oldest of the
        peer holding the most is closed for it, where that peer holds more than
        ``peer`` would with it."""
        if len(self._connections) < MAX_CONNECTIONS:
            return True
        most, held = max(self._per_peer.items(), key=lambda item: item[1])
        if held <= self._per_peer[peer] + 1:
            return False
        self._drop(next(c for c in self._connections.values() if c.peer == most))
        return True

    def _service(self, connection: _Connection, events: int) -> None:
        if connection.outbox is None and events & selectors.EVENT_READ:
            self._receive(connection)
        elif connection.outbox is not None and events & selectors.EVENT_WRITE:
            self._send(connection)

    def _receive(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        connection.inbox += data
        end = connection.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = connection.inbox.find(b"\n\n")
        if end < 0:
            if len(connection.inbox) > MAX_HEAD_BYTES:
                self._answer(connection, _plain(431, "Request Header Fields Too Large"))
            return
        self._answer(connection, self._handle(bytes(connection.inbox[:end])))

    def _handle(self, head: bytes) -> Answer:
        try:
            parsed = parse_head(head)
        except BadHead:
            parsed = None
        if parsed is None or parsed.version < (1, 0):  # a scraper speaks HTTP/1.x
            return _plain(400, "Bad Request")
        request = Request(parsed.method, parsed.target.split("?", 1)[0], parsed.headers)
        if request.method not in ("GET", "HEAD"):
            return _plain(405, "Method Not Allowed", (("Allow", "GET, HEAD"),))
        answer = self._respond(request)
        if request.method == "HEAD":
            length = str(len(answer.body))
            headers = tuple(h for h in answer.headers if h[0] != "Content-Length")
            return Answer(answer.status, answer.reason, b"", (*headers, ("Content-Length", length)))
        return answer

    def _answer(self, connection: _Connection, answer: Answer) -> None:
        headers = dict(answer.headers)
        headers.setdefault("Content-Length", str(len(answer.body)))
        headers["Connection"] = "close"  # one request per connection: nothing idles
        head = f"HTTP/1.1 {answer.status} {answer.reason}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        parts = ((head + "\r\n").encode("latin-1"), answer.body)
        connection.outbox = [memoryview(part) for part in parts if part]
        connection.body = answer.body
        connection.deadline = time.monotonic() + ANSWER_DEADLINE_S
        self._bound_held(answer.body)
        if self._send(connection):  # what the socket did not take waits for it
            self._selector.modify(connection.sock, selectors.EVENT_WRITE)

    def _send(self, connection: _Connection) -> bool:
        """Send what the socket takes; True where some is left (the connection open)."""
        outbox = connection.outbox
        assert outbox is not None
        try:
            sent = connection.sock.sendmsg(outbox)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            self._drop(connection)
            return False
        while outbox and sent >= len(outbox[0]):
            sent -= len(outbox.pop(0))
        if outbox:
            outbox[0] = outbox[0][sent:]
            return True
        self._drop(connection)
        return False

    def _bound_held(self, newest: bytes) -> None:
        """Close the connections that hold the oldest answers while the answers older
        than ``newest`` held by connections (each counted once) pass MAX_HELD_BYTES."""
        holders: dict[int, list[_Connection]] = {}
        sizes: dict[int, int] = {}
        for connection in self._connections.values():
            body = connection.body
            if connection.outbox is not None and body is not newest and body:
                holders.setdefault(id(body), []).append(connection)
                sizes[id(body)] = len(body)
        held = sum(sizes.values())
        # Oldest first: the one whose first connection was answered first.
        for key in sorted(holders, key=lambda k: min(c.deadline for c in holders[k])):
            if held <= MAX_HELD_BYTES:
                return
            for connection in holders[key]:
                self._drop(connection)
            held -= sizes[key]

    def _drop(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        self._per_peer[connection.peer] -= 1
        if self._per_peer[connection.peer] <= 0:
            del self._per_peer[connection.peer]
        self._selector.unregister(connection.sock)
        connection.sock.close()


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header allows gzip: listed (or "*") with a q-value
    above 0 (RFC 9110 12.5.3), so "gzip;q=0" refuses it."""
    weights = {}
    for item in accept_encoding.split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding:
            weights[coding.lower()] = q
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


def _sock_diag() -> SockDiag | None:
    """The kernel's socket diagnostics, which tell a local peer's uid; None where the
    kernel has none (every peer is then counted by its address)."""
    try:
        return SockDiag()
    except OSError:
        return None


def _plain(status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    body = f"{status} {reason}\n".encode()
    return Answer(status, reason, body, (("Content-Type", "text/plain"), *headers))
