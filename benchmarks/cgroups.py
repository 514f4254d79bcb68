"""Cgroup targets: what 20 of them cost with 2,000 short connections per second, and
what each way of counting sees.

Twenty cgroups (v2), each holding one worker that opens a connection to a server
outside them, sends 1,000 bytes and closes, 100 times a second (2,000 connections a
second in all). Side by side in one run, in turns of ``--window`` seconds:

- none: no daemon (the workers' own CPU, the baseline);
- process: the daemon with the 20 workers registered as process targets (sock_diag:
  connections that open and close between passes are not seen);
- cgroup: the daemon with the 20 cgroups registered (nftables counters in the kernel);
- ebpf: no daemon, an eBPF cgroup_skb program per cgroup and direction counting the
  same IP bytes (benchmarks/ebpf_counter.py): the alternative the issue asks to
  measure. Its per-packet cost lands in the workers' CPU, as the rules' does.

Per turn: the daemon's CPU (from /proc/PID/stat) as % of one core, the workers' CPU
(their cgroups' cpu.stat: the rules' per-packet cost lands there), and the bytes the
daemon reports against what the server received.

Needs root, cgroup v2 and nftables.

    sudo .venv/bin/python benchmarks/cgroups.py [--targets 20] [--rate 100] [--window 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ebpf_counter import CgroupCounter  # noqa: E402
from benchmarks.measure import free_port, start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402
from edgewatt.core.facts import cgroups  # noqa: E402

WORKER = """
import socket, sys, time
port, rate = int(sys.argv[1]), float(sys.argv[2])
payload = b"w" * 1000
next_at = time.monotonic()
while True:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(payload)
    s.close()
    next_at += 1 / rate
    time.sleep(max(0.0, next_at - time.monotonic()))
"""


class Server:
    """Counts every byte it receives: one thread, many short connections at once."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.received = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is self.listener:
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = self.listener.accept()
                        conn.setblocking(False)
                        self._selector.register(conn, selectors.EVENT_READ)
                    continue
                conn = key.fileobj
                try:
                    chunk = conn.recv(65536)
                except BlockingIOError:
                    continue
                self.received += len(chunk)
                if not chunk:
                    self._selector.unregister(conn)
                    conn.close()


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cgroup_cpu(directories: list[Path]) -> float:
    total = 0.0
    for d in directories:
        user, system = cgroups.parse_cpu_stat((d / "cpu.stat").read_text())
        total += user + system
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100.0, help="connections/s per worker")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per turn")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    where = cgroups.mounts()
    if os.geteuid() != 0 or where.v2 is None or shutil.which("nft") is None:
        print("needs root, cgroup v2 and nftables", file=sys.stderr)
        return 2
    server = Server()
    base = Path(where.v2) / f"edgewatt-bench-{os.getpid()}"
    base.mkdir()
    directories, workers = [], []
    work = Path(tempfile.mkdtemp(prefix="edgewatt-bench-"))
    try:
        for n in range(args.targets):
            d = base / f"w{n}"
            d.mkdir()
            directories.append(d)

            def join(procs: str = str(d / "cgroup.procs")) -> None:
                with open(procs, "w") as f:
                    f.write("0")

            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(server.port), str(args.rate)],
                    preexec_fn=join,
                )
            )
        time.sleep(2)
        rows = [
            turn("none", None, directories, server, args, work),
            turn("process", "pid", directories, server, args, work, workers),
            turn("cgroup", "cgroup", directories, server, args, work),
            ebpf_turn(directories, server, args),
        ]
    finally:
        for w in workers:
            w.kill()
            w.wait()
        for d in directories:
            while d.exists():
                try:
                    d.rmdir()
                except OSError:
                    time.sleep(0.05)
        base.rmdir()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.targets} targets, {args.targets * args.rate:.0f} connections/s of 1,000 B")
    print(f"{'daemon':8} {'daemon % core':>14} {'workers % core':>15} {'bytes seen':>11}")
    for row in rows:
        seen = "-" if row["seen_share"] is None else f"{row['seen_share']:.4f}"
        print(f"{row['mode']:8} {row['daemon_pct']:>14.2f} {row['workers_pct']:>15.2f} {seen:>11}")
    base_workers = rows[0]["workers_pct"]
    print(
        f"cgroup/process daemon CPU ratio: {rows[2]['daemon_pct'] / rows[1]['daemon_pct']:.2f}; "
        f"workers' CPU with the rules: {rows[2]['workers_pct'] / base_workers:.3f} x baseline, "
        f"with eBPF: {rows[3]['workers_pct'] / base_workers:.3f} x baseline"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def turn(
    mode: str,
    register: str | None,
    directories: list[Path],
    server: Server,
    args: argparse.Namespace,
    work: Path,
    workers: list[subprocess.Popen] | None = None,
) -> dict:
    daemon = None
    ids = []
    sock = str(work / f"{mode}.sock")
    if register is not None:
        daemon = start_daemon(
            sock, work / f"state-{mode}", "--listen", f"127.0.0.1:{free_port()}",
            "--interval", str(args.interval),
        )  # fmt: skip
        for n, d in enumerate(directories):
            body = (
                {"cgroup": "/" + str(d.relative_to(cgroups.mounts().v2 or "/"))}
                if register == "cgroup"
                else {"pid": workers[n].pid}  # type: ignore[index]
            )
            ids.append(transport.call_ok(sock, "POST", "/v1/targets", body)["id"])
        time.sleep(args.interval * 2)  # past the registrations' own passes
    before_server = server.received
    before_workers = cgroup_cpu(directories)
    before_daemon = cpu_s(daemon.pid) if daemon else 0.0
    before_seen = sum(_sent(sock, i) for i in ids)
    started = time.monotonic()
    time.sleep(args.window)
    elapsed = time.monotonic() - started
    seen = sum(_sent(sock, i) for i in ids)
    row = {
        "mode": mode,
        "daemon_pct": (cpu_s(daemon.pid) - before_daemon) / elapsed * 100 if daemon else 0.0,
        "workers_pct": (cgroup_cpu(directories) - before_workers) / elapsed * 100,
        "server_bytes": server.received - before_server,
        "seen_bytes": seen - before_seen if ids else None,
    }
    # IP bytes (cgroup) include headers: the share is of the payload the server got.
    row["seen_share"] = row["seen_bytes"] / row["server_bytes"] if ids else None
    if daemon is not None:
        daemon.terminate()
        daemon.wait()
    return row


def ebpf_turn(directories: list[Path], server: Server, args: argparse.Namespace) -> dict:
    counters = [CgroupCounter(str(d)) for d in directories]
    try:
        time.sleep(args.interval * 2)  # as the daemon turns wait past their registrations
        before_server = server.received
        before_workers = cgroup_cpu(directories)
        before_seen = sum(c.read()[0] for c in counters)
        started = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - started
        seen = sum(c.read()[0] for c in counters) - before_seen
        row = {
            "mode": "ebpf",
            "daemon_pct": 0.0,  # no daemon: reading 40 maps a window costs nothing measurable
            "workers_pct": (cgroup_cpu(directories) - before_workers) / elapsed * 100,
            "server_bytes": server.received - before_server,
            "seen_bytes": seen,
        }
        row["seen_share"] = seen / row["server_bytes"]
        return row
    finally:
        for counter in counters:
            counter.close()


def _sent(sock: str, target_id: str) -> int:
    summary = transport.call_ok(sock, "GET", f"/v1/targets/{target_id}/summary")
    return summary.get("network_transmit_bytes") or 0


if __name__ == "__main__":
    raise SystemExit(main())
