"""What the client costs a training process: import time and register() round trip.

Side by side in one run:
- ``from edgewatt import client`` against ``import psutil`` (what heflwr.monitor imports
  first), both measured as a fresh interpreter's extra wall time over ``python -c pass``;
- ``client.register()`` + ``close()`` against a bare ``GET /healthz`` on the same
  daemon socket (the floor any request pays).

    .venv/bin/python benchmarks/client_costs.py [--runs 30] [--calls 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import percentile, start_daemon  # noqa: E402
from edgewatt import client  # noqa: E402
from edgewatt.core import transport  # noqa: E402


def import_cost_ms(statement: str, runs: int) -> float:
    """Median extra wall time of a fresh interpreter running ``statement``."""

    def wall(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        return time.perf_counter() - started

    base = statistics.median(wall("pass") for _ in range(runs))
    return (statistics.median(wall(statement) for _ in range(runs)) - base) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    results: dict[str, float] = {}
    results["import_client_ms"] = import_cost_ms("from edgewatt import client", args.runs)
    results["import_psutil_ms"] = import_cost_ms("import psutil", args.runs)

    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-bench-"))
    sock = str(workdir / "ew.sock")
    daemon = start_daemon(sock, workdir / "state", "--listen", "127.0.0.1:0")
    try:
        register_ms, health_ms = [], []
        for _ in range(args.calls):
            started = time.perf_counter()
            reg = client.register(socket=sock, fallback="never")
            register_ms.append((time.perf_counter() - started) * 1000)
            reg.close()
            started = time.perf_counter()
            transport.call(sock, "GET", "/healthz")
            health_ms.append((time.perf_counter() - started) * 1000)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    results["register_p50_ms"] = statistics.median(register_ms)
    results["register_p99_ms"] = percentile(register_ms, 0.99)
    results["healthz_p50_ms"] = statistics.median(health_ms)
    results["healthz_p99_ms"] = percentile(health_ms, 0.99)

    print(f"{'':28s}{'edgewatt':>10s}{'alternative':>13s}{'ratio':>8s}")
    rows = [
        ("import (ms, median)", "import_client_ms", "import_psutil_ms"),
        ("register() p50 (ms)", "register_p50_ms", "healthz_p50_ms"),
        ("register() p99 (ms)", "register_p99_ms", "healthz_p99_ms"),
    ]
    for label, mine, other in rows:
        ratio = results[mine] / results[other] if results[other] > 0 else float("nan")
        print(f"{label:28s}{results[mine]:10.2f}{results[other]:13.2f}{ratio:8.2f}")
    print("alternatives: import psutil; GET /healthz on the same socket")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
