"""What the power reader costs per second at each rate, against reading the same
files the plain way (open, read, close per value), side by side in one run.

Both read the same stand-in INA3221 (tests/power_standin.py: three channels of the
hwmon layout, six value files; Jetson Nano's JetPack 4 IIO layout has three). Two
readers: the native one (core/power/_stream.c, where it was built) and the Python
thread. A reader's CPU is its own thread's clock (pthread_getcpuclockid), so nothing
else in the process counts, plus one edge a second as the passes take (the native
reader's readings are drained and integrated there); each rate runs ``--seconds``
for each reader and for the plain poller in turn.

    .venv/bin/python benchmarks/power_reader.py [--seconds 5] [--rates 10,50,100,200,500]

The rule of the automatic ``power_sample_hz`` (rate.py: the highest rate whose cost
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
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.power import ina3221, native  # noqa: E402
from edgewatt.core.power.meter import PowerMeter  # noqa: E402
from edgewatt.core.power.source import PowerOptions  # noqa: E402
from tests.power_standin import build_tree  # noqa: E402


def thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def reader_cost(options: PowerOptions, hz: float, seconds: float, reader: str) -> tuple[float, int]:
    """CPU seconds per second of the reader (``native`` or ``python``), and the readings
    it took. An edge each second, as the passes: the native reader's readings are
    drained there (that CPU is counted, the caller's thread clock around the edge), and
    the Python reader pays the same edge."""
    os.environ["EDGEWATT_NATIVE_READER"] = "1" if reader == "native" else "0"
    meter = PowerMeter([ina3221.discover(options)], max_gap_s=5.0, sample_hz=hz).start()
    assert meter.reader == reader, meter.reader

    time.sleep(0.2)
    meter.read(time.monotonic())
    cpu0, n0, edges = meter.reader_cpu_s(), meter.readings, 0.0
    for _ in range(int(seconds)):
        time.sleep(1.0)
        started = time.thread_time()
        meter.read(time.monotonic())
        edges += time.thread_time() - started
    cpu1, n1 = meter.reader_cpu_s(), meter.readings
    meter.close()
    return (cpu1 - cpu0 + edges) / int(seconds), n1 - n0 - int(seconds)


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
    readers = ["python"] + (["native"] if native.available() else [])
    print(
        f"{'rate':>6} | {'python % core':>13} | {'us/reading':>10} | {'native % core':>13} | "
        f"{'us/reading':>10} | {'plain % core':>12} | Nano % core (est.: python, native)"
    )
    for hz in (float(r) for r in args.rates.split(",")):
        row: dict[str, float] = {"hz": hz}
        for reader in readers:
            cost, n = reader_cost(options, hz, args.seconds, reader)
            row[f"{reader}_core_share"] = cost
            row[f"{reader}_us_per_reading"] = cost * int(args.seconds) / max(1, n) * 1e6
            row[f"{reader}_nano_core_share_estimate"] = cost * args.nano_factor
        plain, m = plain_cost(root, hz, args.seconds)
        row["plain_core_share"] = plain
        row["plain_us_per_reading"] = plain * args.seconds / max(1, m) * 1e6
        rows.append(row)
        nat = row.get("native_core_share", float("nan"))
        print(
            f"{hz:>6g} | {row['python_core_share']:13.3%} | "
            f"{row['python_us_per_reading']:10.1f} | {nat:13.3%} | "
            f"{row.get('native_us_per_reading', float('nan')):10.1f} | {plain:12.3%} | "
            f"{row['python_nano_core_share_estimate']:.2%}, {nat * args.nano_factor:.2%}"
        )
    for reader in readers:
        key = f"{reader}_nano_core_share_estimate"
        within = [r["hz"] for r in rows if r[key] <= args.budget]
        print(
            f"{reader}: highest rate within {args.budget:.1%} of a Nano core (est.): "
            f"{max(within, default=None)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
