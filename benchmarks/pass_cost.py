"""What one sampling pass and one /metrics render cost, in process, per target.

The daemon's own parts (``Daemon``: its sampler, its renderer, its collectors), driven
in this process without its threads: N idle processes (``sleep``) registered, or
(``--busy``) one process with 8 threads talking over a TCP connection; then a pass and
a render (plain and gzip) every ``--sleep`` seconds, each timed by this thread's CPU
clock. ``--profile PATH`` writes a cProfile of the measured passes. Run it from two
checkouts (``PYTHONPATH`` at an unpacked older revision) for a side-by-side figure:

    .venv/bin/python benchmarks/pass_cost.py [--targets 200] [--passes 20] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import rss_bytes  # noqa: E402
from benchmarks.overhead import BUSY  # noqa: E402
from edgewatt.exporter import config as configuration  # noqa: E402
from edgewatt.exporter.daemon import Daemon  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=200, help="idle processes")
    parser.add_argument("--busy", action="store_true", help="one busy process instead")
    parser.add_argument("--passes", type=int, default=20, help="passes measured")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds between passes")
    parser.add_argument("--profile", metavar="PATH", help="cProfile of the measured passes")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="edgewatt-pass-")
    if args.busy:
        procs = [subprocess.Popen([sys.executable, "-c", BUSY])]
    else:
        procs = [subprocess.Popen(["sleep", "100000"]) for _ in range(args.targets)]
    try:
        config = configuration.build(
            None,
            {},
            {"socket": f"{work}/s.sock", "state_dir": f"{work}/state", "listen": "127.0.0.1:0"},
        )
        daemon = Daemon(config)
        for proc in procs:
            daemon.table.register(proc.pid, {"run": f"bench-{proc.pid}"}, True, 0)
        sampler, exposition = daemon.sampler, daemon.exposition

        def one() -> tuple[float, float]:
            started = time.thread_time()
            sampler.sample_once()  # hands the snapshot to the renderer (on_pass)
            sampled = time.thread_time()
            exposition.render()
            exposition._current(gzipped=True)  # the gzip form, as Prometheus asks it
            return sampled - started, time.thread_time() - sampled

        for _ in range(5):  # caches built, utilization known
            one()
            time.sleep(args.sleep)
        profile = cProfile.Profile() if args.profile else None
        times = []
        for _ in range(args.passes):
            if profile is not None:
                profile.enable()
            times.append(one())
            if profile is not None:
                profile.disable()
            time.sleep(args.sleep)
        if profile is not None:
            profile.dump_stats(args.profile)
        passes = sorted(t[0] * 1000 for t in times)
        renders = sorted(t[1] * 1000 for t in times)
        n = max(1, len(procs))
        print(
            f"{'1 busy' if args.busy else len(procs)} targets: pass min {passes[0]:.2f} ms "
            f"(median {passes[len(passes) // 2]:.2f}, {passes[0] * 1000 / n:.1f} us a target), "
            f"render+gzip min {renders[0]:.2f} ms (median {renders[len(renders) // 2]:.2f}), "
            f"RSS {rss_bytes(os.getpid()) / 2**20:.1f} MiB"
        )
        daemon.sampler.close()
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
