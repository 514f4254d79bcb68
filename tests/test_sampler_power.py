"""One sampler pass after another, in process, with a GPU source reporting the real
pid of a child: the figures reach the target's sample."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.power.source import Gpu, GpuProcess, PowerReading, PullSource, Rail
from edgewatt.core.sampler import Sampler
from tests.conftest import table_with


@dataclass
class ClockedGpu(PullSource):
    """A GPU whose energy counter runs at the given power (after ``low_reads`` reads at
    ``low_watts``), its load all on one pid."""

    pid: int
    watts: float
    low_watts: float = 0.0
    low_reads: int = 0
    name: str = "nvml"
    board: bool = False
    energy: float = 0.0
    reads: int = 0
    last: float = field(default_factory=time.monotonic)

    def read(self) -> PowerReading:
        now = time.monotonic()
        watts = self.low_watts if self.reads < self.low_reads else self.watts
        self.energy += (now - self.last) * watts
        self.last, self.reads = now, self.reads + 1
        energy = self.energy
        gpu = Gpu(
            id="nvml:GPU-1",
            name="GPU",
            utilization=0.9,
            power_w=watts,
            energy_j=energy,
            memory_used_bytes=3 * 2**30,
            memory_total_bytes=80 * 2**30,
            processes={self.pid: GpuProcess(utilization=0.9, memory_bytes=2 * 2**30)},
        )
        rail = Rail(id=gpu.id, name="GPU 0", type="gpu", power_w=watts, energy_j=energy)
        return PowerReading(
            source=self.name,
            monotonic=now,
            rails=(rail,),
            total_w=watts,
            total_energy_j=energy,
            gpus=(gpu,),
        )


def test_gpu_user_gets_gpu_energy_memory_and_load(spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    gpu = ClockedGpu(pid=child.pid, watts=200.0)
    sampler = Sampler(
        table,
        interval=0.1,
        host_name="h",
        power=PowerMeter([gpu], max_gap_s=5.0),
        attribution=Attribution(idle_w=50.0, window_s=600.0),
    )
    samples = []
    for _ in range(6):
        snapshot = sampler.sample_once()
        samples.append(snapshot.processes[0])
        time.sleep(0.1)
    last = samples[-1]
    assert last.gpu_memory_bytes == 2 * 2**30
    assert last.gpu_utilization == 0.9
    # 200 W device, 50 W idle; the GPU's own idle is estimated at its lowest, 200 W,
    # so its dynamic part is 0 and the 150 W above idle are shared by CPU time: the
    # sleeping child gets (almost) none of it.
    assert last.power_w is not None and last.power_w < 5.0
    assert last.energy_j is not None and last.energy_j >= 0
    assert [s.energy_j for s in samples] == sorted(s.energy_j for s in samples)
    sampler.close()


def test_configured_idle_below_the_gpu_draw_goes_to_the_gpu_user(spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    # The GPU idles at 40 W for the first passes, then draws 200 W for the child.
    gpu = ClockedGpu(pid=child.pid, watts=200.0, low_watts=40.0, low_reads=3)
    sampler = Sampler(
        table, interval=0.1, host_name="h", power=PowerMeter([gpu], max_gap_s=5.0),
        attribution=Attribution(idle_w=50.0, window_s=600.0),
    )  # fmt: skip
    for _ in range(8):
        snapshot = sampler.sample_once()
        time.sleep(0.1)
    sample = snapshot.processes[0]
    # GPU dynamic 160 W, capped by the device's 150 W above idle; the child holds
    # 0.9 of a GPU whose load is 0.9: all of it.
    assert sample.power_w == pytest.approx(150.0, rel=0.05)
    sampler.close()
