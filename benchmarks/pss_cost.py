"""What reading a process's PSS costs beside the stat read every pass already makes
(issue 41, item 4).

For each size (default 100 MiB and 1 GiB), a child allocates and touches that much
memory; then, alternately, ``--reads`` reads of its /proc/PID/stat through a kept fd
(what the sampler does each pass) and of its /proc/PID/smaps_rollup (open, read,
close: what core/sampling/pss.py does), timed by this process's CPU clock. Prints
each median in microseconds and their ratio.

    .venv/bin/python benchmarks/pss_cost.py [--sizes-mib 100,1024] [--reads 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from edgewatt.core.sampling.procfs import ProcHandle
from edgewatt.core.sampling.pss import read_rollup

HOLDER = """
import sys, time
n = int(sys.argv[1]) << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i] = 1
print("ready", flush=True)
time.sleep(3600)
"""


def _timed(read, reads: int) -> list[float]:
    times = []
    for _ in range(reads):
        start = time.thread_time_ns()
        read()
        times.append((time.thread_time_ns() - start) / 1000)
    return times


def measure(mib: int, reads: int) -> tuple[float, float, int]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(mib)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        handle = ProcHandle(holder.pid)
        rollup = read_rollup(holder.pid)
        assert rollup is not None, "smaps_rollup unreadable"
        stat_us: list[float] = []
        rollup_us: list[float] = []
        for _ in range(5):  # interleaved: a busy neighbour hurts both alike
            stat_us += _timed(handle.stat, reads // 5)
            rollup_us += _timed(lambda: read_rollup(holder.pid), reads // 5)
        handle.close()
        return statistics.median(stat_us), statistics.median(rollup_us), rollup.rss
    finally:
        holder.kill()
        holder.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", default="100,1024")
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    print(f"{'process':>10} {'RSS':>10} {'stat us':>9} {'smaps_rollup us':>16} {'ratio':>7}")
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        stat_us, rollup_us, rss = measure(mib, args.reads)
        print(
            f"{mib:>6} MiB {rss / 2**20:>6.0f} MiB {stat_us:>9.1f} {rollup_us:>16.1f} "
            f"{rollup_us / stat_us:>7.0f}"
        )
    print(f"(CPU time of this process, median of {args.reads} reads each, pid {os.getpid()})")


if __name__ == "__main__":
    main()
