"""What the first in-process registration costs its caller with a push power source.

No daemon: ``client.register(fallback="always")`` starts the process's own sampler and
its power source, the stand-in tegrastats at 1 Hz (``tests/bin/tegrastats``, its board
input a constant 5 W). Each run is a fresh interpreter (the client's imports done
before the clock starts); the call is timed by the wall clock, side by side with the
meter's start waiting for the source's first line as it did (``--waited``:
PowerMeter.start at FIRST_LINE_WAIT_S), with the first line printed at once and a
period after the start (``FAKE_TEGRASTATS_FIRST_LATE``, as a sensor a period away):

    .venv/bin/python benchmarks/first_registration.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, time
from edgewatt import client
from edgewatt.client import _local  # noqa: F401 - imported before the clock starts
from edgewatt.core.sampling import sampler  # noqa: F401
from edgewatt.core.power import meter
if sys.argv[1] == "waited":  # the meter's start as it was: the first line waited for
    start = meter.PowerMeter.start
    meter.PowerMeter.start = lambda self, first_line_wait_s=0: start(self, meter.FIRST_LINE_WAIT_S)
began = time.monotonic()
reg = client.register(fallback="always")
took = time.monotonic() - began
assert reg.mode == "local"
print(took)
reg.close()
"""


def one(kind: str, late: bool, work: Path) -> float:
    """Seconds the first registration took in a fresh interpreter."""
    current = work / "curr1_input"
    current.write_text("1000\n")  # 5 V x 1000 mA
    (work / "sys").mkdir(exist_ok=True)  # no other power source
    env = {
        **os.environ,
        "EDGEWATT_SOCKET": str(work / "none.sock"),
        "EDGEWATT_SYSFS_PATH": str(work / "sys"),
        "EDGEWATT_TEGRASTATS": str(ROOT / "tests" / "bin" / "tegrastats"),
        "EDGEWATT_POWER_SAMPLE_HZ": "1",
        "FAKE_TEGRASTATS_POWER_FILE": str(current),
    }
    if late:
        env["FAKE_TEGRASTATS_FIRST_LATE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh interpreters per case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgewatt-first-") as tmp:
        work = Path(tmp)
        for late in (False, True):
            when = "a period after its start" if late else "at once"
            medians = {}
            for kind in ("now", "waited"):
                times = [one(kind, late, work) for _ in range(args.runs)]
                medians[kind] = statistics.median(times)
                print(
                    f"first line {when}, {kind:6}: median {medians[kind] * 1000:7.1f} ms, "
                    f"max {max(times) * 1000:7.1f} ms ({args.runs} runs)"
                )
            print(f"  waited / now: {medians['waited'] / medians['now']:.1f}x")


if __name__ == "__main__":
    main()
