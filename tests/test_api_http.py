"""The API's HTTP/1.1 reader and writer (exporter/unix_http.py, exporter/http_head.py),
tried like an adversary over the real daemon's real socket: what http.server answered
before them is answered the same, except where it let a request mean two things."""

from __future__ import annotations

import email.utils
import json
import os
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from edgewatt.core.transport import Connection
from edgewatt.exporter.http_head import BadHead, parse_head
from edgewatt.exporter.unix_http import Request, Response, UnixHttpServer, http_date
from tests.conftest import DaemonProcess, wait_for


def exchange(
    sock_path: str, data: bytes, shut: bool = False, wait: float = 1.0
) -> tuple[bytes, bool]:
    """Everything answered to ``data`` within ``wait`` s of quiet, and whether the
    daemon closed the connection."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock_path)
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(wait)
        got = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                return got, False
            if not chunk:
                return got, True
            got += chunk


def answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """(status, headers, body) of each answer in ``data``, in order."""
    found = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        length = int(headers.get("Content-Length", "0"))
        if lines[0].split()[1] == "100":
            length = 0
        found.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return found


def error_of(body: bytes) -> str:
    document = json.loads(body)
    return f"{document['error']}: {document['detail']}"


GET = b"GET /healthz HTTP/1.1\r\n\r\n"
POST_HEAD = b"POST /v1/targets HTTP/1.1\r\n"

# (request, closes the write side after it, status, error gist): each once refused by
# http.server with these figures; the rest of the connection is closed after it.
REFUSED = [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", False, 414, "uri too long"),
    (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", False, 431, "Line too long"),
    (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", False, 431, "Too many headers"),
    (b"GARBAGE\r\n\r\n", False, 400, "Bad request syntax ('GARBAGE')"),
    (b"GET /healthz HTTP/1.1 x\r\n\r\n", False, 400, "Bad request version ('x')"),
    (b"GET /healthz HTTP/1.x\r\n\r\n", False, 400, "Bad request version ('HTTP/1.x')"),
    (b"GET /healthz HTTP/1.00000000001\r\n\r\n", False, 400, "Bad request version"),
    (b"GET /healthz HTTP/2.0\r\n\r\n", False, 505, "Invalid HTTP version (2.0)"),
    (b"POST /healthz\r\n\r\n", False, 400, "Bad HTTP/0.9 request type ('POST')"),
    (POST_HEAD + b"Content-Length: -1\r\n\r\n", False, 400, "invalid Content-Length: '-1'"),
    (POST_HEAD + b"Content-Length: ab\r\n\r\n", False, 400, "invalid Content-Length: 'ab'"),
    (POST_HEAD + b"Content-Length: +2\r\n\r\n{}", False, 400, "invalid Content-Length: '+2'"),
    (POST_HEAD + b"Content-Length: 99999999999999999999\r\n\r\n", False, 413, "body too large"),
    (POST_HEAD + b"Content-Length: 65537\r\n\r\n", False, 413, "65537 bytes; at most 65536"),
    (POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", False, 400, "chunked"),
    (POST_HEAD + b'Content-Length: 10\r\n\r\n{"a"', True, 400, "got 4 of 10 bytes"),
    (b"BREW /v1/targets HTTP/1.1\r\n\r\n", False, 405, "BREW not allowed"),
    (b"GET /v1//targets HTTP/1.1\r\n\r\n", False, 400, "invalid path"),
]

# Refused now, where http.server dropped the line and every header after it (so a
# Content-Length below went unseen and its body was read as the next request), or
# took the first of two Content-Lengths.
NOW_REFUSED = [
    (POST_HEAD + b"NoColon\r\nContent-Length: 2\r\n\r\n{}", "'NoColon' is not a header field"),
    (POST_HEAD + b"Content-Length : 2\r\n\r\n{}", "is not a header field"),
    (b"GET /healthz HTTP/1.1\r\nX-A: a\r\n  b\r\n\r\n", "is a folded header line"),
    (POST_HEAD + b"Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}", "invalid Content-Length"),
]


def test_malformed_requests_get_the_answers_http_server_gave(daemon: DaemonProcess) -> None:
    for request, shut, status, gist in REFUSED:
        got, closed = exchange(daemon.socket, request, shut)
        [(got_status, headers, body)] = answers(got)
        assert (got_status, closed) == (status, True), (request[:60], got)
        assert gist in error_of(body), (request[:60], body)
        assert headers["Connection"] == "close"
    for request, gist in NOW_REFUSED:
        got, closed = exchange(daemon.socket, request)
        [(got_status, _, body)] = answers(got)
        assert (got_status, closed) == (400, True), (request, got)
        assert gist in error_of(body)
    assert daemon.call("GET", "/v1/targets")[1]["targets"] == []  # none went through
    # The limits' edges are taken: a request line of 65,536 bytes, 100 headers.
    long_line = b"GET /" + b"a" * (65_536 - 17) + b" HTTP/1.1\r\n\r\n"
    assert answers(exchange(daemon.socket, long_line)[0])[0][0] == 404
    many = b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n"
    assert answers(exchange(daemon.socket, many)[0])[0][0] == 200


# Numbers that str.isdigit() takes and int() refuses (or takes as another number):
# each was a 500 with a 21-line traceback in the log, per request.
HOSTILE_NUMBERS = [
    (POST_HEAD + "Content-Length: \u00b2\r\n\r\n".encode("latin-1"), 400, "invalid Content-Length"),
    (POST_HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n", 413, "5000 digits"),
    (POST_HEAD + b"Content-Length: 0002\r\n\r\n{}", 201, ""),
    (POST_HEAD + b"Content-Length: 2 \r\n\r\n{}", 200, ""),  # the same pid again: 200
    ("GET /healthz HTTP/1.\u00b9\r\n\r\n".encode("latin-1"), 400, "Bad request version"),
]


def test_hostile_numbers_are_refused_by_name_and_never_logged_as_a_crash(
    daemon: DaemonProcess,
) -> None:
    for request, status, gist in HOSTILE_NUMBERS:
        [(got_status, _, body)] = answers(exchange(daemon.socket, request)[0])
        assert got_status == status, (request[:60], body)
        if gist:
            assert gist in error_of(body), (request[:60], body)
    for _ in range(50):  # a flood: no line per request
        exchange(daemon.socket, HOSTILE_NUMBERS[0][0])
    log = daemon.log()
    assert "Traceback" not in log and "unexpected error" not in log, log[-2000:]


def test_an_answer_has_the_headers_it_had(daemon: DaemonProcess) -> None:
    got, closed = exchange(daemon.socket, GET)
    head = got.partition(b"\r\n\r\n")[0].decode()
    assert not closed
    assert re.fullmatch(
        r"HTTP/1\.1 200 OK\r\nServer: edgewatt\r\n"
        r"Date: (Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct"
        r"|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT\r\n"
        r"Content-Type: application/json\r\nContent-Length: \d+",
        head,
    ), head
    # HEAD: the same headers, no body; the connection stays open.
    got, closed = exchange(daemon.socket, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    [(status, headers, body)] = answers(got)
    assert (status, body, closed) == (200, b"", False) and int(headers["Content-Length"]) > 100
    assert got.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("t", [0.0, 951_782_400.5, 1_796_329_515.0, 4_102_444_799.0])
def test_the_date_is_what_the_email_package_wrote(t: float) -> None:
    assert http_date(t) == email.utils.formatdate(t, usegmt=True)


@pytest.mark.parametrize(
    "query",
    [
        "depth=0",
        "final=0.5&depth=12",
        "a=1&a=2&b=",
        "a&b=2",
        "=x&y=",
        "a=1&&b=2&",
        "a=b=c",
        "since=1.5;x=2",
        "a=%20b&c=+d",
        "n=caf\u00e9",
        "",
    ],
)
def test_a_querys_arguments_are_what_parse_qs_gives(query: str) -> None:
    request = Request("GET", "/", query, 1, 0, lambda: b"")
    names = {item.partition("=")[0] for item in query.replace(";", "&").split("&")}
    assert {name: request.argument(name) for name in names} == {
        name: parse_qs(query).get(name) for name in names
    }


def test_keep_alive_pipelining_and_closing(daemon: DaemonProcess) -> None:
    # Two requests in one write: two answers, in order, and the connection stays open.
    got, closed = exchange(daemon.socket, GET + b"GET /v1/targets HTTP/1.1\r\n\r\n")
    assert [a[0] for a in answers(got)] == [200, 200] and not closed
    assert json.loads(answers(got)[1][2]) == {"targets": []}
    # A body read by its endpoint, then the next request on the same connection.
    body = b'{"labels": {"run": "pipelined"}}'  # registers the caller
    sent = POST_HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body) + GET
    got, closed = exchange(daemon.socket, sent)
    assert [a[0] for a in answers(got)] == [201, 200] and not closed, got
    # HTTP/1.0 closes after its answer unless it asks for keep-alive; 1.1 when it asks.
    assert exchange(daemon.socket, b"GET /healthz HTTP/1.0\r\n\r\n")[1]
    keep = b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    assert not exchange(daemon.socket, keep)[1]
    assert exchange(daemon.socket, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")[1]
    # An empty line where a request should start ends the connection, unanswered.
    assert exchange(daemon.socket, b"\r\n") == (b"", True)


def test_a_body_its_endpoint_did_not_read_is_never_taken_for_a_request(
    daemon: DaemonProcess,
) -> None:
    # http.server answered GET /healthz, then read "helloGET ..." as the next request
    # line (405 "helloGET not allowed"): a body can smuggle a request past a proxy.
    sent = b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /healthz HTTP/1.1\r\n\r\n"
    got, closed = exchange(daemon.socket, sent)
    [(status, headers, _)] = answers(got)
    assert (status, headers.get("Connection"), closed) == (200, "close", True)


def test_expect_100_continue_is_answered_before_the_body(daemon: DaemonProcess) -> None:
    # http.server buffered its 100 Continue with the answer: a client that waits for
    # it before sending the body (as curl does, for a second) waited for nothing.
    body = b'{"labels": {"run": "x"}}'
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        s.settimeout(3)
        s.sendall(POST_HEAD + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        assert s.recv(1 << 16).startswith(b"HTTP/1.1 201 Created\r\n")


def test_a_head_sent_a_byte_at_a_time_ends_at_the_request_deadline(
    daemon: DaemonProcess,
) -> None:
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        s.settimeout(0.5)
        ended = False
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 40:  # 20 s at 2 a second
            try:
                s.send(bytes([byte]))
                ended = s.recv(100) == b""
            except TimeoutError:
                continue
            except OSError:
                ended = True
            if ended:
                break
    # Closed unanswered at the 5 s deadline for the whole request, not 5 s per byte.
    assert ended and time.monotonic() - started < 15


def test_the_scrape_server_parses_heads_the_same_way(daemon: DaemonProcess) -> None:
    assert parse_head(
        b"GET /metrics?x=1 HTTP/1.1\r\nAccept-Encoding: gzip\r\nX: a\r\nx: b"
    ).headers == {
        "accept-encoding": "gzip",
        "x": "a, b",
    }
    with pytest.raises(BadHead, match="invalid header"):
        parse_head(b"GET /metrics HTTP/1.1\r\nNoColon")
    for head in (b"GET /metrics HTTP/1.1\r\nNoColon\r\n\r\n", b"GET /metrics\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as s:
            s.sendall(head)
            assert s.recv(100).startswith(b"HTTP/1.1 400 Bad Request\r\n"), head
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:  # a real client still gets its page
        assert r.status == 200 and b"edgewatt" in r.read()


def _daemon_cpu_s(daemon: DaemonProcess) -> float:
    """The daemon's user and system CPU as the kernel counted it (its /proc stat)."""
    assert daemon.proc is not None
    with open(f"/proc/{daemon.proc.pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_flood_of_top_is_built_once_a_pass_and_shared(daemon_factory: Any, spawn: Any) -> None:
    # A long interval: the flood falls between two passes.
    daemon = daemon_factory(interval=30.0)
    fat = {f"k{i}": "v" * 1000 for i in range(64)}  # the most labels a target may have
    for _ in range(10):
        daemon.register(spawn("import time; time.sleep(60)").pid, labels=fat)
    keep_alive = b"GET /v1/top HTTP/1.1\r\n\r\n"
    before = _daemon_cpu_s(daemon)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        bodies = set()
        for _ in range(200):
            s.sendall(keep_alive)
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(65536)
            head, _, body = head.partition(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += s.recv(1 << 20)
            bodies.add(body)
    spent = _daemon_cpu_s(daemon) - before
    # One answer a pass: the same bytes each time (its health's uptime_s too). The
    # flood falls between two passes, yet a long run of the suite read two once.
    passes = {json.loads(body)["device"]["time"] for body in bodies}
    assert len(bodies) == len(passes) <= 2, passes
    top = json.loads(bodies.pop())
    assert len(top["targets"]) == 10 and len(json.dumps(top)) > 10 * 64 * 1000
    # 200 answers of ~700 KB: sending them is what they cost (the kernel's count in
    # 10 ms ticks: 0.07-0.08 s here; building each anew cost 0.63 s).
    assert spent < 0.25, spent
    # The next pass (a registration takes one): built anew.
    daemon.register(spawn("import time; time.sleep(60)").pid)
    assert len(daemon.call("GET", "/v1/top")[1]["targets"]) == 11


def test_what_an_answer_leaves_to_after_runs_once_it_is_written(tmp_path: Path) -> None:
    # An edge's pass ends after its answer (Response.after): the answer reaches the
    # caller while that part still waits, it runs once, before the connection's next
    # request, and also where the answer could not be written.
    release, ran = threading.Event(), []

    def application(request: Request) -> Response:
        if request.path == "/edge":
            return Response(200, {"ran": len(ran)}, after=lambda: ran.append(release.wait(10)))
        if request.path == "/large":  # more than the socket takes before it is read
            return Response(200, {"ran": len(ran), "pad": "x" * 8_000_000}, after=after_large)
        return Response(200, {"ran": len(ran)})

    def after_large() -> None:
        ran.append(True)

    path = str(tmp_path / "api.sock")
    server = UnixHttpServer(path, application, lambda pid, uid, pidfd: uid)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = Connection(path)
        assert connection.call("GET", "/edge") == (200, {"ran": 0})
        assert ran == []  # answered while its part after the answer waits
        release.set()
        assert connection.call("GET", "/next") == (200, {"ran": 1})
        connection.close()
        gone = socket.socket(socket.AF_UNIX)
        gone.connect(path)
        gone.sendall(b"GET /edge HTTP/1.1\r\nHost: x\r\n\r\n")
        gone.close()  # never reads its answer
        assert wait_for(lambda: len(ran) == 2)
        # An answer the client does not read at once: what follows it runs before the
        # wait for the reader (an edge's pass never waits on a client), and the
        # answer then reaches it whole.
        slow = socket.socket(socket.AF_UNIX)
        slow.connect(path)
        slow.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: len(ran) == 3)
        status, _, body = answers(_read_all(slow))[0]
        assert status == 200 and json.loads(body)["ran"] == 2
        assert len(body) > 8_000_000
        slow.close()
    finally:
        server.close()


def _read_all(sock: socket.socket) -> bytes:
    """One answer, by its Content-Length, or what came before the connection ended."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
    while len(body) < length and (chunk := sock.recv(1 << 20)):
        body += chunk
    return head + b"\r\n\r\n" + body
