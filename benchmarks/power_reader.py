"""What the power reader costs per second at each rate, against reading the same
files the plain way (open, read, close per value), side by side in one run.

Both read the same stand-in INA3221 (tests/power_standin.py: three channels of the
hwmon layout, six value files; Jetson Nano's JetPack 4 IIO layout has three). The
reader's CPU is its own thread's clock (pthread_getcpuclockid), so nothing else in
the process counts; each rate runs ``--seconds`` for the reader and for the plain
poller in turn.

    .venv/bin/python benchmarks/power_reader.py [--seconds 5] [--rates 10,50,100,200,500]

The rule of the automatic ``power_sample_hz`` (meter.py: the highest rate whose cost
stays within 0.5 % of one core, measured by the reader on the device itself) is
checked against these figures, and against them scaled to a Jetson Nano core
(``--nano-factor``: a Cortex-A57 at 1.43 GHz does about a fifth of this VM's Xeon
core's single-thread work, Geekbench 5 single-core ~230 against ~1100). Almost all
of a reading's cost is the thread's wake (about 25 us of kernel time per wake on this
VM even for C's nanosleep); the reading itself (two preads, the trace) is about 2 us.
On the stand-in the files are tmpfs, not the driver: a real read also runs the
hwmon driver's show() (an I2C register read that sleeps rather than spins).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.power import ina3221  # noqa: E402
from edgewatt.core.power.meter import PowerMeter  # noqa: E402
from edgewatt.core.power.source import PowerOptions  # noqa: E402
from tests.power_standin import build_tree  # noqa: E402


def thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def reader_cost(options: PowerOptions, hz: float, seconds: float) -> tuple[float, int]:
    """CPU seconds per second of the reader's thread, and the readings it took."""
    meter = PowerMeter([ina3221.discover(options)], max_gap_s=5.0, sample_hz=hz).start()
    thread = meter._thread
    assert thread is not None
    time.sleep(0.2)
    cpu0, n0 = thread_cpu_s(thread), meter.readings
    time.sleep(seconds)
    cpu1, n1 = thread_cpu_s(thread), meter.readings
    meter.close()
    return (cpu1 - cpu0) / seconds, n1 - n0


def plain_cost(root: Path, hz: float, seconds: float) -> tuple[float, int]:
    """The same files read at the same rate with open/read/close each time."""
    files = sorted(str(p) for p in root.glob("class/hwmon/hwmon*/*_input"))
    stop = threading.Event()
    count = [0]

    def poll() -> None:
        deadline = time.monotonic()
        while not stop.is_set():
            values = []
            for path in files:
                with open(path) as f:
                    values.append(int(f.read()))
            count[0] += 1
            deadline += 1 / hz
            stop.wait(max(0.0, deadline - time.monotonic()))

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.2)
    cpu0, n0 = thread_cpu_s(thread), count[0]
    time.sleep(seconds)
    cpu1, n1 = thread_cpu_s(thread), count[0]
    stop.set()
    thread.join()
    return (cpu1 - cpu0) / seconds, n1 - n0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rates", default="10,20,25,40,50,100,200")
    parser.add_argument("--nano-factor", type=float, default=5.0)
    parser.add_argument("--budget", type=float, default=0.005, help="share of one core")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="edgewatt-reader-"))
    build_tree(root)
    options = PowerOptions(sysfs_path=str(root))
    rows = []
    print(
        f"{'rate':>6} | {'reader % core':>13} | {'us/reading':>10} | {'plain % core':>12} | "
        f"{'ratio':>5} | Nano % core (est.)"
    )
    for hz in (float(r) for r in args.rates.split(",")):
        cost, n = reader_cost(options, hz, args.seconds)
        plain, m = plain_cost(root, hz, args.seconds)
        row = {
            "hz": hz,
            "reader_core_share": cost,
            "reader_us_per_reading": cost * args.seconds / max(1, n) * 1e6,
            "plain_core_share": plain,
            "plain_us_per_reading": plain * args.seconds / max(1, m) * 1e6,
            "nano_core_share_estimate": cost * args.nano_factor,
        }
        rows.append(row)
        print(
            f"{hz:>6g} | {cost:13.3%} | {row['reader_us_per_reading']:10.1f} | "
            f"{plain:12.3%} | {cost / plain if plain else float('nan'):5.2f} | "
            f"{row['nano_core_share_estimate']:.2%}"
        )
    within = [r["hz"] for r in rows if r["nano_core_share_estimate"] <= args.budget]
    print(
        f"highest rate within {args.budget:.1%} of a Nano core (est.): {max(within, default=None)}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
