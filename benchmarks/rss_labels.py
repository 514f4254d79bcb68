"""The daemon's RSS under the worst one person (or ``--persons`` N) can send at the
label bounds (core/labels.py): as many targets as she may run, her label bytes
spread over them, every byte a '"' (escaped to two on /metrics), her phases on them
(names of 128 bytes); then one /metrics
scrape and one GET /v1/top a pass from her uid, none of them ever read, as many as
she may hold open (16 and 32), each kept to the end. Run as root (the unit runs the
daemon so, at Nice -10): the person is uid 65534 and the next N - 1.

    sudo .venv/bin/python benchmarks/rss_labels.py [--persons 1] [--label-bytes B] [--phases N]

Prints the daemon's RSS (VmRSS) and its peak (VmHWM) at each step, the /metrics
answer's size, and the figures of docs/reference.md's "Shares per person".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import free_port, start_daemon  # noqa: E402
from edgewatt.core.labels import MAX_PERSON_LABEL_BYTES  # noqa: E402
from edgewatt.core.targets.history import MAX_PERSON_PHASES  # noqa: E402
from edgewatt.exporter.scrape_server import MAX_PER_PEER  # noqa: E402
from edgewatt.exporter.unix_http import MAX_CONNECTIONS_PER_PERSON  # noqa: E402

FIRST_UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # the person's: this one's virtual environment is root's
PER_PERSON = 100  # max_targets_per_uid's default

# One person's part, run as her: her targets (sleep processes), registered with her
# share of label bytes, and her phases; then, once told (a line on stdin), once a pass
# a /metrics scrape and a GET /v1/top that she never reads, held open until stdin closes.
PERSON = """
import json, socket, subprocess, sys, time
from edgewatt.core import transport
sock, port, count, label_bytes, interval, scrapes, tops, phases = sys.argv[1:9]
count, scrapes, tops, interval = int(count), int(scrapes), int(tops), float(interval)
phases = int(phases)
each = int(label_bytes) // count - 8  # a name of up to 8 bytes
children, refused, ids = [], 0, []
try:
    for n in range(count):
        child = subprocess.Popen(["sleep", "3600"])
        children.append(child)
        body = {"pid": child.pid, "labels": {f"p{n}": '"' * each}}
        status, body = transport.call(sock, "POST", "/v1/targets", body, timeout=60)
        refused += status != 201
        if status == 201:
            ids.append(body["id"])
    for n in range(phases):  # her phases, the names as long as they may be
        path = f"/v1/targets/{ids[n % len(ids)]}/phase"
        transport.call(sock, "POST", path, {"name": f"{n:05d}".ljust(128, "x")}, timeout=60)
except BaseException:
    for child in children:
        child.kill()
    raise
print(json.dumps({"refused": refused}), flush=True)
sys.stdin.readline()  # the daemon's RSS is read before her first scrape
held = []
for n in range(max(scrapes, tops)):
    if n < scrapes:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", int(port)))
        s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        held.append(s)
    if n < tops:
        u = socket.socket(socket.AF_UNIX)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        u.connect(sock)
        u.sendall(b"GET /v1/top HTTP/1.1\\r\\n\\r\\n")
        held.append(u)
    time.sleep(interval)
print(json.dumps({"held": len(held)}), flush=True)
sys.stdin.read()
for child in children:
    child.kill()
"""


def status(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of ``pid``, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def public_package(into: Path) -> None:
    """This checkout as the package ``into/edgewatt``, readable by every user."""
    for folder in ("core", "client", "exporter", "cli"):
        shutil.copytree(ROOT / folder, into / "edgewatt" / folder)
    for p in [into, *into.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1)
    parser.add_argument("--interval", type=float, default=1.0, help="the daemon's, seconds")
    parser.add_argument(
        "--label-bytes", type=int, default=MAX_PERSON_LABEL_BYTES, help="each person's, in all"
    )
    parser.add_argument("--phases", type=int, default=MAX_PERSON_PHASES, help="each person's")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the person's processes run as other uids")
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rss-labels-")))
        work.chmod(0o755)
        public_package(work / "pkg")
        sock, port = str(work / "edgewatt.sock"), free_port()
        flags = ("--listen", f"127.0.0.1:{port}", "--interval", str(args.interval))
        daemon = start_daemon(sock, work / "state", *flags, nice=-10)
        stack.callback(daemon.wait, 10)
        stack.callback(daemon.send_signal, signal.SIGTERM)
        os.chmod(sock, 0o666)
        time.sleep(2)
        print(f"no target: RSS {status(daemon.pid)[0]:.1f} MiB", flush=True)
        persons = []
        for n in range(args.persons):
            uid = FIRST_UID + n
            counts = (PER_PERSON, args.label_bytes, args.interval, MAX_PER_PEER)
            argv = [sock, str(port), *map(str, counts), str(MAX_CONNECTIONS_PER_PERSON)]
            argv.append(str(args.phases))
            process = subprocess.Popen(
                [SYSTEM_PYTHON, "-c", PERSON, *argv], user=uid, group=uid, cwd="/",
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(work / "pkg")},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            stack.callback(process.communicate, "", 30)
            persons.append(process)
        refused = sum(json.loads(p.stdout.readline())["refused"] for p in persons)  # type: ignore[union-attr]
        time.sleep(3 * args.interval)
        rss, peak = status(daemon.pid)
        size = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read())
        targets = args.persons * PER_PERSON - refused
        print(f"{targets} targets ({refused} refused): RSS {rss:.1f} MiB, peak {peak:.1f} MiB, "
              f"/metrics {size / 2**20:.2f} MiB", flush=True)  # fmt: skip
        for p in persons:
            p.stdin.write("\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        for p in persons:
            json.loads(p.stdout.readline())  # type: ignore[union-attr]
        time.sleep(3 * args.interval)
        rss, peak = status(daemon.pid)
        held = args.persons * (MAX_PER_PEER + MAX_CONNECTIONS_PER_PERSON)
        print(f"{held} answers never read, one a pass: RSS {rss:.1f} MiB, peak {peak:.1f} MiB")


if __name__ == "__main__":
    main()
