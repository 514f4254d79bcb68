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
        [--parts cost,lag] [--lag-rates 50,100] [--lag-seconds 10]

The lag part: how late each reading is, its time (taken once the files are read)
against when it was due on the reader's schedule, as the reader itself records it
(reader.StreamReader.lateness), idle and then with one busy loop per core (a Python
``while True: pass`` process each, at the same nice level as the reader), for each
reader at each of ``--lag-rates``. A reading due while an earlier one was still late
is skipped, never read in a burst: "taken" says how many of the readings due came.

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
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import percentile  # noqa: E402
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


def reader_lag(options: PowerOptions, hz: float, seconds: float, reader: str) -> dict:
    """How late each reading was (s) over ``seconds``, with an edge a second as the
    passes take (the native reader's drains); how the reader ran ahead (native: its
    thread's priority), and the readings due in the time measured."""
    os.environ["EDGEWATT_NATIVE_READER"] = "1" if reader == "native" else "0"
    meter = PowerMeter([ina3221.discover(options)], max_gap_s=5.0, sample_hz=hz).start()
    assert meter.reader == reader, meter.reader
    time.sleep(0.2)
    meter.read(time.monotonic())
    meter.reader_lateness()  # the start's
    started, late = time.monotonic(), []
    for _ in range(int(seconds)):
        time.sleep(1.0)
        meter.read(time.monotonic())
        late += meter.reader_lateness()
    due = (time.monotonic() - started) * hz
    ahead = meter.reader_ahead()
    meter.close()
    return {"late": late, "due": due, "ahead": ahead}


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes, each a busy loop (one per core)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # running before the reader starts
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


# The readers measured for lag, each in a process of its own: the Python one, and the
# native one without CAP_SYS_NICE (as the systemd unit runs it, or a user's process:
# the priority of its process) and with it (as root: SCHED_FIFO).
LAG_CONFIGS = (
    ("python", "python", False),
    ("native", "native, no CAP_SYS_NICE", True),
    ("native", "native, CAP_SYS_NICE", False),
)


def lag_in_child(root: Path, reader: str, hz: float, seconds: float, drop: bool) -> dict:
    """reader_lag in a child process, CAP_SYS_NICE dropped from it where ``drop``."""
    command = [sys.executable, __file__, "--lag-child", f"{reader},{hz},{seconds},{root}"]
    if drop:
        command = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", *command]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def lag_rows(root: Path, rates: list[float], seconds: float) -> list[dict]:
    """The lag of each reader at each rate, idle and with every core busy."""
    cores = os.cpu_count() or 1
    configs = [c for c in LAG_CONFIGS if c[0] == "python" or native.available()]
    if os.geteuid() != 0 or shutil.which("setpriv") is None:  # as this user runs it
        configs = [(r, r, False) for r in dict.fromkeys(c[0] for c in configs)]
    rows = []
    print(
        f"\nlag: a reading's time against when it was due, {seconds:g} s each, "
        f"idle and with {cores} busy loops ({cores} cores)"
    )
    print(
        f"{'reader':>24} | {'ran at':>8} | {'rate':>5} | {'load':>4} | {'taken':>11} | "
        f"{'p50 ms':>6} | {'p99 ms':>6} | {'max ms':>6} | later than a period"
    )
    for load in ("idle", "busy"):
        with busy_cores(cores) if load == "busy" else contextlib.nullcontext():
            for hz in rates:
                for reader, label, drop in configs:
                    got = lag_in_child(root, reader, hz, seconds, drop)
                    late = sorted(got["late"])
                    over = sum(x > 1 / hz for x in late)
                    row = {
                        "reader": label,
                        "ran_at": got["ahead"] or "process",
                        "hz": hz,
                        "load": load,
                        "taken": len(late),
                        "due": round(got["due"]),
                        "p50_ms": percentile(late, 0.5) * 1e3,
                        "p99_ms": percentile(late, 0.99) * 1e3,
                        "max_ms": late[-1] * 1e3,
                        "later_than_period": over,
                    }
                    rows.append(row)
                    taken = f"{len(late)} / {row['due']}"
                    print(
                        f"{label:>24} | {row['ran_at']:>8} | {hz:5g} | {load:>4} | {taken:>11} | "
                        f"{row['p50_ms']:6.3f} | {row['p99_ms']:6.3f} | {row['max_ms']:6.2f} | "
                        f"{over} ({over / max(1, len(late)):.2%})"
                    )
    return rows


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
    parser.add_argument("--parts", default="cost,lag", help="cost, lag or both")
    parser.add_argument("--lag-rates", default="50,100")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--lag-child", help=argparse.SUPPRESS)  # reader,hz,seconds,root
    args = parser.parse_args()
    if args.lag_child:
        reader, hz, seconds, tree = args.lag_child.split(",", 3)
        figures = reader_lag(PowerOptions(sysfs_path=tree), float(hz), float(seconds), reader)
        print(json.dumps(figures))
        return 0
    root = Path(tempfile.mkdtemp(prefix="edgewatt-reader-"))
    build_tree(root)
    options = PowerOptions(sysfs_path=str(root))
    readers = ["python"] + (["native"] if native.available() else [])
    parts = args.parts.split(",")
    figures = {}
    if "cost" in parts:
        figures["cost"] = cost_rows(options, root, readers, args)
    if "lag" in parts:
        rates = [float(r) for r in args.lag_rates.split(",")]
        figures["lag"] = lag_rows(root, rates, args.lag_seconds)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def cost_rows(
    options: PowerOptions, root: Path, readers: list[str], args: argparse.Namespace
) -> list[dict]:
    """Each reader's cost and the plain poller's at each rate."""
    rows = []
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
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
