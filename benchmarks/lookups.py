"""What a flood of failing name lookups costs the daemon, and what the per-user bound on them saves.

One normal user (``nobody``), ``--connections`` (4) connections at once, each
registering names that resolve to nothing as fast as the daemon answers, for
``--duration`` seconds per kind: containers (the daemon runs `podman inspect` as
root) and units (`systemctl show`, then a walk of the whole cgroup tree). Per kind:
the daemon's CPU, its children's included (utime+stime+cutime+cstime of
/proc/PID/stat), as cores; the requests answered; and the answers by status.

Needs root (to start the daemon as root and act as ``nobody``) and podman.

    sudo .venv/bin/python benchmarks/lookups.py [--duration 10] [--connections 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import free_port, start_daemon  # noqa: E402

NOBODY = 65534
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # nobody's
FLOOD = """
import collections, json, sys, threading, time
from edgewatt.core import transport
sock, kind, seconds, connections = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
statuses = collections.Counter()
lock = threading.Lock()

def flood(n):
    until, i = time.monotonic() + seconds, 0
    while time.monotonic() < until:
        i += 1
        name = f"nosuch-{n}-{i}"
        body = {"container": name, "runtime": "podman"} if kind == "container" else {"unit": name}
        try:
            status = transport.call(sock, "POST", "/v1/targets", body, timeout=30)[0]
        except OSError:
            status = "error"
        with lock:
            statuses[str(status)] += 1

threads = [threading.Thread(target=flood, args=(n,)) for n in range(connections)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(statuses))
"""


def cpu_seconds(pid: int) -> float:
    """The process's CPU time and its reaped children's."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    public = Path(tempfile.mkdtemp(prefix="edgewatt-bench-"))
    public.chmod(0o755)
    for folder in ("core", "client", "exporter", "cli"):
        shutil.copytree(ROOT / folder, public / "edgewatt" / folder)
    for p in public.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    sock = str(public / "ew.sock")
    listen = f"127.0.0.1:{free_port()}"
    daemon = start_daemon(sock, public / "state", "--interval", "1", "--listen", listen)
    rows = {}
    try:
        for kind in ("container", "unit"):
            before, started = cpu_seconds(daemon.pid), time.monotonic()
            done = subprocess.run(
                [PYTHON, "-c", FLOOD, sock, kind, str(args.duration), str(args.connections)],
                user=NOBODY, group=NOBODY, cwd="/", capture_output=True, text=True, check=True,
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public)},
            )  # fmt: skip
            elapsed = time.monotonic() - started
            used = cpu_seconds(daemon.pid) - before
            statuses = collections.Counter(json.loads(done.stdout))
            rows[kind] = {
                "cores": round(used / elapsed, 3),
                "cpu_s": round(used, 2),
                "seconds": round(elapsed, 2),
                "requests": sum(statuses.values()),
                "statuses": dict(statuses),
            }
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(public, ignore_errors=True)
    print(f"{'kind':<10} {'cores':>6} {'CPU s':>7} {'s':>6} {'requests':>9}  statuses")
    for kind, row in rows.items():
        print(f"{kind:<10} {row['cores']:>6} {row['cpu_s']:>7} {row['seconds']:>6} "
              f"{row['requests']:>9}  {row['statuses']}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
