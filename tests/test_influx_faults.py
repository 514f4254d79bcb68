"""InfluxDB servers that misbehave, as loopback stand-ins (no real InfluxDB does this
on purpose; proxies, half-dead hosts and hostile networks do): one that trickles its
answer a byte at a time or never answers, one that redirects elsewhere, one that is
down while a target with 64 labels of 1 KiB fills the buffer. The real daemon pushes
to them over real TCP."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edgewatt.exporter import config
from edgewatt.exporter.influx import BATCH_BYTES
from tests.conftest import DaemonProcess, wait_for

TOKEN = "s3cr3t-token"


def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one HTTP request."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for header in head.split(b"\r\n")[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


class StandIn:
    """A TCP server on ``host``; ``handle(conn, head, body)`` answers each request."""

    def __init__(self, handle: Callable[[socket.socket, bytes, bytes], None], host: str) -> None:
        self.handle = handle
        self.requests: list[tuple[bytes, bytes]] = []
        self.listener = socket.create_server((host, 0))
        self.url = f"http://{host}:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self.closed.is_set():
                    head, body = read_request(conn)
                    if not head:
                        return
                    self.requests.append((head, body))
                    self.handle(conn, head, body)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.fixture
def stand_ins() -> Iterator[Callable[..., StandIn]]:
    made: list[StandIn] = []

    def make(handle: Callable[[socket.socket, bytes, bytes], None], host: str = "127.0.0.1"):
        made.append(StandIn(handle, host))
        return made[-1]

    yield make
    for server in made:
        server.close()


def influx_daemon(factory: Any, url: str, **env: str) -> DaemonProcess:
    return factory(
        interval=0.2,
        env={
            "EDGEWATT_INFLUX_URL": url,
            "EDGEWATT_INFLUX_ORG": "lab",
            "EDGEWATT_INFLUX_BUCKET": "edge",
            "EDGEWATT_INFLUX_TOKEN": TOKEN,
            "EDGEWATT_INFLUX_INTERVAL": "0.5",
            **env,
        },
    )


def influx_status(daemon: DaemonProcess) -> dict[str, Any]:
    return daemon.call("GET", "/healthz")[1]["influx"]


def answered(status: str, extra: str = "") -> Callable[[socket.socket, bytes, bytes], None]:
    def handle(conn: socket.socket, head: bytes, body: bytes) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n{extra}\r\n".encode())

    return handle


def trickle(closed: threading.Event) -> Callable[[socket.socket, bytes, bytes], None]:
    """An answer that never ends, a byte every 0.2 s: a receive never times out."""

    def handle(conn: socket.socket, head: bytes, body: bytes) -> None:
        endless = b"HTTP/1.1 204 No Content\r\n" + b"X-Slow: " + b"z" * 10_000
        for byte in endless:
            if closed.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    return handle


def silent(closed: threading.Event) -> Callable[[socket.socket, bytes, bytes], None]:
    def handle(conn: socket.socket, head: bytes, body: bytes) -> None:
        closed.wait(600)

    return handle


# -- a deadline for the whole exchange ----------------------------------------------


@pytest.mark.parametrize("behaviour", [trickle, silent])
def test_a_stuck_write_is_shown_and_cut_at_its_deadline_and_at_stop(
    daemon_factory: Any, stand_ins: Any, behaviour: Any
) -> None:
    closed = threading.Event()
    server = stand_ins(behaviour(closed))
    daemon = influx_daemon(daemon_factory, server.url, EDGEWATT_INFLUX_TIMEOUT="1")
    # Each write has 1 s for all of it: the first fails at its deadline, and says so.
    wait_for(lambda: influx_status(daemon)["failing"], timeout=10)
    status = influx_status(daemon)
    assert status["error"] == "no whole answer within 1 s", status
    assert status["written_lines"] == 0 and status["queued_lines"] > 0
    # While a write waits, health says for how long.
    wait_for(lambda: (influx_status(daemon)["writing_s"] or 0) > 0.3, timeout=10)
    closed.set()


@pytest.mark.parametrize("behaviour", [trickle, silent])
def test_sigterm_stops_within_five_seconds_whatever_the_server_does(
    daemon_factory: Any, stand_ins: Any, behaviour: Any
) -> None:
    closed = threading.Event()
    server = stand_ins(behaviour(closed))
    # A write may take up to 60 s; a stop may not.
    daemon = influx_daemon(daemon_factory, server.url, EDGEWATT_INFLUX_TIMEOUT="60")
    wait_for(lambda: server.requests, timeout=10)
    # The write is waiting for its answer, as health says.
    wait_for(lambda: (influx_status(daemon)["writing_s"] or 0) > 0, timeout=10)
    took = daemon.stop()  # SIGTERM; the helper kills at 10 s
    closed.set()
    assert took < 6.0, took  # 5 s for the stop's last write, and the interpreter's exit
    assert daemon.proc is not None and daemon.proc.returncode == 0
    assert "edgewatt stopped" in daemon.log()


# -- redirects ---------------------------------------------------------------------


@pytest.mark.parametrize("code", ["302 Found", "307 Temporary Redirect", "308 Permanent Redirect"])
def test_a_redirect_is_not_followed_and_nothing_counts_as_written(
    daemon_factory: Any, stand_ins: Any, code: str
) -> None:
    elsewhere = stand_ins(answered("204 No Content"), host="127.0.0.2")
    target = f"{elsewhere.url}/api/v2/write?org=lab&bucket=edge&precision=ns"
    redirecting = stand_ins(answered(code, f"Location: {target}\r\n"))
    daemon = influx_daemon(daemon_factory, redirecting.url)
    wait_for(lambda: len(redirecting.requests) >= 2, timeout=10)
    status = influx_status(daemon)
    assert status["failing"] and status["written_lines"] == 0 and status["queued_lines"] > 0
    assert status["error"] == f"HTTP {code[:3]} to '{target}', not followed: set influx_url"
    assert elsewhere.requests == []  # neither the token nor the data went there
    assert daemon.log().count("are failing") == 1
    assert TOKEN.encode() in redirecting.requests[0][0]  # the configured host has it


# -- bounded in bytes -----------------------------------------------------------------

# As many labels as a registration may carry, as long as its body may be (64 KiB).
LABELS = {f"l{n:02d}": chr(ord("a") + n % 26) * 1000 for n in range(64)}


def test_a_target_with_64_labels_of_1_kib_fills_the_buffer_in_bytes_oldest_dropped(
    daemon_factory: Any, stand_ins: Any, spawn: Any
) -> None:
    down = threading.Event()
    down.set()
    received: list[bytes] = []

    def handle(conn: socket.socket, head: bytes, body: bytes) -> None:
        if down.is_set():
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            return
        received.append(gzip.decompress(body))
        conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    server = stand_ins(handle)
    bound = 2 << 20
    daemon = influx_daemon(daemon_factory, server.url, EDGEWATT_INFLUX_BUFFER_BYTES=str(bound))
    sleeper = spawn("import time; time.sleep(120)")
    target = daemon.register(sleeper.pid, labels=LABELS)["id"]
    wait_for(lambda: influx_status(daemon)["dropped_lines"] > 0, timeout=60)
    status = influx_status(daemon)
    # Bytes, the labels in them: full to within one line of the target's (~64 KB).
    assert status["buffer_bytes"] == bound
    assert bound - 70_000 < status["queued_bytes"] <= bound, status
    assert status["dropped_bytes"] > 64 * 1000
    queued_at_outage_end = status["queued_lines"]

    down.clear()
    wait_for(lambda: influx_status(daemon)["written_lines"] >= queued_at_outage_end, timeout=30)
    lines = [t for batch in received for t in batch.decode().splitlines()]
    # Each write within 1 MiB; the oldest were dropped, so what arrives first is late.
    assert all(len(batch) <= BATCH_BYTES for batch in received)
    target_lines = [t for t in lines if f"edgewatt_target_id={target}" in t]
    assert target_lines and all(t.count(",l") == 64 for t in target_lines)
    assert len(target_lines[0]) > 64 * 1000
    assert "InfluxDB buffer full (2097152 bytes)" in daemon.log()


def test_the_old_line_bound_is_refused_naming_the_byte_bound(tmp_path: Any) -> None:
    path = tmp_path / "edgewatt.yaml"
    path.write_text("influx_buffer_lines: 200000\n")
    with pytest.raises(config.ConfigError, match="use influx_buffer_bytes"):
        config.build(str(path), {}, {})
    with pytest.raises(config.ConfigError, match=r"from EDGEWATT_INFLUX_BUFFER_LINES.*bytes"):
        config.build(None, {"EDGEWATT_INFLUX_BUFFER_LINES": "1000"}, {})
    assert config.Config().influx_buffer_bytes == 64 << 20
