"""How close the device energy of a run and of short windows comes to the exact
integral, at each power reader rate, side by side on one trace in one run.

A stand-in INA3221 (tests/power_standin.py: the kernel's hwmon layout, its board
input rewritten at 1 kHz by a writer process: a square wave between 4 W and 14 W at
3 Hz, plus a 150 ms burst at 24 W) is read by several power readers at once: one
that reads only at the passes (once a second) and at the window edges, as edgewatt
did before the reader had its own rate, and one per ``--rates``. Each second is a
pass for every reader at the same instant; short windows (a 150 ms ``track`` call
over the burst, others at random) are measured by every reader at the same edges.
The exact energy is the writer's log integrated over the same instants.

    .venv/bin/python benchmarks/energy_accuracy.py [--seconds 10] [--rates 10,50,100,200]
        [--windowed 5,10]

``--windowed``: readers at these steady rates whose windows are read at the window
rate (``power_window_hz``, 200 Hz) from their first edge, as the sampler does for a
phase or a ``track`` call; the steady rates are what the automatic rate gives a
Jetson Nano-class core. Each reader's CPU per second (its threads' own clocks) is
shown beside its errors.

Target: 10 s within 1 %, a 150 ms window within 5 %.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.power import ina3221  # noqa: E402
from edgewatt.core.power.meter import WINDOW_BOOST_S, PowerMeter  # noqa: E402
from edgewatt.core.power.source import PowerOptions  # noqa: E402
from tests.power_standin import build_tree, start_writer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", default="10,50,100,200")
    parser.add_argument("--windowed", default="5,10", help="steady rates with 200 Hz windows")
    parser.add_argument("--windows", type=int, default=8, help="random 150 ms windows")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    root = Path(tempfile.mkdtemp(prefix="edgewatt-energy-"))
    burst_at = 2.3
    wave = start_writer(build_tree(root), root / "writer.log", bursts=[(burst_at, 0.15)])
    options = PowerOptions(sysfs_path=str(root))
    # "passes only": no reader thread, read at each pass and window edge.
    meters = {"passes only": PowerMeter([ina3221.discover(options)], max_gap_s=5.0)}
    for hz in rates:
        meter = PowerMeter([ina3221.discover(options)], max_gap_s=5.0, sample_hz=hz, window_hz=0)
        meters[f"{hz:g} Hz"] = meter.start()
    for hz in [float(r) for r in args.windowed.split(",") if r]:
        meter = PowerMeter([ina3221.discover(options)], max_gap_s=5.0, sample_hz=hz)
        meters[f"{hz:g}+{meter.windows.hz:g} Hz"] = meter.start()

    def edge(opens: bool = False) -> tuple[float, dict[str, float]]:
        now = time.monotonic()
        until = now + WINDOW_BOOST_S if opens else None
        return now, {name: m.read(now, until).host_energy_j for name, m in meters.items()}  # type: ignore[union-attr]

    start = wave.changes()[0][0]
    rng = random.Random(29)
    window_starts = sorted(
        [burst_at - 0.005] + [rng.uniform(0.5, args.seconds - 1) for _ in range(args.windows)]
    )
    run_from, run_energy = edge()
    windows = []
    next_pass = run_from + 1.0
    for at in window_starts:
        while start + at > next_pass:  # the passes due before the window
            time.sleep(max(0.0, next_pass - time.monotonic()))
            edge()
            next_pass += 1.0
        time.sleep(max(0.0, start + at - time.monotonic()))
        a, ea = edge(opens=True)
        time.sleep(0.15)
        b, eb = edge()
        windows.append((a, b, ea, eb))
    while next_pass < run_from + args.seconds:
        time.sleep(max(0.0, next_pass - time.monotonic()))
        edge()
        next_pass += 1.0
    time.sleep(max(0.0, run_from + args.seconds - time.monotonic()))
    run_to, run_end = edge()
    cpu = {name: m.reader_cpu_s() / (run_to - run_from) for name, m in meters.items()}
    for meter in meters.values():
        meter.close()
    wave.stop()

    exact_run = wave.energy(run_from, run_to)
    results: dict[str, dict[str, float]] = {}
    for name in meters:
        errors = [(eb[name] - ea[name]) / wave.energy(a, b) - 1 for a, b, ea, eb in windows]
        burst = window_starts.index(burst_at - 0.005)
        results[name] = {
            "run_error": (run_end[name] - run_energy[name]) / exact_run - 1,
            "burst_window_error": errors[burst],
            "window_max_abs_error": max(abs(e) for e in errors),
            "reader_cpu_s_per_s": cpu[name],
        }
    print(f"{run_to - run_from:.2f} s run: {exact_run:.3f} J exact; 150 ms windows: {len(windows)}")
    print(
        f"{'reader':>12} | {'run error':>9} | {'150 ms burst':>12} | {'150 ms max |err|':>16} "
        f"| {'CPU (% of a core)':>17}"
    )
    for name, r in results.items():
        print(
            f"{name:>12} | {r['run_error']:+9.2%} | {r['burst_window_error']:+12.2%} | "
            f"{r['window_max_abs_error']:16.2%} | {r['reader_cpu_s_per_s']:17.3%}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
