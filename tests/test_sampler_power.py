"""One sampler pass after another, in process, with a GPU source reporting the real
pid of a child: the figures reach the target's sample."""

from __future__ import annotations

import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import procfs
from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.power.source import Gpu, GpuProcess, PowerReading, PullSource, Rail
from edgewatt.core.sampling.sampler import Sampler
from tests.conftest import table_with, wait_for


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
    # Asleep before the first pass: an interpreter still starting on a busy machine
    # would use CPU in the passes, and so get its share of the power above idle.
    child = spawn(
        "import time; print('ready', flush=True); time.sleep(60)",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline() == "ready\n"
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


@dataclass
class JetsonBoard(PullSource):
    """A Jetson's INA3221: board input VDD_IN = 5 W + its GPU rail, the GPU rail idle
    (0 W) for the first ``idle_reads`` reads, then ``gpu_w``."""

    gpu_w: float
    idle_reads: int = 3
    name: str = "ina3221"
    board: bool = True
    reads: int = 0

    def read(self) -> PowerReading:
        gpu = 0.0 if self.reads < self.idle_reads else self.gpu_w
        self.reads += 1
        rails = (
            Rail(id="ina3221:VDD_IN", name="VDD_IN", type="power_supply", power_w=5.0 + gpu),
            Rail(id="ina3221:VDD_GPU", name="VDD_GPU", type="gpu", power_w=gpu),
        )
        return PowerReading(
            source=self.name, monotonic=time.monotonic(), rails=rails, total_w=5.0 + gpu
        )


def jetson_sampler(table: Any) -> Sampler:
    """A sampler over ``table`` reading a JetsonBoard whose GPU rail draws 10 W above
    its idle once busy, the device's idle configured at its 5 W."""
    return Sampler(
        table,
        interval=0.2,
        host_name="h",
        power=PowerMeter([JetsonBoard(gpu_w=10.0)], max_gap_s=5.0),
        attribution=Attribution(idle_w=5.0, window_s=600.0),
    )


def stand_in_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file the sampler takes for a GPU device: a process holding it open holds the GPU."""
    device = tmp_path / "nvhost-gpu"
    device.write_text("")
    monkeypatch.setattr(procfs, "GPU_DEVICES", (*procfs.GPU_DEVICES, str(device).encode()))
    return str(device)


def cpu_ticks(pid: int) -> int:
    """The CPU time the kernel counted for ``pid``, in clock ticks."""
    stat = procfs.parse_stat(Path(f"/proc/{pid}/stat").read_text())
    return stat.utime + stat.stime


def state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, ...)."""
    return procfs.parse_stat(Path(f"/proc/{pid}/stat").read_text()).state


BURN = "import time\nwhile True: time.sleep(0.0005); sum(range(2000))\n"


def test_the_gpu_rail_goes_to_the_target_holding_the_gpu(
    spawn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two CPU-busy targets; one holds a (stand-in) GPU device open. The GPU rail's
    # 10 W above its idle goes to that one alone, whatever their CPU shares; the
    # device's 5 W are its configured idle, so nothing is left for CPU time.
    device = stand_in_gpu(tmp_path, monkeypatch)
    holder = spawn(f"f = open({device!r})\n" + BURN)
    other = spawn(BURN)
    table = table_with(holder.pid)
    other_id = table.register(other.pid, {}, True, os.getuid())[0].id
    holder_id = next(t.id for t in table.running() if t.pid == holder.pid)
    sampler = jetson_sampler(table)
    wait_for(lambda: procfs.holds_gpu(holder.pid))
    energies: dict[str, float] = {}
    for _ in range(10):
        snapshot = sampler.sample_once()
        energies = {p.target_id: p.energy_j or 0.0 for p in snapshot.processes}
        time.sleep(0.2)
    device_j = snapshot.power.host_energy_j  # type: ignore[union-attr]
    parts = snapshot.energy_parts_j
    sampler.close()
    assert energies[other_id] == pytest.approx(0.0, abs=1e-9)
    # From the first pass at 10 W on: about 1.4 s of 10 W, all to the holder.
    assert energies[holder_id] > 10.0
    assert energies[holder_id] == pytest.approx(parts["attributed"], rel=1e-9)
    assert parts["unattributed"] == pytest.approx(0.0, abs=1e-6)
    # Every joule measured since the first pass is idle or attributed.
    first_pass_j = 5.0 * 0.2  # the energy before the first pass with a reading before it
    assert math.fsum(parts.values()) == pytest.approx(device_j - first_pass_j, rel=0.1)


@pytest.mark.parametrize("holders", [1, 2])
def test_holders_waiting_on_the_gpu_get_the_gpu_rail(
    spawn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holders: int
) -> None:
    # A trainer blocked on its GPU work uses no CPU: the kernel counts 0 CPU seconds for
    # a sleeping holder in every pass. The GPU rail's 10 W above its idle are still its
    # work (shared equally between holders that all read 0), never a busy non-holder's
    # and never no one's.
    device = stand_in_gpu(tmp_path, monkeypatch)
    sleepers = [spawn(f"f = open({device!r})\nimport time; time.sleep(60)") for _ in range(holders)]
    other = spawn(BURN)
    table = table_with(sleepers[0].pid)
    for sleeper in sleepers[1:]:
        table.register(sleeper.pid, {}, True, os.getuid())
    other_id = table.register(other.pid, {}, True, os.getuid())[0].id
    sleeper_ids = [t.id for t in table.running() if t.id != other_id]
    sampler = jetson_sampler(table)
    for sleeper in sleepers:  # holding the GPU, and asleep in time.sleep
        wait_for(lambda s=sleeper: procfs.holds_gpu(s.pid) and state(s.pid) == "S")
    cpu_before = [cpu_ticks(s.pid) for s in sleepers]
    for _ in range(10):
        snapshot = sampler.sample_once()
        time.sleep(0.2)
    sampler.close()
    # What the kernel counted: the holders used no CPU time at all meanwhile.
    assert [cpu_ticks(s.pid) for s in sleepers] == cpu_before
    energies = {p.target_id: p.energy_j or 0.0 for p in snapshot.processes}
    parts = snapshot.energy_parts_j
    assert energies[other_id] == pytest.approx(0.0, abs=1e-9)
    assert parts["unattributed"] == pytest.approx(0.0, abs=1e-6)
    assert parts["attributed"] > 10.0  # about 1.4 s of 10 W
    for sleeper_id in sleeper_ids:
        assert energies[sleeper_id] == pytest.approx(parts["attributed"] / holders, rel=1e-9)


def test_with_no_gpu_holder_the_gpu_rail_is_unattributed(spawn: Any) -> None:
    busy = spawn(BURN)
    table = table_with(busy.pid)
    sampler = jetson_sampler(table)
    for _ in range(8):
        snapshot = sampler.sample_once()
        time.sleep(0.2)
    sampler.close()
    parts = snapshot.energy_parts_j
    assert snapshot.processes[0].energy_j == pytest.approx(0.0, abs=1e-9)
    assert parts["attributed"] == pytest.approx(0.0, abs=1e-9)
    assert parts["unattributed"] > 8.0  # about 1 s of the GPU's 10 W, given to nobody


@dataclass
class GpuLoad(PullSource):
    """The board GPU's load (GR3D), as the GPU's load file beside the INA3221s gives it."""

    busy: float
    name: str = "tegra_gpu"
    board: bool = False

    def read(self) -> PowerReading:
        gpu = Gpu(id="tegra_gpu:GPU", name="GPU", utilization=self.busy)
        return PowerReading(source=self.name, monotonic=time.monotonic(), gpus=(gpu,))


@pytest.mark.parametrize("busy", [0.0, 0.6], ids=["idle", "busy"])
def test_the_gpu_rail_goes_to_its_holder_only_while_gr3d_is_busy(
    spawn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy: float
) -> None:
    # The rail draws 10 W above its idle either way; with GR3D at 0 % that is no
    # holder's work: unattributed, and the holder gets nothing.
    device = stand_in_gpu(tmp_path, monkeypatch)
    holder = spawn(f"f = open({device!r})\n" + BURN)
    table = table_with(holder.pid)
    sampler = Sampler(
        table,
        interval=0.2,
        host_name="h",
        power=PowerMeter([JetsonBoard(gpu_w=10.0), GpuLoad(busy)], max_gap_s=5.0),
        attribution=Attribution(idle_w=5.0, window_s=600.0),
    )
    wait_for(lambda: procfs.holds_gpu(holder.pid))
    for _ in range(10):
        snapshot = sampler.sample_once()
        time.sleep(0.2)
    sampler.close()
    parts, energy = snapshot.energy_parts_j, snapshot.processes[0].energy_j or 0.0
    assert snapshot.power is not None and snapshot.power.host_power_w == pytest.approx(15.0)
    if busy:
        assert energy > 10.0 and parts["unattributed"] == pytest.approx(0.0, abs=1e-6)
    else:
        assert energy == pytest.approx(0.0, abs=1e-9)
        assert parts["unattributed"] > 10.0 and parts["attributed"] == pytest.approx(0.0, abs=1e-9)
