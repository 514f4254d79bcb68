"""What the Flower mod's round edges cost a ClientApp: one fresh process a round, as
Flower runs its ClientApps, beside the same with a revision before (``--rev``).

The benchmark is the SuperNode's stand-in: it registers itself with its children, then
starts one process a round. That process imports the mod (client/flower.py, on a
stand-in of the few ``flwr.app`` types it touches, as tests/test_edges_flower.py does:
the mod's own calls are what is timed, not Flower's) and times the round's two edges:
its start (``_Window``: finding the daemon, the SuperNode's target that holds the
process, and the phase's start on it) and its end (the phase's end, whose answer holds
the round's figures). ``--others N`` registers N idle ``sleep`` targets beside it: a
round's start reads only the targets that may hold its process, whatever N is.

    .venv/bin/python benchmarks/flower_round.py [--rounds 100] [--others 0,20]
        [--sources none,tegrastats-1] [--rev REV]

Budget (issue: edges never wait): an edge at most 1 ms p99 on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import percentile, start_daemon  # noqa: E402
from benchmarks.track import builds_of, source_env, with_path  # noqa: E402
from edgewatt import client  # noqa: E402

ROUND = """
import json, sys, time, types
app = types.ModuleType("flwr.app")
for name in ("ConfigRecord", "Context", "Message", "RecordDict"):
    setattr(app, name, type(name, (), {}))
sys.modules["flwr"] = types.ModuleType("flwr")
sys.modules["flwr.app"] = app
from edgewatt.client import flower
metadata = types.SimpleNamespace(message_type="train", group_id="1")
message = types.SimpleNamespace(metadata=metadata, has_content=lambda: False)
started = time.perf_counter()
window = flower._Window(message)
entered = time.perf_counter()
time.sleep(0.010)
leaving = time.perf_counter()
ended = window.registration.end_phase(window.depth)
left = time.perf_counter()
assert window.attached and ended is not None, (window.attached, ended)
print(json.dumps({"start": entered - started, "end": left - leaving}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--others", default="0,20", help="idle targets beside, a list")
    parser.add_argument("--sources", default="none,tegrastats-1", help="as track.py's")
    parser.add_argument("--rev", help="a git revision measured beside this checkout")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    with builds_of(args.rev) as builds:
        results = measure(args, builds)
    print(
        f"{args.rounds} rounds each, one process a round, {os.cpu_count()} cores; "
        "each edge p50 / p99 in ms"
    )
    print(f"{'source':14} {'others':>6} {'build':14} {'start p50':>10} {'p99':>7} "
          f"{'end p50':>8} {'p99':>7}")  # fmt: skip
    for (source, others, build), r in results.items():
        print(
            f"{source:14} {others:6d} {'this' + build:14} {r['start_p50_ms']:10.2f} "
            f"{r['start_p99_ms']:7.2f} {r['end_p50_ms']:8.2f} {r['end_p99_ms']:7.2f}"
        )
    if args.json:
        rows = [{"source": s, "others": n, "build": b, **r} for (s, n, b), r in results.items()]
        Path(args.json).write_text(json.dumps(rows, indent=1))


def measure(
    args: argparse.Namespace, builds: dict[str, Path | None]
) -> dict[tuple[str, int, str], dict[str, float]]:
    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-rounds-"))
    results = {}
    for source in args.sources.split(","):
        power_env = source_env(source, workdir)
        for others in [int(n) for n in args.others.split(",")]:
            sleepers = [detached(["sleep", "3600"]) for _ in range(others)]
            try:
                for build, first in builds.items():
                    sock = f"{workdir}/{source}-{others}{build.strip()}.sock"
                    env = with_path({**os.environ, **power_env}, first)
                    daemon = start_daemon(
                        sock, workdir / f"state-{source}-{others}{build.strip()}",
                        "--listen", "127.0.0.1:0", env=env,
                    )  # fmt: skip
                    try:
                        held = [client.register(pid=pid, socket=sock) for pid in sleepers]
                        supernode = client.register(socket=sock, fallback="never")
                        timed = rounds(args.rounds, {**env, "EDGEWATT_SOCKET": sock})
                        supernode.close()
                        held.clear()
                    finally:
                        daemon.terminate()
                        daemon.wait()
                    results[(source, others, build)] = {
                        f"{edge}_{q}_ms": round(percentile(timed[edge], p) * 1e3, 3)
                        for edge in ("start", "end")
                        for q, p in (("p50", 0.5), ("p99", 0.99))
                    }
            finally:
                for pid in sleepers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    return results


def detached(argv: list[str]) -> int:
    """The pid of ``argv`` started by a shell that exits at once: not this process's
    descendant (its tree is the SuperNode's, which the others are not part of)."""
    started = subprocess.run(
        ["sh", "-c", 'exec "$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *argv],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(started.stdout)


def rounds(count: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each round's start and end edge (s), one process a round."""
    timed: dict[str, list[float]] = {"start": [], "end": []}
    for _ in range(count):
        out = subprocess.run(
            [sys.executable, "-c", ROUND], capture_output=True, text=True, env=env, check=True
        )
        edges = json.loads(out.stdout)
        timed["start"].append(edges["start"])
        timed["end"].append(edges["end"])
    return timed


if __name__ == "__main__":
    main()
