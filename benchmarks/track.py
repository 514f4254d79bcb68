"""What ``client.track`` adds to each call, beside the same call untracked.

A 10 ms function (time.sleep) is called ``--calls`` times three ways in one run:
untracked, tracked with the daemon (each call's edges are two passes the daemon runs
at once) and tracked in-process (no daemon: the process's own sampler). The overhead
per call is the tracked call's wall time minus the untracked median; reported as
p50/p99 in ms and as the ratio of the tracked p99 to the untracked p99.

    .venv/bin/python benchmarks/track.py [--calls 300] [--interval 5] [--json out.json]

With ``--power standin`` (the default) the daemon and the in-process sampler read a
stand-in INA3221 in the kernel's sysfs layout (tests/power_standin.py) through
``EDGEWATT_SYSFS_PATH``: the power reader streams it at ``power_sample_hz`` and each
edge reads it too, as on a Jetson; ``--power none`` measures without a power source.

Budget (issues 16 and 29): at most 5 ms p99 with a daemon, 2 ms in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import percentile, start_daemon  # noqa: E402
from tests.power_standin import build_tree  # noqa: E402

CALLER = """
import json, sys, time
from edgewatt import client
calls, mode = int(sys.argv[1]), sys.argv[2]
reg = None
if mode != "untracked":
    reg = client.register(fallback="never" if mode == "daemon" else "always")
    assert reg.mode == ("daemon" if mode == "daemon" else "local"), reg.mode
tracked = client.track("step", registration=reg)
def step():
    time.sleep(0.010)
walls, cpu = [], []
for _ in range(calls):
    started = time.perf_counter()
    if reg is None:
        step()
    else:
        with tracked:
            step()
        cpu.append(tracked.last.cpu_s)
    walls.append(time.perf_counter() - started)
print(json.dumps({"walls": walls, "cpu_known": sum(c is not None for c in cpu)}))
"""


def run_caller(calls: int, mode: str, socket_path: str, power_env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CALLER, str(calls), mode],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "EDGEWATT_SOCKET": socket_path, **power_env},
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--interval", type=float, default=5.0, help="the daemon's interval (s)")
    parser.add_argument("--power", choices=("standin", "none"), default="standin")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-track-"))
    sock = str(workdir / "ew.sock")
    power_env: dict[str, str] = {}
    if args.power == "standin":
        build_tree(workdir / "sys")
        power_env = {"EDGEWATT_SYSFS_PATH": str(workdir / "sys")}
    daemon = start_daemon(
        sock,
        workdir / "state",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        str(args.interval),
        env={**os.environ, **power_env},
    )
    try:
        runs = {
            mode: run_caller(args.calls, mode, sock, power_env) for mode in ("untracked", "daemon")
        }
    finally:
        daemon.terminate()
        daemon.wait()
    runs["in-process"] = run_caller(args.calls, "in-process", str(workdir / "none.sock"), power_env)
    base = statistics.median(runs["untracked"]["walls"])
    results = {}
    for mode, run in runs.items():
        overhead = sorted((w - base) * 1000 for w in run["walls"])
        results[mode] = {
            "p50_ms": round(percentile(overhead, 0.5), 3),
            "p99_ms": round(percentile(overhead, 0.99), 3),
            "max_ms": round(overhead[-1], 3),
            "cpu_known": run["cpu_known"],
        }
    untracked_p99 = percentile(runs["untracked"]["walls"], 0.99)
    for mode in ("daemon", "in-process"):
        tracked_p99 = percentile(runs[mode]["walls"], 0.99)
        results[mode]["p99_ratio_to_untracked"] = round(tracked_p99 / untracked_p99, 3)
    print(
        f"10 ms function, {args.calls} calls each, daemon interval {args.interval:g} s, "
        f"power: {args.power}"
    )
    print(f"{'':12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99 ratio':>10}")
    for mode, r in results.items():
        ratio = r.get("p99_ratio_to_untracked", 1.0)
        print(f"{mode:12} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f} {ratio:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
