"""What one read of the device's context costs (core/platforms/context.py's ``read``, as the
daemon's context thread makes it every ``context_interval``): CPU of the reading
thread plus its reaped children's, and wall time, per read.

The tree is a Thor-like board: 14 CPUs' cpufreq, a GPU devfreq, 10 thermal zones,
the over-current counters, the model and nv_tegra_release. Three cases:
- ``files``: no executable on PATH (what an x86 host or a Jetson without nvpmodel
  costs);
- ``nvpmodel (C)``: a small compiled program printing nvpmodel -q's answer, about
  what NVIDIA's nvpmodel binary costs to spawn (its own work, reading one status
  file, is not here);
- ``nvpmodel (stand-in)``: tests/bin/nvpmodel, the Python stand-in the tests use.

    .venv/bin/python benchmarks/context_read.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.platforms.board import Roots  # noqa: E402
from edgewatt.core.platforms.context import read  # noqa: E402

NVPMODEL_C = r"""
#include <stdio.h>
int main(void) { fputs("NV Power Mode: MAXN\n0\n", stdout); return 0; }
"""


def tree(root: Path) -> None:
    files = {
        "sys/firmware/devicetree/base/model": "NVIDIA Jetson AGX Thor Developer Kit\0",
        "etc/nv_tegra_release": "# R38 (release), REVISION: 4.0, GCID: -, BOARD: generic\n",
        "sys/class/devfreq/gpu/cur_freq": "1000000000\n",
        "sys/class/devfreq/gpu/min_freq": "300000000\n",
        "sys/class/devfreq/gpu/max_freq": "1575000000\n",
    }
    for cpu in range(14):
        for kind in ("cur", "min", "max"):
            files[f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_{kind}_freq"] = "2601000\n"
    for zone in range(10):
        files[f"sys/class/thermal/thermal_zone{zone}/type"] = f"zone{zone}\n"
        files[f"sys/class/thermal/thermal_zone{zone}/temp"] = f"{36000 + zone * 500}\n"
    for alarm in (1, 2, 3):
        files[f"sys/class/hwmon/hwmon3/oc{alarm}_event_cnt"] = "0\n"
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


def measure(roots: Roots, repeat: int) -> tuple[float, float]:
    """Median CPU and wall ms per read."""
    cpus, walls = [], []
    for _ in range(repeat):
        started, began = cpu(), time.perf_counter()
        read(roots)
        cpus.append(cpu() - started)
        walls.append(time.perf_counter() - began)
    return statistics.median(cpus) * 1e3, statistics.median(walls) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        tree(root)
        bins = {name: root / name for name in ("none", "c", "stand-in")}
        for path in bins.values():
            path.mkdir()
        if shutil.which("cc"):
            (root / "nvpmodel.c").write_text(NVPMODEL_C)
            subprocess.run(
                ["cc", "-O2", "-o", str(bins["c"] / "nvpmodel"), str(root / "nvpmodel.c")],
                check=True,
            )
        os.symlink(ROOT / "tests" / "bin" / "nvpmodel", bins["stand-in"] / "nvpmodel")
        cases = {"files": "none", "nvpmodel (C)": "c", "nvpmodel (stand-in)": "stand-in"}
        for label, key in cases.items():
            roots = Roots(
                sysfs=str(root / "sys"),
                proc=str(root / "proc"),
                etc=str(root / "etc"),
                path=str(bins[key]),
            )
            repeat = args.repeat if key != "stand-in" else max(1, args.repeat // 10)
            cpu_ms, wall_ms = measure(roots, repeat)
            print(
                f"{label:<22} {cpu_ms:7.2f} ms CPU  {wall_ms:7.2f} ms wall  per read "
                f"(median of {repeat})"
            )


if __name__ == "__main__":
    main()
