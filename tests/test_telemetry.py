"""The OTel pipeline behind OTLP push: bounded under process churn, never overflowing."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics._internal.aggregation import _Aggregation
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter.telemetry import METRICS, OtelPipeline
from tests.conftest import wait_for
from tests.snapshots import process


def otel(**kwargs: Any) -> tuple[OtelPipeline, list[CollectorRegistry]]:
    """An OTel pipeline read by the SDK's Prometheus reader; one registry per rebuild."""
    registries: list[CollectorRegistry] = []

    def readers() -> list[MetricReader]:
        registries.append(CollectorRegistry())
        return [PrometheusMetricReader(registry=registries[-1], scope_info_enabled=False)]

    return OtelPipeline(Resource.create({}), readers, **kwargs), registries


def scrape(registries: list[CollectorRegistry]) -> dict[str, Any]:
    return {metric.name: metric for metric in registries[-1].collect()}


def _aggregations() -> int:
    gc.collect()
    return _live_aggregations()


def _live_aggregations() -> int:
    """Aggregations not yet freed, garbage in reference cycles included."""
    return sum(1 for o in gc.get_objects() if isinstance(o, _Aggregation))


def _churn(rotation: int, cycles: int) -> tuple[OtelPipeline, int]:
    t, registries = otel(series_rotation=rotation)
    for i in range(cycles):
        # One long-lived target and one that lives for a single pass.
        t.update(Snapshot(time=0.0, sequence=i, host=None, processes=(process(0), process(i + 1))))
        scrape(registries)
    for thread in threading.enumerate():  # old pipelines still handing in their last export
        if thread.name == "otel-retire":
            thread.join(10)
    return t, _aggregations()


def _series_of_one_target() -> int:
    """The attribute sets one target adds across the instruments: its points."""
    alone = Snapshot(time=0.0, sequence=1, host=None, processes=(process(0),))
    none = Snapshot(time=0.0, sequence=1, host=None)
    return sum(len(list(m.observe(alone))) - len(list(m.observe(none))) for m in METRICS)


def test_rotation_bounds_sdk_state_under_process_churn() -> None:
    baseline = _aggregations()
    t, held = _churn(rotation=50, cycles=1000)
    per_target = _series_of_one_target()
    assert per_target >= len([m for m in METRICS if m.metric.subject == "process"])
    assert t.rotations == 19  # at cycles 50, 100, ..., 950
    assert held - baseline <= (50 + 2) * per_target + len(METRICS)
    t.shutdown()
    # The same churn without rotation keeps every attribute set ever seen.
    unbounded, held_unbounded = _churn(rotation=10**6, cycles=300)
    assert held_unbounded - baseline >= 300 * per_target
    unbounded.shutdown()


def test_rotation_keeps_values_and_drops_exited_series() -> None:
    t, registries = otel(series_rotation=2)
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(0, 5.0), process(1))))
    t.update(Snapshot(time=0.0, sequence=2, host=None, processes=(process(0, 6.0), process(2))))
    t.update(Snapshot(time=0.0, sequence=3, host=None, processes=(process(0, 7.0),)))
    assert t.rotations == 1
    cpu = [
        (s.labels["edgewatt_target_id"], s.labels["cpu_mode"], s.value)
        for s in scrape(registries)["process_cpu_time_seconds"].samples
    ]
    # Only the live target is left, with its absolute value: nothing was reset.
    assert sorted(cpu) == [("t0", "system", 0.25), ("t0", "user", 7.0)]
    t.shutdown()


def test_many_live_targets_never_fold_into_overflow() -> None:
    # 2,100 live targets: past the SDK's default limit of 2,000 attribute sets.
    t, registries = otel(series_rotation=1000, max_targets=2100)
    many = tuple(process(i) for i in range(2100))
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=many))
    rss = scrape(registries)["process_memory_usage_bytes"].samples
    assert len(rss) == 2100
    assert not any("otel_metric_overflow" in s.labels for s in rss)
    t.shutdown()


