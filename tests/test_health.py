"""The /healthz document from the parts' status alone: no daemon, no clock."""

from __future__ import annotations

from typing import Any

from edgewatt.core.power.values import PowerSnapshot, PowerStatus
from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter import health
from edgewatt.exporter.collectors import Collectors


def _document(snapshot: Snapshot, power: PowerStatus, **changes: Any) -> dict[str, Any]:
    given: dict[str, Any] = {
        "started": 900.0,
        "interval_s": 1.0,
        "min_interval_s": 0.1,
        "exited_retention_s": 600.0,
        "logical_cpus": 4,
        "collectors": Collectors(parts=None, exact_exits=True, cgroup_traffic_problem=None),  # type: ignore[arg-type]
        "membership": "lineage",
        "other_namespaces": False,
        "state_error": None,
    }
    return health.document(snapshot, power, {}, health.Facts(**{**given, **changes}), now=1000.0)


def test_a_source_found_at_start_that_no_longer_speaks_degrades_health() -> None:
    speaking = PowerSnapshot(host_power_w=4.0, host_energy_j=8.0, sources=("ina3221",))
    snapshot = Snapshot(time=999.5, sequence=3, host=None, power=speaking)
    power = PowerStatus(sources=("ina3221", "tegrastats"), reader="python", reading_cpu_s=2.5e-5)
    doc = _document(snapshot, power)
    assert doc["status"] == "degraded"
    assert doc["power_sources"] == ["ina3221"]
    assert doc["power_sources_silent"] == ["tegrastats"]
    assert doc["uptime_s"] == 100.0
    assert doc["last_sample_age_s"] == 0.5
    assert doc["power_reading_cpu_us"] == 25.0
    assert doc["exit_figures"] == "exact"


def test_without_power_every_power_field_is_null_and_a_failed_save_degrades() -> None:
    snapshot = Snapshot(time=1000.0, sequence=1, host=None)
    doc = _document(snapshot, PowerStatus())
    assert doc["status"] == "ok"
    assert doc["power_sources"] == [] and doc["power_sources_silent"] == []
    keys = ("power_sample_hz", "power_reader", "power_reader_priority", "power_reading_cpu_us",
            "power_window_hz")  # fmt: skip
    assert [doc[k] for k in keys] == [None] * len(keys)
    failed = _document(snapshot, PowerStatus(), state_error="/var/lib/edgewatt: ENOSPC")
    assert failed["status"] == "degraded"
    assert failed["state_error"] == "/var/lib/edgewatt: ENOSPC"
