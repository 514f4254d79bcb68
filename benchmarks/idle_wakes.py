"""What one idle target costs, per daemon thread: an older revision beside this checkout.

Two daemons run at once, side by side on the same machine over the same seconds (a
shared VM's speed drifts from minute to minute; both see the same drift): one from
``--rev`` (a git revision, unpacked into a temporary directory) and one from this
checkout, each with one idle process registered, sampling every ``--interval`` and
scraped every ``--scrape`` seconds (0: never, as a Nano user without Prometheus).
Per thread (told apart by their kernel names, which the daemon sets), over
``--duration`` seconds after a settling time:

- CPU in ms per second: the kernel's run time of the thread (/proc/PID/task/TID/
  schedstat, in ns, so a thread costing 0.1 ms/s is not lost in 10 ms ticks);
- wake-ups per second: its voluntary context switches (/proc/PID/task/TID/status),
  each one a block that something later ended.

    .venv/bin/python benchmarks/idle_wakes.py [--rev main] [--duration 60]
        [--interval 1] [--scrape 1] [--json out.json]

The revision must name the daemon's threads (compat.name_thread) for its rows to be
split; its unnamed threads are summed as "python".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import (  # noqa: E402
    Counters,
    checkout,
    free_port,
    start_daemon,
    thread_counters,
)
from edgewatt.core import transport  # noqa: E402

SETTLE_S = 5.0  # after registration: the first passes and scrapes build caches


def process_cpu_s(pid: int) -> float:
    """utime + stime of the whole process, ended threads included (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def one_target_daemon(
    workdir: Path, interval: float, pythonpath: Path | None
) -> Iterator[tuple[int, str]]:
    """A daemon with one idle process registered: its pid and /metrics URL."""
    workdir.mkdir()
    sock, port = str(workdir / "edgewatt.sock"), free_port()
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    target = subprocess.Popen(["sleep", "100000"])
    proc = start_daemon(
        sock,
        workdir / "state",
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        str(interval),
        env=env,
    )
    try:
        status, data = transport.call(sock, "POST", "/v1/targets", {"pid": target.pid})
        if status != 201:
            raise RuntimeError(f"registering: {status} {data}")
        yield proc.pid, f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        target.kill()
        target.wait()


def scrape(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as r:
        r.read()


def measure(pids: dict[str, int], urls: list[str], args: argparse.Namespace) -> dict:
    """Both daemons' counters over ``--duration``, scraping meanwhile."""
    before = {name: thread_counters(pid) for name, pid in pids.items()}
    cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    started = time.monotonic()
    tick = started
    while time.monotonic() - started < args.duration:
        if args.scrape > 0:
            for url in urls:
                scrape(url)
            tick += args.scrape
        else:
            tick = started + args.duration
        time.sleep(max(0.0, min(tick, started + args.duration) - time.monotonic()))
    seconds = time.monotonic() - started
    result: dict = {"seconds": round(seconds, 1)}
    for name, pid in pids.items():
        after = thread_counters(pid)
        threads = {}
        for thread, end in sorted(after.items()):
            start = before[name].get(thread, Counters(0, 0, 0))
            threads[thread] = {
                "cpu_ms_per_s": round((end.run_ns - start.run_ns) / 1e6 / seconds, 3),
                "wakes_per_s": round((end.voluntary - start.voluntary) / seconds, 2),
                "preempted_per_s": round((end.involuntary - start.involuntary) / seconds, 2),
            }
        result[name] = {
            "threads": threads,
            "cpu_ms_per_s": round(sum(t["cpu_ms_per_s"] for t in threads.values()), 3),
            "process_cpu_ms_per_s": round(
                (process_cpu_s(pid) - cpu_before[name]) * 1000 / seconds, 3
            ),
            "wakes_per_s": round(sum(t["wakes_per_s"] for t in threads.values()), 2),
        }
    return result


def print_result(result: dict, old: str) -> None:
    threads = sorted(set(result[old]["threads"]) | set(result["this"]["threads"]))
    print(f"over {result['seconds']} s: CPU ms per second / wake-ups per second")
    print(f"{'thread':16s} {old + ' ms/s':>14s} {'this ms/s':>10s} {'wakes/s':>9s} {'wakes/s':>9s}")
    for thread in [*threads, "total"]:
        rows = []
        for name in (old, "this"):
            row = result[name] if thread == "total" else result[name]["threads"].get(thread, {})
            rows.append((row.get("cpu_ms_per_s", 0.0), row.get("wakes_per_s", 0.0)))
        (a_cpu, a_wakes), (b_cpu, b_wakes) = rows
        print(f"{thread:16s} {a_cpu:14.3f} {b_cpu:10.3f} {a_wakes:9.2f} {b_wakes:9.2f}")
    print(
        f"whole process (ticks): {result[old]['process_cpu_ms_per_s']:.2f} and "
        f"{result['this']['process_cpu_ms_per_s']:.2f} ms/s"
    )
    print(f"CPU ratio this/{old}: {result['ratio']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="main", help="the revision to compare with")
    parser.add_argument("--duration", type=float, default=60, help="seconds measured")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    parser.add_argument(
        "--scrape", type=float, default=1.0, help="seconds between scrapes (0: none)"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-wakes-"))
    try:
        with contextlib.ExitStack() as stack:
            old_tree = stack.enter_context(checkout(args.rev))
            old_pid, old_url = stack.enter_context(
                one_target_daemon(workdir / "old", args.interval, old_tree)
            )
            pid, url = stack.enter_context(one_target_daemon(workdir / "this", args.interval, None))
            time.sleep(SETTLE_S)
            result = measure({args.rev: old_pid, "this": pid}, [old_url, url], args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    old_cpu = result[args.rev]["cpu_ms_per_s"]
    result["ratio"] = round(result["this"]["cpu_ms_per_s"] / old_cpu, 3) if old_cpu else None
    result.update(rev=args.rev, interval_s=args.interval, scrape_s=args.scrape)
    print_result(result, args.rev)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
