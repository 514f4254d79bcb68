"""The daemon's RSS with N idle targets until their history rings are full, this
checkout beside an older revision (``--rev``), both running at once on the same
processes, each scraped once a second.

    .venv/bin/python benchmarks/rss_rings.py [--targets 200] [--interval 0.2] [--rev REV]

Prints each daemon's RSS with no target, right after registering the N, and every
``--every`` seconds until ``history_samples`` (300) rows at ``--interval`` have passed
and a margin more: docs/performance.md's memory figures.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import checkout, rss_bytes  # noqa: E402
from benchmarks.overhead import daemon, idle_processes  # noqa: E402

ROWS = 300  # the daemon's default history_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--rev", metavar="REV", help="also run a daemon from this git revision")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between readings")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rss-rings-")))
        trees = {"this": None}
        if args.rev:
            trees[args.rev] = stack.enter_context(checkout(args.rev))
        empty = {}
        for name, tree in trees.items():
            with daemon([], work / f"empty-{len(empty)}", args, tree) as (pid, _):
                time.sleep(2)
                empty[name] = rss_bytes(pid)
        pids = stack.enter_context(idle_processes(args.targets, f"rss-rings-{work.name}"))
        running = {
            name: stack.enter_context(daemon(pids, work / f"d-{i}", args, tree))
            for i, (name, tree) in enumerate(trees.items())
        }
        mib = 2**20
        print("no target: " + ", ".join(f"{n} {empty[n] / mib:.1f}" for n in trees) + " MiB")
        start = time.monotonic()
        full = ROWS * args.interval * 1.25 + 5
        next_read = 0.0
        while True:
            elapsed = time.monotonic() - start
            for _, url in running.values():
                urllib.request.urlopen(url, timeout=10).read()
            if elapsed >= next_read or elapsed >= full:
                line = ", ".join(f"{n} {rss_bytes(p) / mib:.1f}" for n, (p, _) in running.items())
                print(f"{elapsed:6.1f} s, {args.targets} targets: {line} MiB", flush=True)
                next_read += args.every
            if elapsed >= full:
                break
            time.sleep(1.0)


if __name__ == "__main__":
    main()
