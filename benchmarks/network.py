"""Per-process TCP accounting: cost with 10,000 unrelated connections on the host, and
what short connections lose.

Side by side in one run: edgewatt's accounting pass for one target holding a few
connections (fd listing + exact sock_diag lookups), against the same kernel interface
used the way a naive exporter would (one full dump of every TCP socket, all entries
decoded), both with 10,000 established loopback connections held by another process.
Then: the share of bytes counted for connections that live half an interval.

    .venv/bin/python benchmarks/network.py [--unrelated 10000] [--passes 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.facts.network import NetworkAccounting  # noqa: E402
from edgewatt.core.kernel.sockets import SockDiag  # noqa: E402

# Two processes hold the two ends of the unrelated connections (one process could not
# hold 20,000 descriptors under a 20,000 limit).
ACCEPTOR = """
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4096)
print(srv.getsockname()[1], flush=True)
keep = [srv.accept()[0] for _ in range(n)]
print("ready", flush=True)
time.sleep(600)
"""

CONNECTOR = """
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
keep = [socket.create_connection(("127.0.0.1", int(sys.argv[2]))) for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
time.sleep(600)
"""


def cpu_ms(fn, passes: int) -> float:
    """Median CPU time (user+system, this process) of one call, in ms."""
    times = []
    for _ in range(passes):
        before = resource.getrusage(resource.RUSAGE_SELF)
        fn()
        after = resource.getrusage(resource.RUSAGE_SELF)
        times.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return statistics.median(times)


def short_connection_share(interval: float, hold: float, count: int) -> float:
    """Bytes counted / bytes sent for connections that each live ``hold`` seconds."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)

    def drain() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(
                target=lambda c=conn: [None for _ in iter(lambda: c.recv(65536), b"")], daemon=True
            ).start()

    threading.Thread(target=drain, daemon=True).start()
    code = (
        "import socket, sys, time\n"
        f"for _ in range({count}):\n"
        f"    c = socket.create_connection(('127.0.0.1', {srv.getsockname()[1]}))\n"
        "    c.sendall(b'z' * 100000)\n"
        f"    time.sleep({hold})\n"
        "    c.close()\n"
    )
    sender = subprocess.Popen([sys.executable, "-c", code])
    accounting = NetworkAccounting()
    total = (0, 0)
    while sender.poll() is None:
        total = accounting.sample({"s": (sender.pid,)})["s"] or total
        time.sleep(interval)
    accounting.close()
    srv.close()
    return total[0] / (count * 100000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unrelated", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    acceptor = subprocess.Popen(
        [sys.executable, "-c", ACCEPTOR, str(args.unrelated)], stdout=subprocess.PIPE, text=True
    )
    assert acceptor.stdout is not None
    port = acceptor.stdout.readline().strip()
    connector = subprocess.Popen(
        [sys.executable, "-c", CONNECTOR, str(args.unrelated), port],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert connector.stdout is not None and connector.stdout.readline() == "ready\n"
    assert acceptor.stdout.readline() == "ready\n"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    mine = [socket.create_connection(listener.getsockname()) for _ in range(4)]
    accounting = NetworkAccounting()
    diag = SockDiag()
    try:
        accounting.sample({"me": (os.getpid(),)})  # the first pass dumps once
        edgewatt_ms = cpu_ms(lambda: accounting.sample({"me": (os.getpid(),)}), args.passes)
        naive_ms = cpu_ms(lambda: diag.dump(None), max(5, args.passes // 5))
        host_sockets = len(diag.dump(None))
    finally:
        for holder in (acceptor, connector):
            holder.kill()
            holder.wait()
        for c in mine:
            c.close()
        listener.close()
        accounting.close()
        diag.close()

    shares = [short_connection_share(0.2, 0.1, 20) for _ in range(3)]
    results = {
        "host_tcp_sockets": host_sockets,
        "edgewatt_pass_cpu_ms": edgewatt_ms,
        "full_dump_cpu_ms": naive_ms,
        "ratio": edgewatt_ms / naive_ms,
        "short_connection_counted_share": shares,
    }
    print(f"host TCP sockets: {host_sockets}")
    print(f"{'':36s}{'CPU ms/pass':>12s}")
    print(f"{'edgewatt (4 target sockets)':36s}{edgewatt_ms:12.3f}")
    print(f"{'full dump, every entry decoded':36s}{naive_ms:12.3f}")
    print(f"{'ratio':36s}{edgewatt_ms / naive_ms:12.4f}")
    print("connections living half an interval (0.1 s at 0.2 s), bytes counted: "
          + ", ".join(f"{s:.0%}" for s in shares))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