class _StalledCollector(MetricExporter):
    """An exporter whose every export hangs until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.exporting = threading.Event()
        self.release = threading.Event()
        self.shut = threading.Event()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exporting.set()
        self.release.wait(10)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut.set()


def test_rotation_never_waits_for_the_old_pipelines_last_export() -> None:
    exporters: list[_StalledCollector] = []

    def readers() -> list[MetricReader]:
        exporters.append(_StalledCollector())
        return [PeriodicExportingMetricReader(exporters[-1], export_interval_millis=600_000)]

    t = OtelPipeline(Resource.create({}), readers, series_rotation=1)
    t.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(0), process(1))))
    t.update(Snapshot(time=0.0, sequence=2, host=None, processes=(process(0),)))
    assert t.rotations == 1
    old = exporters[0]
    # update() came back while the old pipeline's final export still hangs.
    assert old.exporting.wait(10)
    assert not old.shut.is_set()
    old.release.set()
    assert old.shut.wait(10)  # then the old pipeline finished shutting down
    exporters[1].release.set()
    t.shutdown()
    assert exporters[1].shut.is_set()


def test_a_retired_pipeline_frees_its_series_without_waiting_for_a_full_gc() -> None:
    # The old pipeline's reader sits in a reference cycle; without an explicit
    # collection its ~18 aggregations per target would live until the next full one.
    made: list[PeriodicExportingMetricReader] = []

    def readers() -> list[MetricReader]:
        exporter = _StalledCollector()
        exporter.release.set()
        # The reader's thread sleeps: gc.get_objects() while another thread builds a
        # tuple can break that thread (SystemError in _PyTuple_Resize), so this test
        # collects itself and counts only while no other thread allocates.
        made.append(PeriodicExportingMetricReader(exporter, export_interval_millis=600_000))
        return [made[-1]]

    t = OtelPipeline(Resource.create({}), readers, series_rotation=300)
    gc.collect()
    gc.disable()
    try:
        t.update(
            Snapshot(time=0.0, sequence=1, host=None, processes=tuple(map(process, range(300))))
        )
        made.pop().collect()  # popped: the test must not keep the old reader alive
        assert _live_aggregations() >= 300 * 18
        t.update(Snapshot(time=0.0, sequence=2, host=None))
        assert t.rotations == 1
        for thread in threading.enumerate():
            if thread.name == "otel-retire":
                thread.join(10)
        assert _live_aggregations() < 100
    finally:
        gc.enable()
        t.shutdown()


# What the daemon without OTLP push never imports: the SDK's metrics and exporters
# (~1.5 MiB of its RSS), and its resources module with what that pulls in
# (psutil, typing_extensions, semconv: another 1.5 MiB; otel_resource.py computes the
# attributes without it).
HEAVY = (
    "opentelemetry.sdk.metrics",
    "opentelemetry.exporter",
    "opentelemetry.metrics",
    "opentelemetry.sdk.resources",
    "opentelemetry.semconv",
    "opentelemetry.attributes",
    "psutil",
    "typing_extensions",
)


def test_the_daemon_without_otlp_push_imports_no_metrics_sdk() -> None:
    # /metrics is rendered from the snapshot: the SDK's metrics and exporters (~1.5 MiB
    # of the daemon's RSS) are imported only where OTLP push builds a pipeline.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, edgewatt.exporter.daemon, edgewatt.cli.main;"
            "print(' '.join(sorted(sys.modules)))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert [m for m in loaded if m.startswith(HEAVY) or m.startswith("matplotlib")] == []
    assert "edgewatt.exporter.telemetry" in loaded  # what /metrics renders is there
    pipeline, _ = otel(series_rotation=10)  # and a pipeline still builds where asked
    pipeline.shutdown()


def test_the_started_daemon_without_otlp_push_imports_none_of_them(
    daemon_factory: Any, spawn: Any
) -> None:
    # Python logs every import as it happens, later ones (a scrape, a registration)
    # too: the daemon's log then lists all it ever imported.
    daemon = daemon_factory(
        interval=0.2,
        env={"PYTHONPROFILEIMPORTTIME": "1", "OTEL_RESOURCE_ATTRIBUTES": "team=a%20b,bad"},
    )
    child = spawn("import time; time.sleep(60)")
    daemon.register(child.pid, labels={"run": "imports"})
    wait_for(lambda: 'run="imports"' in daemon.metrics_text(), timeout=10)
    (target_info,) = [x for x in daemon.metrics_text().splitlines() if x.startswith("target_")]
    daemon.stop()
    imported = re.findall(r"^import time:.*\| +(\S+)$", daemon.log(), re.MULTILINE)
    assert "edgewatt.exporter.exposition" in imported and "edgewatt.exporter.daemon" in imported
    assert [m for m in imported if m.startswith(HEAVY)] == []
    # and target_info is what it was: the SDK's attributes, the environment's.
    assert f'telemetry_sdk_version="{Resource.create().attributes["telemetry.sdk.version"]}"' in (
        target_info
    )
    assert 'team="a b"' in target_info and 'service_name="edgewatt"' in target_info
    assert "OTEL_RESOURCE_ATTRIBUTES: 'bad' is no key=value pair, left out" in daemon.log()


def test_the_running_daemon_imports_no_http_client_ssl_or_email(
    daemon_factory: Any, spawn: Any
) -> None:
    # http.server (for the API) and http.client (for InfluxDB, at import) brought ssl
    # (libssl mapped) and the email package: ~7 MiB of RSS. The real daemon,
    # default config, asked to serve what it serves; Python itself lists every import.
    daemon = daemon_factory(env={"PYTHONPROFILEIMPORTTIME": "1"})
    child = spawn("import time; time.sleep(60)")
    daemon.register(child.pid, labels={"run": "imports"})
    wait_for(lambda: f'pid="{child.pid}"' in daemon.metrics_text(), timeout=10)  # a scrape
    assert daemon.call("GET", "/v1/targets")[0] == 200
    assert daemon.call("GET", "/healthz")[1]["influx"] is None
    assert daemon.proc is not None
    with open(f"/proc/{daemon.proc.pid}/maps") as maps:
        libraries = {line.split()[-1] for line in maps if ".so" in line}
    assert [lib for lib in libraries if "libssl" in lib or "/_ssl." in lib] == []
    daemon.stop()
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in daemon.log().splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "edgewatt.exporter.unix_http" in imported  # the log lists the daemon's imports
    heavy = ("http.server", "http.client", "ssl", "_ssl", "email", "urllib.request")
    assert sorted(m for m in imported if m.split(".")[0] in heavy or m in heavy) == []
