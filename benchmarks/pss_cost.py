"""What reading a process's PSS costs beside the stat read every pass already makes.

For each size (default 100 MiB and 1 GiB), a child allocates and touches that much
memory; then, alternately, ``--reads`` reads of its /proc/PID/stat through a kept fd
(what the sampler does each pass) and of its /proc/PID/smaps_rollup (open, read,
close: what core/sampling/pss.py does), timed by this process's CPU clock. Prints
each median in microseconds and their ratio.

    .venv/bin/python benchmarks/pss_cost.py [--sizes-mib 100,1024] [--reads 200]

``--mapped N``: the dearest reads one user can make instead. N processes with
60,000 small mappings each (every other page of a region made read-only: the kernel
cannot merge them), their RSS summed moving by 5 % every pass (due every pass), through
ProportionalMemory for ``--passes`` passes: each pass's CPU with the budget
(pss.PASS_BUDGET_S) and without (every due target read), and the oldest figure's age in passes.

    .venv/bin/python benchmarks/pss_cost.py --mapped 20 [--mappings 60000] [--passes 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any
from unittest import mock

from edgewatt.core.facts.procfs import ProcHandle
from edgewatt.core.sampling import pss
from edgewatt.core.sampling.contributors import UNCHANGED, Figures
from edgewatt.core.sampling.pss import ProportionalMemory, read_rollup

HOLDER = """
import sys, time
n = int(sys.argv[1]) << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i] = 1
print("ready", flush=True)
time.sleep(3600)
"""


# Every other page read-only: N mappings the kernel cannot merge into one.
MAPPED = """
import ctypes, mmap, sys, time
n = int(sys.argv[1])
libc = ctypes.CDLL(None)
page = mmap.PAGESIZE
region = mmap.mmap(-1, n * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
for i in range(0, n, 2):
    region[i * page] = 1
    libc.mprotect(ctypes.c_void_p(base + i * page), page, 1)
print("ready", flush=True)
time.sleep(3600)
"""


def mapped_holders(count: int, mappings: int) -> list[subprocess.Popen]:
    """``count`` processes with ``mappings`` mappings each, ready."""
    holders = [
        subprocess.Popen([sys.executable, "-c", MAPPED, str(mappings)], stdout=subprocess.PIPE)
        for _ in range(count)
    ]
    for holder in holders:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    return holders


def latest(given: dict[str, Mapping[str, Any]], figures: Figures) -> dict[str, Mapping[str, Any]]:
    """Each target's figures after a pass that handed out ``figures``: as handed out,
    or (UNCHANGED) as last given, which ``given`` keeps, as the sampler does."""
    for target_id, fields in figures.items():
        if fields is not UNCHANGED:
            given[target_id] = fields
    return {target_id: given[target_id] for target_id in figures}


def moving_passes(pids: list[int], passes: int) -> tuple[list[float], int, float]:
    """Each pass's CPU seconds in ProportionalMemory.contribute, every target's RSS
    moved by 5 % since the last pass; the reads made; the oldest figure's age (passes)
    at the end."""
    memory = ProportionalMemory()
    times, oldest, given = [], 0.0, {}
    for n in range(passes):
        states = [
            SimpleNamespace(
                target=SimpleNamespace(id=str(pid)),
                reading=SimpleNamespace(
                    pids=(pid,), rss_bytes=100 << 20 if n % 2 else 105 << 20, time=float(n)
                ),
            )
            for pid in pids
        ]
        started = time.thread_time()
        figures = memory.contribute(states)
        times.append(time.thread_time() - started)
        now = latest(given, figures).values()
        oldest = max(n - f["memory_pss_read_at"] for f in now)
    return times, memory.reads, oldest


def main_mapped(count: int, mappings: int, passes: int) -> None:
    holders = mapped_holders(count, mappings)
    try:
        one = _timed(lambda: read_rollup(holders[0].pid), 20)
        print(
            f"{count} processes, {mappings} mappings each: "
            f"one read {statistics.median(one) / 1000:.1f} ms CPU"
        )
        print(f"{'':>16} {'pass mean ms':>13} {'max ms':>8} {'reads':>6} {'oldest (passes)':>16}")
        for name, budget in (("without budget", float("inf")), ("with budget", pss.PASS_BUDGET_S)):
            spacing = pss.TARGET_BUDGET_S if budget != float("inf") else float("inf")
            with mock.patch.object(pss, "PASS_BUDGET_S", budget), mock.patch.object(
                pss, "TARGET_BUDGET_S", spacing
            ):
                times, reads, oldest = moving_passes([h.pid for h in holders], passes)
            times = times[1:]  # the first pass reads every target once, budget or not
            print(
                f"{name:>16} {statistics.fmean(times) * 1000:>13.1f} {max(times) * 1000:>8.1f} "
                f"{reads:>6} {oldest:>16.0f}"
            )
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


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
    parser.add_argument("--mapped", type=int, default=0)
    parser.add_argument("--mappings", type=int, default=60000)
    parser.add_argument("--passes", type=int, default=60)
    args = parser.parse_args()
    if args.mapped:
        main_mapped(args.mapped, args.mappings, args.passes)
        return
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
