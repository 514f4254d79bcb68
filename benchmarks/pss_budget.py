"""The PSS reads' budget on the whole daemon: 20 targets of 60,000 small mappings whose
memory moves at every pass, registered with a daemon at 1 s passes; for ``--seconds``
its pass's duration (``edgewatt_sampler_duration_seconds``, scraped once a second:
mean, median, max), its CPU (utime+stime of /proc/PID/stat) as cores, and at the end
each target's ``memory_pss_age_s`` where the daemon says it. This checkout, then
``--rev`` where given (an older revision, from ``git archive``), one after the other.

    .venv/bin/python benchmarks/pss_budget.py [--rev REV] [--targets 20] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import checkout, free_port, start_daemon  # noqa: E402
from benchmarks.pss_cost import MAPPED  # noqa: E402
from edgewatt.core import transport  # noqa: E402

# MAPPED's mappings, then 16 MiB touched and given back in turns every 0.3 s: its RSS
# moves by more than 2 % between most 1 s passes.
MOVER = MAPPED.replace(
    "time.sleep(3600)",
    """move = mmap.mmap(-1, 16 << 20)
address = ctypes.addressof(ctypes.c_char.from_buffer(move))
while True:
    for i in range(0, 16 << 20, page):
        move[i] = 1
    time.sleep(0.3)
    libc.madvise(ctypes.c_void_p(address), 16 << 20, 4)  # MADV_DONTNEED
    time.sleep(0.3)""",
)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(env: dict[str, str], targets: int, mappings: int, seconds: float) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        sock, port = f"{tmp}/ew.sock", free_port()
        listen = ("--listen", f"127.0.0.1:{port}", "--interval", "1")
        daemon = start_daemon(sock, Path(tmp) / "state", *listen, env=env)
        movers = [
            subprocess.Popen([sys.executable, "-c", MOVER, str(mappings)], stdout=subprocess.PIPE)
            for _ in range(targets)
        ]
        try:
            for mover in movers:
                assert mover.stdout is not None and mover.stdout.readline() == b"ready\n"
                transport.call(sock, "POST", "/v1/targets", {"pid": mover.pid}, timeout=60)
            time.sleep(5)
            passes, started, before = [], time.monotonic(), cpu_s(daemon.pid)
            while time.monotonic() - started < seconds:
                url = f"http://127.0.0.1:{port}/metrics"
                text = urllib.request.urlopen(url, timeout=60).read().decode()
                found = re.search(r"^edgewatt_sampler_duration_seconds\S* (\S+)", text, re.M)
                assert found is not None, "no pass duration in /metrics"
                passes.append(float(found.group(1)) * 1000)
                time.sleep(1)
            cores = (cpu_s(daemon.pid) - before) / (time.monotonic() - started)
            listed = transport.call(sock, "GET", "/v1/targets", timeout=60)[1]
            rows = listed if isinstance(listed, list) else listed.get("targets", [])
            ages = [r["latest"].get("memory_pss_age_s") for r in rows if r.get("latest")]
            known = sorted(a for a in ages if a is not None)
            age = f"{known[len(known) // 2]:.0f}/{known[-1]:.0f} s" if known else "-"
            return (
                f"{statistics.fmean(passes):>9.1f} {statistics.median(passes):>9.1f} "
                f"{max(passes):>9.1f} {cores:>7.3f} {age:>14}"
            )
        finally:
            for mover in movers:
                mover.kill()
                mover.wait()
            daemon.terminate()
            daemon.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="an older revision to measure after this checkout")
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--mappings", type=int, default=60000)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    print(f"{'daemon':>10} {'mean ms':>9} {'median':>9} {'max':>9} {'cores':>7} {'PSS age':>14}")
    figures = measure(dict(os.environ), args.targets, args.mappings, args.seconds)
    print(f"{'this':>10} {figures}")
    if args.rev is None:
        return
    with checkout(args.rev) as top:
        env = {**os.environ, "PYTHONPATH": str(top)}
        figures = measure(env, args.targets, args.mappings, args.seconds)
    print(f"{args.rev:>10} {figures}")


if __name__ == "__main__":
    main()
