"""What one Raspberry Pi 5 PMIC reading costs when vcgencmd is spawned for it, as the
pi5 source reads it (core/power/pi5.py: posix_spawn, the output read, wait4): the
reading thread's CPU plus the child's (its rusage), and the wall time, per reading.

Three executables, the same output (tests/fixtures/pi5/zeus-load.txt):
- ``cat``: /bin/cat, run in a folder holding a file named ``pmic_read_adc``, so
  ``cat pmic_read_adc`` prints the capture: a small C program's fork, exec and exit,
  about what vcgencmd's own are (it is a small C program too); the firmware's part
  (~23 ms of wall time on a Pi 5, Zeus's measurement) is not here;
- ``stand-in``: tests/bin/vcgencmd, the Python stand-in the tests use;
- ``parse``: no spawn, the parse alone: what remains of a reading where the mailbox
  ioctl (/dev/vcio, IOCTL_MBOX_PROPERTY) replaces the spawn, plus one ioctl.

The rate each cost allows within the power reader's budget (0.5 % of one core) is
printed beside it.

    .venv/bin/python benchmarks/pi5_spawn.py [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.power.pi5 import RATES_HZ, parse_output, read_once  # noqa: E402
from edgewatt.core.power.rate import auto_rate  # noqa: E402
from edgewatt.core.power.source import AUTO_BUDGET  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "pi5" / "zeus-load.txt"
STAND_IN = ROOT / "tests" / "bin" / "vcgencmd"


def spawned(path: str, repeat: int) -> dict[str, float]:
    costs, walls = [], []
    stop = threading.Event()
    for _ in range(repeat):
        start = time.monotonic()
        _, cost = read_once(path, stop)
        walls.append(time.monotonic() - start)
        costs.append(cost)
    return {"cpu_ms": statistics.median(costs) * 1e3, "wall_ms": statistics.median(walls) * 1e3}


def parsed(repeat: int) -> dict[str, float]:
    text = CAPTURE.read_text()
    start = time.thread_time()
    for _ in range(repeat):
        parse_output(text)
    cost = (time.thread_time() - start) / repeat
    return {"cpu_ms": cost * 1e3, "wall_ms": cost * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    cat = shutil.which("cat")
    assert cat is not None
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(CAPTURE, Path(folder) / "pmic_read_adc")
        here = os.getcwd()
        os.chdir(folder)  # cat's argument is the file there
        try:
            results["cat"] = spawned(cat, args.repeat)
        finally:
            os.chdir(here)
    results["stand-in"] = spawned(str(STAND_IN), max(1, args.repeat // 10))
    results["parse"] = parsed(args.repeat * 10)
    for name, figures in results.items():
        figures["rate_hz"] = auto_rate(figures["cpu_ms"] / 1e3, AUTO_BUDGET, RATES_HZ)
        print(
            f"{name:>9}: {figures['cpu_ms']:8.3f} ms of CPU a reading, "
            f"{figures['wall_ms']:8.3f} ms wall; within {AUTO_BUDGET * 100:g} % of one "
            f"core: {figures['rate_hz']:g} Hz"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
