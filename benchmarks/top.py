"""What `edgewatt top` costs: its own CPU at a refresh, and what it adds to the daemon.

A daemon reading the stand-in tegrastats (the AGX Thor line) with ``--targets`` idle
registered processes, each in a phase; alternate windows of ``--seconds`` without and
with `edgewatt top --interval 1` drawing in a detached 80x24 tmux pane. CPU from
/proc/PID/stat (all threads), as % of one core.

    .venv/bin/python benchmarks/top.py [--seconds 30] [--turns 2] [--targets 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.exits import cpu_seconds  # noqa: E402
from benchmarks.measure import free_port, start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402

SLEEPER = "import time\nwhile True: time.sleep(1)"


def window(daemon: int, top: int | None, seconds: float) -> tuple[float, float | None]:
    """(daemon %, top %) of one core over ``seconds``."""
    d0, t0, w0 = cpu_seconds(daemon), cpu_seconds(top) if top else 0.0, time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - w0
    d = (cpu_seconds(daemon) - d0) / wall * 100
    return d, None if top is None else (cpu_seconds(top) - t0) / wall * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--targets", type=int, default=4)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgewatt-top-bench-"))
    sock = str(work / "s.sock")
    env = {
        **os.environ,
        "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
        "EDGEWATT_POWER_SOURCES": "tegrastats",
    }
    daemon = start_daemon(
        sock, work / "state", "--listen", f"127.0.0.1:{free_port()}",
        "--tegrastats", str(ROOT / "tests" / "bin" / "tegrastats"), env=env,
    )  # fmt: skip
    sleepers = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(args.targets)]
    session = f"edgewatt-top-bench-{os.getpid()}"
    without: list[float] = []
    with_top: list[float] = []
    top_cpu: list[float] = []
    try:
        for i, p in enumerate(sleepers):
            target = transport.call_ok(sock, "POST", "/v1/targets", {"pid": p.pid})["id"]
            transport.call_ok(sock, "POST", f"/v1/targets/{target}/phase", {"name": f"r{i}"})
        time.sleep(2)
        for _ in range(args.turns):
            without.append(window(daemon.pid, None, args.seconds)[0])
            command = f"exec {sys.executable} -m edgewatt.cli top --socket {sock} --interval 1"
            subprocess.run(
                ["tmux", "new-session", "-d", "-x", "80", "-y", "24", "-s", session, command],
                check=True, cwd=ROOT,
            )  # fmt: skip
            pane = subprocess.run(
                ["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            time.sleep(2)  # past the interpreter's start
            d, t = window(daemon.pid, int(pane[0]), args.seconds)
            with_top.append(d)
            top_cpu.append(t or 0.0)
            subprocess.run(["tmux", "kill-session", "-t", session], check=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        for p in sleepers:
            p.kill()
            p.wait()
        daemon.terminate()
        daemon.wait()
    result = {
        "seconds": args.seconds,
        "turns": args.turns,
        "targets": args.targets,
        "top_cpu_pct_of_core": [round(x, 3) for x in top_cpu],
        "daemon_cpu_pct_without_top": [round(x, 3) for x in without],
        "daemon_cpu_pct_with_top": [round(x, 3) for x in with_top],
        "daemon_added_pct_median": round(
            statistics.median(with_top) - statistics.median(without), 3
        ),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
