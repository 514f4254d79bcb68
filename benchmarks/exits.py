"""What listening to every exit and every TCP close on the host costs the daemon.

Two daemons run side by side in one run, both with one registered target (a sleeping
process that holds a TCP connection), one with ``exact_exits: true`` (the default:
taskstats and TCP destroy listeners) and one with ``exact_exits: false``. A load
generator meanwhile makes ``--exits`` unrelated process exits and ``--connections``
unrelated loopback TCP connections per second, none of them the daemons' business.
The cost is the difference in the daemons' CPU time over the window, as a share of
one core.

    sudo .venv/bin/python benchmarks/exits.py [--seconds 20] [--exits 1000] [--connections 2000]

Budget: within 1 % of one core. Needs root (taskstats needs CAP_NET_ADMIN).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


HOLDER = """
import socket, sys, time
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
time.sleep(3600)
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def exits(rate: int, stop: threading.Event, count: list[int]) -> None:
    """``rate`` short-lived processes a second: /bin/true, spawned (vfork) and reaped."""
    period = 1.0 / rate
    deadline = time.monotonic()
    true = "/bin/true"
    while not stop.is_set():
        pid = os.posix_spawn(true, [true], {})
        os.waitpid(pid, 0)
        count[0] += 1
        deadline += period
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def connections(rate: int, stop: threading.Event, count: list[int]) -> None:
    """``rate`` loopback TCP connections a second: connect, send a byte, close."""
    server = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = server.getsockname()[1]

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    period = 1.0 / rate
    deadline = time.monotonic()
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"x")
        count[0] += 1
        deadline += period
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--exits", type=int, default=1000, help="process exits per second")
    parser.add_argument("--connections", type=int, default=2000, help="TCP connections per second")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: taskstats needs CAP_NET_ADMIN")

    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-exits-"))
    # The target holds a TCP connection: the destroy listener must listen (it leaves
    # the multicast groups while no target holds a socket).
    held = socket.create_server(("127.0.0.1", 0))
    sleeper = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held.getsockname()[1])], stdout=subprocess.PIPE
    )
    assert sleeper.stdout is not None and sleeper.stdout.readline() == b"connected\n"
    daemons = {}
    for name, exact in (("with listeners", "true"), ("without", "false")):
        config = workdir / f"{exact}.yaml"
        config.write_text(f"exact_exits: {exact}\n")
        sock = str(workdir / f"{exact}.sock")
        daemons[name] = (
            start_daemon(sock, workdir / f"state-{exact}", "--listen", "127.0.0.1:0",
                         "--config", str(config)),
            sock,
        )  # fmt: skip
        status, body = transport.call(sock, "POST", "/v1/targets", {"pid": sleeper.pid})
        assert status == 201, body
    try:
        health = transport.call_ok(daemons["with listeners"][1], "GET", "/healthz")
        time.sleep(1.5)  # a pass has seen the target's connection
        assert health["exit_figures"] == "exact", health
        time.sleep(2.0)  # both settled
        stop = threading.Event()
        made = {"exits": [0], "connections": [0]}
        load = [
            threading.Thread(target=exits, args=(args.exits, stop, made["exits"])),
            threading.Thread(
                target=connections, args=(args.connections, stop, made["connections"])
            ),
        ]
        before = {n: cpu_seconds(d.pid) for n, (d, _) in daemons.items()}
        started = time.monotonic()
        for t in load:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in load:
            t.join()
        window = time.monotonic() - started
        after = {n: cpu_seconds(d.pid) for n, (d, _) in daemons.items()}
    finally:
        for d, _ in daemons.values():
            d.terminate()
            d.wait()
        sleeper.kill()
        held.close()
    used = {n: after[n] - before[n] for n in daemons}
    extra = (used["with listeners"] - used["without"]) / window * 100
    results = {
        "window_s": round(window, 2),
        "exits_per_s": round(made["exits"][0] / window),
        "connections_per_s": round(made["connections"][0] / window),
        "daemon_cpu_s": {n: round(v, 3) for n, v in used.items()},
        "listeners_cost_percent_of_one_core": round(extra, 2),
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
