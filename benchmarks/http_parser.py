"""The daemon's own HTTP/1.1 request parser beside h11's, for the requests its API
gets: the CPU one request's head and body cost to parse, and the memory each parser
adds to a process that imports it: a well-kept HTTP/1.1 library (h11) would be
used rather than our own unless measured memory and CPU say otherwise.

Both parse the same bytes in the same process, alternating in rounds (a shared VM's
speed drifts; both see the same drift); CPU is the process's own (time.process_time).
Memory is VmRSS after the parser's import less before it (the edgewatt package and
the standard modules the daemon has anyway imported first), in a fresh interpreter.

    .venv/bin/pip install h11 && .venv/bin/python benchmarks/http_parser.py [--rounds 5]

h11 is not one of edgewatt's dependencies: it is installed for this benchmark only.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# What the API gets most: the client's registration and a phase (POST with a JSON
# body), `edgewatt top`'s refresh (GET), each as the client sends it.
BODY = json.dumps({"pid": 4242, "labels": {"run": "fl-client-3", "round": "12"}}).encode()
REQUESTS = [
    b"POST /v1/targets HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
    b"POST /v1/targets/0123456789ab/phase HTTP/1.1\r\nHost: localhost\r\n"
    b'Content-Type: application/json\r\nContent-Length: 17\r\n\r\n{"name": "train"}',
    b"GET /v1/top HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n",
]


def ours(data: bytes) -> bytes:
    """The daemon's path: its head reader, then the body by Content-Length."""
    from edgewatt.exporter.unix_http import read_head

    rfile = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    head = read_head(rfile)
    assert head is not None
    length = head.content_length() or 0
    return rfile.read(length)


def theirs(data: bytes) -> bytes:
    """h11's: a server connection fed the bytes, its events until the message ends."""
    import h11

    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return body
        elif event is h11.NEED_DATA:
            raise AssertionError("a whole request was not parsed")


def cpu_us(parse: object, count: int) -> float:
    """CPU microseconds per request, over ``count`` of each kind."""
    started = time.process_time()
    for _ in range(count):
        for request in REQUESTS:
            parse(request)  # type: ignore[operator]
    return (time.process_time() - started) / (count * len(REQUESTS)) * 1e6


IMPORT_RSS = """
import sys
sys.path.insert(0, {root!r})
def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
import dataclasses, io, json, re, socket, socketserver, threading  # the daemon has them
import edgewatt.exporter  # the package, not the parser
before = rss()
import {module}
print(rss() - before)
"""


def import_kib(module: str) -> int:
    code = IMPORT_RSS.format(root=str(ROOT), module=module)
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=5000, help="requests of each kind a round")
    args = parser.parse_args()
    for request in REQUESTS:  # the same answer from both, before anything is timed
        assert ours(request) == theirs(request)
    rows = []
    for _ in range(args.rounds):
        rows.append((cpu_us(ours, args.count), cpu_us(theirs, args.count)))
    own = sorted(r[0] for r in rows)[len(rows) // 2]
    h11s = sorted(r[1] for r in rows)[len(rows) // 2]
    own_kib = import_kib("edgewatt.exporter.http_head")
    h11_kib = import_kib("h11")
    print(f"CPU per request, median of {args.rounds} rounds of {args.count} x 3 requests:")
    print(f"  edgewatt's parser  {own:7.1f} us")
    print(f"  h11                {h11s:7.1f} us   (h11 / ours: {h11s / own:.2f})")
    print("memory added by the import (VmRSS, fresh interpreter):")
    print(f"  edgewatt.exporter.http_head  {own_kib:5d} KiB")
    print(f"  h11                          {h11_kib:5d} KiB")


if __name__ == "__main__":
    main()
