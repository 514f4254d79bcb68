"""The Jetson GPU's load from sysfs: what GR3D is to tegrastats, for boards whose power
comes from the INA3221 monitors (tegrastats is then not run).

nvgpu's ``load`` file holds the GPU's busy share in per mille, the driver's own
average over its last sampling period. Where it is:

- ``devices/gpu.0/load`` (Nano, TX1/TX2, Xavier: JetPack 4 and 5);
- ``class/devfreq/<name>/device/load`` where the devfreq device is the GPU (Orin:
  ``17000000.gpu`` on JetPack 6, ``17000000.ga10b`` on JetPack 5), as jetson_stats
  finds it.

It gates the GPU rail's attribution (sampler.py, docs/attribution.md): the rail's
dynamic part goes to the GPU's holders only while the GPU is busy. No power of its
own: it is never the device's total.
"""

from __future__ import annotations

import glob
import os
import time

from edgewatt.core.power.source import Gpu, NoData, PowerOptions, PowerReading, PullSource

# The GPU's devfreq names on Jetsons (its device tree node: gpu, or the GPU's model).
_GPU_NAMES = ("gpu", "gv11b", "ga10b", "gp10b", "gm20b")


def load_path(sysfs: str) -> str | None:
    """The GPU's load file under ``sysfs``, where one is readable."""
    candidates = [os.path.join(sysfs, "devices", "gpu.0", "load")]
    for device in sorted(glob.glob(os.path.join(sysfs, "class", "devfreq", "*"))):
        name = os.path.basename(device).lower()
        if any(part in name for part in _GPU_NAMES):
            candidates.append(os.path.join(device, "device", "load"))
    for path in candidates:
        if os.access(path, os.R_OK):
            return path
    return None


def read_load(fd: int) -> float:
    """The busy share, 0..1, from the open load file; ValueError for anything else."""
    text = os.pread(fd, 16, 0).strip()
    permille = int(text) if text.isdigit() and len(text) <= 4 else -1
    if not 0 <= permille <= 1000:
        raise ValueError(f"not a GPU load in per mille: {text[:16]!r}")
    return permille / 1000


class TegraGpuSource(PullSource):
    name = "tegra_gpu"
    board = False  # a load, no power: the board's monitors give the device's total

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)

    def read(self) -> PowerReading:
        busy = read_load(self._fd)
        return PowerReading(
            source=self.name,
            monotonic=time.monotonic(),
            gpus=(Gpu(id="tegra_gpu:GPU", name="GPU", utilization=busy),),
        )

    def close(self) -> None:
        os.close(self._fd)


def discover(options: PowerOptions) -> TegraGpuSource:
    path = load_path(options.sysfs_path)
    if path is None:
        raise NoData(f"no Jetson GPU load file under {options.sysfs_path}")
    source = TegraGpuSource(path)
    try:
        source.read()
    except (OSError, ValueError) as exc:
        source.close()
        raise NoData(f"{path}: {exc}") from None
    return source
