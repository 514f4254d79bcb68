"""RSS of the daemon across register/exit cycles: /metrics alone, and with OTLP push.

Three daemons run side by side on the same processes: the default one (Prometheus
endpoint only, rendered from the snapshot, no OTel SDK state), one that also pushes
OTLP every second to a local receiver with `series_rotation` N (`--rotation`, by
default the daemon's default), and one that pushes with rotation disabled (the plain
OTel SDK behaviour, which keeps every attribute set it has seen). Each cycle is one
short-lived process registered with all three, sampled, scraped and killed.

    .venv/bin/python benchmarks/churn.py [--cycles 5000] [--batch 100] [--rotation N]
                                         [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import free_port, rss_bytes, start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402
from edgewatt.exporter.config import Config  # noqa: E402


class Daemon:
    def __init__(
        self, workdir: Path, name: str, interval: float, otlp: str | None, rotation: int
    ) -> None:
        self.socket = str(workdir / f"{name}.sock")
        self.port = free_port()
        env = {**os.environ, "EDGEWATT_SERIES_ROTATION": str(rotation)}
        push = ["--otlp-endpoint", otlp] if otlp else []
        env["EDGEWATT_OTLP_INTERVAL"] = "1"  # seconds: the SDK collects every second
        self.proc = start_daemon(
            self.socket, workdir / name, "--listen", f"127.0.0.1:{self.port}",
            "--interval", str(interval), *push, env=env, timeout=15,
        )  # fmt: skip

    def register(self, pid: int, i: int) -> None:
        body = {"pid": pid, "labels": {"run": f"churn-{i}"}}
        status, data = transport.call(self.socket, "POST", "/v1/targets", body, timeout=5)
        assert status == 201, data

    def scrape(self) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            r.read()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)


class _Discard(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def otlp_sink() -> ThreadingHTTPServer:
    """An OTLP/HTTP receiver, serving in a thread, that accepts every export and keeps
    nothing; its endpoint is ``http://127.0.0.1:{server.server_address[1]}``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument(
        "--rotation", type=int, default=Config().series_rotation, help="the rotating daemon's"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-churn-"))
    receiver = otlp_sink()
    otlp = f"http://127.0.0.1:{receiver.server_address[1]}"
    daemons = {
        "/metrics only (default)": Daemon(
            workdir, "default", args.interval, None, Config().series_rotation
        ),
        f"+ OTLP, rotation {args.rotation}": Daemon(
            workdir, "rotating", args.interval, otlp, args.rotation
        ),
        "+ OTLP, no rotation": Daemon(workdir, "plain", args.interval, otlp, 10**6),
    }
    rows: list[dict[str, float]] = []
    started = time.monotonic()
    try:
        done = 0
        while done < args.cycles:
            procs = [
                subprocess.Popen(["sleep", "60"])
                for _ in range(min(args.batch, args.cycles - done))
            ]
            for i, p in enumerate(procs):
                for d in daemons.values():
                    d.register(p.pid, done + i)
            time.sleep(args.interval * 2.5)  # sampled at least twice
            for d in daemons.values():
                d.scrape()
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            time.sleep(args.interval * 2.5)  # exits noticed
            for d in daemons.values():
                d.scrape()
            done += len(procs)
            if done % 1000 == 0 or done == args.cycles:
                row = {"cycles": done}
                row.update({name: rss_bytes(d.proc.pid) / 2**20 for name, d in daemons.items()})
                rows.append(row)
                print(
                    f"{done:6d} cycles  " + "  ".join(f"{n}: {row[n]:6.1f} MiB" for n in daemons),
                    flush=True,
                )
    finally:
        for d in daemons.values():
            d.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    names = list(daemons)
    first, last = rows[0], rows[-1]
    growth = {n: last[n] - first[n] for n in names}
    print()
    print(f"RSS growth from {first['cycles']} to {last['cycles']} cycles (MiB):")
    for n in names:
        print(f"  {n:26s} {growth[n]:+7.1f}")
    if growth[names[2]] > 0:
        print(f"  ratio rotation/no rotation {growth[names[1]] / growth[names[2]]:7.2f}")
    print(f"  wall time {time.monotonic() - started:.0f} s")
    receiver.shutdown()
    if args.json:
        result = {"rows": rows, "growth_mib": growth}
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
