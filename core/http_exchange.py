"""One HTTP POST to a store, with a deadline for the whole exchange.

A socket timeout bounds each receive, not the exchange: a server trickling a byte a
second, or resolving slowly, would hold the caller for as long as it likes. Here the
exchange runs on a thread of its own and the caller waits for it until the deadline;
past it the connection is shut down (which ends a blocked receive at once) and the
caller gets TimeoutError. A thread stuck in name resolution, which nothing can cut
short, is left to end on its own: it holds nothing the caller waits for.

No redirect is followed: the answer is returned as it is, 3xx included, so the
caller decides, and credentials never go to a host they were not configured for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

# The start of an answer's body kept for the log: a server's reason, never its bulk.
REASON_BYTES = 300


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most REASON_BYTES
    location: str  # a redirect's Location header, "" when none


class _Exchange:
    def __init__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url[:200]}")
        # Imported here: http.client brings ssl and the email package (~7 MiB of RSS),
        # which a daemon that posts nowhere need not map.
        import http.client

        https = parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        self.connection = kind(parts.hostname, parts.port, timeout=timeout_s)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.body = body
        self.headers = dict(headers)
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.aborted = False
        self.done = threading.Event()  # answered, failed or aborted

    def run(self) -> None:
        try:
            self.connection.request("POST", self.target, self.body, self.headers)
            response = self.connection.getresponse()
            body = response.read(REASON_BYTES)
            location = response.getheader("Location", "") or ""
            self.answer = Answer(response.status, body, location)
        except BaseException as exc:  # handed to the caller, which decides
            self.error = exc
        finally:
            self.connection.close()
            self.done.set()

    def abort(self) -> None:
        self.aborted = True
        sock = self.connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)
        self.done.set()  # the caller stops waiting even while a name still resolves


class Exchanges:
    """Posts one at a time, each within its deadline; ``busy_s`` says how long the
    current one has waited (for /healthz), ``abort`` ends it now (at shutdown)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._current: _Exchange | None = None
        self._started = 0.0
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: Mapping[str, str], deadline: float) -> Answer:
        """The server's answer, whatever its status; TimeoutError past ``deadline``
        (a time.monotonic() value), OSError or http.client.HTTPException on failure."""
        timeout_s = deadline - time.monotonic()
        if timeout_s <= 0:
            raise TimeoutError("no time left for a write")
        exchange = _Exchange(url, body, headers, timeout_s)
        with self._lock:
            self._current, self._started = exchange, time.monotonic()
        try:
            threading.Thread(target=exchange.run, name=self.name, daemon=True).start()
            if not exchange.done.wait(max(0.0, deadline - time.monotonic())):
                exchange.abort()
                # Two digits: the wait began a few ms into the write's time (1 s, not
                # 0.999 s, as its timeout was set).
                raise TimeoutError(f"no whole answer within {timeout_s:.2g} s")
        finally:
            with self._lock:
                self._current = None
        if exchange.aborted:
            raise ConnectionAbortedError("cut short at shutdown")
        if exchange.error is not None:
            raise exchange.error
        assert exchange.answer is not None
        return exchange.answer

    def busy_s(self) -> float | None:
        with self._lock:
            return None if self._current is None else time.monotonic() - self._started

    def abort(self) -> None:
        with self._lock:
            current = self._current
        if current is not None:
            current.abort()
