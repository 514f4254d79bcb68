"""The metric table (edgewatt.core.metrics) is the one declaration: /metrics, the OTLP
pipeline, the client's sinks and the README are derived from it."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_full_name
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from edgewatt.client._otlp import encode
from edgewatt.client._samples import Reading
from edgewatt.client._sinks import PrometheusSink
from edgewatt.core import compat
from edgewatt.core.metrics import BY_NAME, INSTRUMENTS, TABLE, Metric, markdown_table
from edgewatt.core.snapshot import PhaseFigures, ProcessSample
from edgewatt.exporter import points
from edgewatt.exporter.points import METRICS, observers
from tests.conftest import ROOT
from tests.semconv import REQUIRED_1_44


def test_the_table_imports_no_opentelemetry() -> None:
    tree = ast.parse((ROOT / "core" / "metrics.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {name for name in imported if name.startswith(("opentelemetry", "prometheus"))}


def test_every_metric_is_well_formed_and_observed_once() -> None:
    assert len(BY_NAME) == len(TABLE)  # no name twice
    assert all(m.instrument in INSTRUMENTS and m.unit and m.description for m in TABLE)
    assert set(observers()) == set(BY_NAME)
    assert [s.name for s in METRICS] == [m.name for m in TABLE]


# A sample field's name says its unit; the row reading it declares the same one.
FIELD_SUFFIX_UNIT = {"_bytes": "By", "_s": "s", "_w": "W", "_j": "J", "_utilization": "1"}


def test_each_per_target_row_names_the_sample_fields_it_reads_in_its_unit() -> None:
    derived = [m for m in TABLE if m.field or m.split]
    assert {m.name for m in derived} >= {
        m.name for m in TABLE if m.subject == "process" and m.name != "edgewatt.process.carbon"
    }
    for m in derived:
        assert m.subject == "process", m.name
        record = PhaseFigures if m.per_phase else ProcessSample
        assert bool(m.field) != bool(m.split), m.name  # one or the other
        if m.split:  # split by the metric's one attribute
            assert len(m.attributes) == 1, m.name
        fields = [m.field] if m.field else [name for _, name in m.split]
        for name in fields:
            assert hasattr(record, name), (m.name, name)
            suffix = [s for s in FIELD_SUFFIX_UNIT if name.endswith(s)]
            if suffix:
                assert FIELD_SUFFIX_UNIT[suffix[0]] == m.unit, (m.name, name)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"field": "memory_psss_bytes"}, "ProcessSample has no field 'memory_psss_bytes'"),
        ({"field": "energy_j", "per_phase": True, "name": "x.phase"}, None),
        ({"field": "energyj", "per_phase": True}, "PhaseFigures has no field 'energyj'"),
        ({"field": ""}, "name a sample field or compute it"),
    ],
)
def test_a_row_is_checked_when_the_observers_are_built(
    change: dict[str, object], problem: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = dataclasses.replace(
        Metric("edgewatt.process.memory.test", "updowncounter", "By", "a test row"), **change
    )
    monkeypatch.setattr(points, "TABLE", (*TABLE, row))
    if problem is None:
        assert row.name in points.observers()
        return
    with pytest.raises(ValueError, match=problem):
        points.observers()


def test_prometheus_names_are_the_otel_exporters() -> None:
    # The table's own derivation against the OTel Prometheus exporter's mapping.
    for m in TABLE:
        expected = sanitize_full_name(m.name)
        unit = map_unit(m.unit)
        if unit and not expected.endswith("_" + unit):
            expected += "_" + unit
        if m.instrument == "counter":
            expected += "_total"
        assert m.prometheus_name == expected, m.name
    assert BY_NAME["process.cpu.time"].prometheus_name == "process_cpu_time_seconds_total"
    assert BY_NAME["hw.host.power"].prometheus_name == "hw_host_power_watts"
    assert BY_NAME["process.threads"].prometheus_name == "process_threads"


def test_the_readme_metric_table_is_rendered_from_the_table() -> None:
    readme = (ROOT / "docs" / "reference.md").read_text()
    start = readme.index("<!-- metric-table")
    block = readme[readme.index("\n", start) + 1 : readme.index("<!-- /metric-table -->")]
    assert block == markdown_table()
    assert all(f"`{m.name}`" in block for m in TABLE)


# What a monitor exports of a reading, in the order the client emits it.
CLIENT_METRICS = (
    "process.cpu.time",
    "process.memory.usage",
    "system.network.io",
    "hw.host.power",
    "hw.host.energy",
    "edgewatt.process.energy",
)

READING = Reading(
    time=1_800_000_000.5,
    cpu_user_s=1.25,
    cpu_system_s=0.5,
    memory_rss_bytes=123_456,
    memory_total_bytes=8 * 2**30,
    net_sent_total=1000,
    net_recv_total=2000,
    power_w=7.5,
    energy_j=30.0,
    rails_w={},
    process_energy_j=4.0,
    carbon=None,
)


def test_the_client_prometheus_sink_takes_names_and_help_from_the_table() -> None:
    sink = PrometheusSink(port=0)
    sink._labels = {"process_pid": "42", "host_name": "jetson-a"}
    sink._latest = READING
    families = {f.name: f for f in sink.collect()}
    for name in CLIENT_METRICS:
        metric = BY_NAME[name]
        family = families[compat.removesuffix(metric.prometheus_name, "_total")]
        assert family.documentation == metric.description
        assert family.type == ("counter" if metric.instrument == "counter" else "gauge")
        for sample in family.samples:
            assert sample.labels["host_name"] == "jetson-a"
    cpu = families["process_cpu_time_seconds"].samples
    assert {(s.name, s.labels["cpu_mode"], s.value) for s in cpu} == {
        ("process_cpu_time_seconds_total", "user", 1.25),
        ("process_cpu_time_seconds_total", "system", 0.5),
    }


def test_the_client_otlp_request_takes_names_units_and_kinds_from_the_table() -> None:
    request = ExportMetricsServiceRequest.FromString(
        encode(READING, {"host.name": "jetson-a", "process.pid": "42"})
    )
    (metrics,) = [s.metrics for r in request.resource_metrics for s in r.scope_metrics]
    assert [m.name for m in metrics] == list(CLIENT_METRICS)
    for m in metrics:
        spec = BY_NAME[m.name]
        assert (m.unit, m.description) == (spec.unit, spec.description)
        kind = m.WhichOneof("data")
        if spec.instrument == "gauge":
            assert kind == "gauge"
        else:
            assert kind == "sum" and m.sum.is_monotonic == (spec.instrument == "counter")
    energy = metrics[-1].sum.data_points[0]
    assert energy.as_double == 4.0


def test_metrics_named_by_the_semantic_conventions_declare_what_they_require() -> None:
    # Every metric of the table under a convention's name is that metric: same
    # instrument and unit, and its required attributes declared (hw.id on the host's
    # power and energy, cpu.mode on the CPU utilization).
    named = {m.name for m in TABLE if m.name.startswith(("process.", "hw.", "system."))}
    assert set(REQUIRED_1_44) <= set(BY_NAME)
    for name, (instrument, unit, required) in REQUIRED_1_44.items():
        m = BY_NAME[name]
        assert (m.instrument, m.unit) == (instrument, unit), name
        assert set(required) <= set(m.attributes), (name, m.attributes)
    # Outside the conventions, on purpose (the module's docstring says why).
    assert named - set(REQUIRED_1_44) == {"process.threads", "process.open_file_descriptors"}


def test_the_client_sinks_name_the_whole_device_hw_id_host() -> None:
    sink = PrometheusSink(port=0)
    sink._labels = {"process_pid": "42", "host_name": "jetson-a"}
    sink._latest = READING
    families = {f.name: f for f in sink.collect()}
    for family, value in (("hw_host_power_watts", 7.5), ("hw_host_energy_joules", 30.0)):
        (sample,) = families[family].samples
        assert sample.labels == {"host_name": "jetson-a", "hw_id": "host"}
        assert sample.value == value
    request = ExportMetricsServiceRequest.FromString(
        encode(READING, {"host.name": "jetson-a", "process.pid": "42"})
    )
    (metrics,) = [s.metrics for r in request.resource_metrics for s in r.scope_metrics]
    points = {m.name: getattr(m, m.WhichOneof("data")).data_points for m in metrics}
    for name, value in (("hw.host.power", 7.5), ("hw.host.energy", 30.0)):
        (point,) = points[name]
        attributes = {a.key: a.value.string_value for a in point.attributes}
        assert attributes == {"host.name": "jetson-a", "hw.id": "host"}
        assert point.as_double == value
