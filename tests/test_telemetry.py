"""The metric table and the bounded OTel pipeline, without the daemon around them."""

from __future__ import annotations

import gc
from typing import Any

from opentelemetry.sdk.metrics._internal.aggregation import _Aggregation
from opentelemetry.sdk.resources import Resource

from exporter.power.meter import PowerSnapshot, RailState
from exporter.power.source import Gpu
from exporter.sampling import system
from exporter.snapshot import HostSample, ProcessSample, Snapshot
from exporter.telemetry import METRICS, Telemetry

# The Prometheus names that dashboards and rules are written against (design.md).
EXPECTED_FAMILIES = {
    "process_cpu_time_seconds": "counter",
    "process_cpu_utilization": "gauge",
    "process_memory_usage_bytes": "gauge",
    "process_memory_virtual_bytes": "gauge",
    "process_disk_io_bytes": "counter",
    "process_network_io_bytes": "counter",
    "process_threads": "gauge",
    "process_open_file_descriptors": "gauge",
    "edgewatt_process_members": "gauge",
    "system_cpu_time_seconds": "counter",
    "system_cpu_utilization": "gauge",
    "edgewatt_host_logical_cpus": "gauge",
    "system_memory_usage_bytes": "gauge",
    "system_memory_limit_bytes": "gauge",
    "system_network_io_bytes": "counter",
    "edgewatt_targets": "gauge",
    "edgewatt_sampler_duration_seconds": "gauge",
    "edgewatt_sampler_overruns": "counter",
    "edgewatt_sampler_errors": "counter",
    "edgewatt_target_exits": "counter",
    "edgewatt_process_phase": "gauge",
    "edgewatt_process_phase_energy_joules": "gauge",
    "edgewatt_process_power_watts": "gauge",
    "edgewatt_process_energy_joules": "counter",
    "hw_host_power_watts": "gauge",
    "hw_host_energy_joules": "counter",
    "hw_power_watts": "gauge",
    "hw_energy_joules": "counter",
    "hw_gpu_utilization": "gauge",
    "hw_temperature_celsius": "gauge",
    "edgewatt_host_idle_power_watts": "gauge",
    "edgewatt_process_gpu_utilization": "gauge",
    "edgewatt_process_gpu_memory_usage_bytes": "gauge",
    "hw_gpu_memory_usage_bytes": "gauge",
    "hw_gpu_memory_limit_bytes": "gauge",
}


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
        memory_rss_bytes=100,
        memory_virtual_bytes=200,
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
        phases=(("warmup", False, 3.5), ("train", True, 1.25)),
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


def scrape(t: Telemetry) -> dict[str, Any]:
    families: dict[str, Any] = {}
    for metric in t._outer.collect():
        families[metric.name] = metric
    return families


def test_families_and_types_match_the_contract() -> None:
    t = Telemetry(Resource.create({}), series_rotation=10)
    host = HostSample(
        cpu=system.read_cpu(),
        cpu_utilization=0.2,
        memory=system.read_memory(),
        network=system.read_network(),
    )
    t.update(
        Snapshot(
            time=0.0,
            sequence=1,
            host=host,
            processes=(process(1),),
            power=POWER,
            idle_power_w=4.0,
        )
    )
    families = scrape(t)
    got = {name: f.type for name, f in families.items() if name != "target"}
    assert got == EXPECTED_FAMILIES
    assert len(METRICS) == len(EXPECTED_FAMILIES)
    (rail,) = families["hw_power_watts"].samples
    assert rail.labels == {
        "hw_id": "tegrastats:VDD_IN",
        "hw_name": "VDD_IN",
        "hw_type": "power_supply",
    }
    assert rail.value == 12.0
    t.shutdown()


def test_unknown_values_are_absent_not_zero() -> None:
    t = Telemetry(Resource.create({}), series_rotation=10)
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),)))
    disk = scrape(t)["process_disk_io_bytes"]
    assert [(s.labels["disk_io_direction"], s.value) for s in disk.samples] == [("read", 1.0)]
    t.shutdown()


def _aggregations() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, _Aggregation))


def _churn(rotation: int, cycles: int) -> tuple[Telemetry, int]:
    t = Telemetry(Resource.create({}), series_rotation=rotation)
    for i in range(cycles):
        # One long-lived target and one that lives for a single pass.
        t.update(Snapshot(time=0.0, sequence=i, host=None, processes=(process(0), process(i + 1))))
        scrape(t)
    return t, _aggregations()


def test_rotation_bounds_sdk_state_under_process_churn() -> None:
    baseline = _aggregations()
    t, held = _churn(rotation=50, cycles=1000)
    per_target = 19  # attribute sets one target adds across the instruments
    assert t.rotations == 19  # at cycles 50, 100, ..., 950
    assert held - baseline <= (50 + 2) * per_target + len(METRICS)
    t.shutdown()
    # The same churn without rotation keeps every attribute set ever seen.
    unbounded, held_unbounded = _churn(rotation=10**6, cycles=300)
    assert held_unbounded - baseline >= 300 * per_target
    unbounded.shutdown()


def test_rotation_keeps_values_and_drops_exited_series() -> None:
    t = Telemetry(Resource.create({}), series_rotation=2)
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(0, 5.0), process(1))))
    t.update(Snapshot(time=0.0, sequence=2, host=None, processes=(process(0, 6.0), process(2))))
    t.update(Snapshot(time=0.0, sequence=3, host=None, processes=(process(0, 7.0),)))
    assert t.rotations == 1
    cpu = [
        (s.labels["edgewatt_target_id"], s.labels["cpu_mode"], s.value)
        for s in scrape(t)["process_cpu_time_seconds"].samples
    ]
    # Only the live target is left, with its absolute value: nothing was reset.
    assert sorted(cpu) == [("t0", "system", 0.25), ("t0", "user", 7.0)]
    t.shutdown()


def test_many_live_targets_never_fold_into_overflow() -> None:
    # 2,100 live targets: past the SDK's default limit of 2,000 attribute sets.
    t = Telemetry(Resource.create({}), series_rotation=1000, max_targets=2100)
    many = tuple(process(i) for i in range(2100))
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=many))
    rss = scrape(t)["process_memory_usage_bytes"].samples
    assert len(rss) == 2100
    assert not any("otel_metric_overflow" in s.labels for s in rss)
    t.shutdown()
