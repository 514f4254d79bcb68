"""The daemon's memory while InfluxDB is unreachable, with the largest labels a user may
register: is the queue's byte bound (``influx_buffer_bytes``) what holds its RSS?

A daemon from this checkout pushes to a closed loopback port every second; ``--targets``
sleeping processes are registered, each with 64 labels of 1,000 bytes (a line then
carries some 64 kB of tags). Every 2 s for ``--seconds`` it prints the queue's bytes
(from /healthz) and the daemon's RSS; at the end the peak RSS beside the bound.

    .venv/bin/python benchmarks/influx_outage.py [--targets 10] [--seconds 40]
        [--buffer-bytes 67108864]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import free_port, rss_bytes, start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--buffer-bytes", type=int, default=64 * MIB)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"influx_url: http://127.0.0.1:{free_port()}\n"  # nothing listens there
            "influx_database: edgewatt\ninflux_interval: 1\n"
            f"influx_buffer_bytes: {args.buffer_bytes}\n"
        )
        sock = f"{tmp}/ew.sock"
        daemon = start_daemon(sock, Path(tmp) / "state", "--config", str(config),
                              "--listen", f"127.0.0.1:{free_port()}")  # fmt: skip
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(args.targets)]
        try:
            for n, sleeper in enumerate(sleepers):
                labels = {f"l{i:02d}": f"{n}{i:02d}".ljust(1000, "x") for i in range(64)}
                status, body = transport.call(
                    sock, "POST", "/v1/targets", {"pid": sleeper.pid, "labels": labels}
                )
                assert status == 201, (status, body)
            peak = 0
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                time.sleep(2)
                influx = transport.call(sock, "GET", "/healthz")[1]["influx"]
                rss = rss_bytes(daemon.pid)
                peak = max(peak, rss)
                print(
                    f"queued {influx['queued_bytes'] / MIB:7.1f} MiB of "
                    f"{influx['buffer_bytes'] / MIB:.0f} MiB, dropped "
                    f"{influx['dropped_bytes'] / MIB:7.1f} MiB, daemon RSS {rss / MIB:6.1f} MiB"
                )
            print(
                f"peak RSS {peak / MIB:.1f} MiB with a {args.buffer_bytes / MIB:.0f} MiB "
                f"queue bound, {args.targets} targets of 64 x 1,000-byte labels"
            )
        finally:
            for sleeper in sleepers:
                sleeper.kill()
            daemon.terminate()
            daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
