"""Snapshots with every kind of figure, for the exporters' tests."""

from __future__ import annotations

from edgewatt.core.power.source import Gpu
from edgewatt.core.power.values import PowerSnapshot, RailState
from edgewatt.core.snapshot import PhaseFigures, ProcessSample


def process(i: int, cpu: float = 1.5) -> ProcessSample:
    return ProcessSample(
        target_id=f"t{i}",
        pid=1000 + i,
        executable="python3",
        attributes={
            "process.pid": 1000 + i,
            "process.executable.name": "python3",
            "edgewatt.target.id": f"t{i}",
            "host.name": "h",
            "run": "x",
        },
        time=0.0,
        cpu_user_s=cpu,
        cpu_system_s=0.25,
        cpu_utilization=0.5,
        cpu_mode_utilization=(0.375, 0.125),
        memory_rss_bytes=100,
        memory_virtual_bytes=200,
        memory_pss_bytes=60,
        memory_rss_largest_bytes=80,
        disk_read_bytes=1,
        disk_write_bytes=None,  # unknown: must be absent, never 0
        threads=3,
        open_fds=4,
        processes=1,
        power_w=2.5,
        energy_j=10.0,
        network_transmit_bytes=1000,
        network_receive_bytes=2000,
        gpu_utilization=0.4,
        gpu_memory_bytes=2**30,
        context_switches_voluntary=120,
        context_switches_involuntary=7,
        page_faults_minor=4096,
        phases=(
            PhaseFigures("warmup", False, 3.5, 12.0, 19.5),
            PhaseFigures("train", True, 1.25, 4.5, None),  # no reading in it yet
        ),
    )


POWER = PowerSnapshot(
    host_power_w=12.0,
    host_energy_j=100.0,
    rails=(RailState("tegrastats:VDD_IN", "VDD_IN", "power_supply", "tegrastats", 12.0, 100.0),),
    gpus=(
        Gpu(
            id="nvml:GPU-1",
            name="NVIDIA H200",
            utilization=0.5,
            memory_used_bytes=2**30,
            memory_total_bytes=2**37,
        ),
    ),
    temperatures_c={("tegrastats", "gpu"): 48.5},
    sources=("tegrastats",),
)
