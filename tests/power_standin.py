"""A stand-in INA3221 in the kernel's hwmon layout whose power follows a known waveform.

The board input channel's current file is rewritten in place by a writer process at
1 kHz (a square wave between 4 W and 14 W at 3 Hz, plus 150 ms bursts at 24 W), as
the driver would show it; the writer logs every change with its monotonic time
(CLOCK_MONOTONIC is the same clock in every process), so the exact energy the file
held over any window is known. Used by the energy tests and benchmarks/energy_accuracy.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOLTS_MV = 5000
LOW_MA, HIGH_MA, BURST_MA = 800, 2800, 4800  # 4 W, 14 W, 24 W at 5 V

WRITER = r"""
import os, sys, time
path, log_path, square_hz, bursts = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
low, high, burst = (int(v) for v in sys.argv[5:8])
bursts = [tuple(map(float, b.split(":"))) for b in bursts.split(",") if b]  # start:length
fd = os.open(path, os.O_WRONLY)
log = open(log_path, "w", buffering=1)
start = time.monotonic()
log.write(f"start {start!r}\n")
last = None
tick = start
while True:
    now = time.monotonic()
    t = now - start
    if any(b <= t < b + n for b, n in bursts):
        value = burst
    else:
        value = high if int(t * square_hz * 2) % 2 else low
    if value != last:
        os.pwrite(fd, f"{value:04d}\n".encode(), 0)  # same width: never a torn number
        log.write(f"{time.monotonic()!r} {value}\n")
        last = value
    tick += 0.001
    time.sleep(max(0.0, tick - time.monotonic()))
"""


def build_tree(root: Path) -> Path:
    """An Orin-Nano-like hwmon INA3221: VDD_IN follows the waveform, two constant rails."""
    device = root / "class" / "hwmon" / "hwmon3"
    device.mkdir(parents=True)
    files = {
        "name": "ina3221",
        "in1_label": "VDD_IN",
        "in1_input": str(VOLTS_MV),
        "curr1_input": f"{LOW_MA:04d}",
        "in2_label": "VDD_CPU_GPU_CV",
        "in2_input": "5000",
        "curr2_input": "400",
        "in3_label": "VDD_SOC",
        "in3_input": "5000",
        "curr3_input": "300",
    }
    for name, text in files.items():
        (device / name).write_text(text + "\n")
    return device / "curr1_input"


@dataclass
class Waveform:
    """The writer's log: (monotonic time, watts) at each change."""

    log_path: Path
    process: subprocess.Popen

    def changes(self) -> list[tuple[float, float]]:
        lines = self.log_path.read_text().splitlines()
        start = float(lines[0].split()[1])
        values = [
            (float(t), int(v) * VOLTS_MV / 1_000_000) for t, v in (ln.split() for ln in lines[1:])
        ]
        return [(start, values[0][1]), *values[1:]] if values else []

    def energy(self, t0: float, t1: float) -> float:
        """Joules the file held between monotonic t0 and t1 (step-held values)."""
        changes = self.changes()
        total = 0.0
        for (a, watts), (b, _) in zip(changes, [*changes[1:], (float("inf"), 0.0)]):
            lo, hi = max(a, t0), min(b, t1)
            if hi > lo:
                total += watts * (hi - lo)
        return total

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def start_writer(
    current_file: Path,
    log_path: Path,
    square_hz: float = 3.0,
    bursts: Sequence[tuple[float, float]] = (),
    currents_ma: tuple[int, int, int] = (LOW_MA, HIGH_MA, BURST_MA),
) -> Waveform:
    """The writer, its square wave and bursts at ``currents_ma`` (low, high, burst: mA at
    5 V; 1000 mA is 5 W), once its first change is logged."""
    spec = ",".join(f"{b}:{n}" for b, n in bursts)
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(current_file), str(log_path), str(square_hz), spec]
        + [str(v) for v in currents_ma]
    )
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and len(log_path.read_text().splitlines() if log_path.exists() else []) < 2
    ):
        time.sleep(0.01)
    return Waveform(log_path, process)


def stand_in_board(tmp_path: Path) -> Iterator[tuple[Path, Path, Callable[..., Waveform]]]:
    """A fixture's body: (the sysfs root, the current file, start a writer of a
    waveform into it); the writers started are stopped after the test."""
    root = tmp_path / "sys"
    current = build_tree(root)
    writers: list[Waveform] = []

    def writer(**kw: Any) -> Waveform:
        wave = start_writer(current, tmp_path / f"writer{len(writers)}.log", **kw)
        writers.append(wave)
        return wave

    yield root, current, writer
    for wave in writers:
        wave.stop()
