"""One monitor reading as an OTLP/HTTP metrics request, with the daemon's names.

Built with the official ``opentelemetry-proto`` messages (a dependency of edgewatt,
imported only when a RemoteMonitor uses protocol="otlp"). Each request carries
absolute cumulative values, so a buffered request delivered late is still right.
"""

from __future__ import annotations

import time

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from edgewatt.client._samples import Reading
from edgewatt.core.metrics import BY_NAME, HOST_HW_ID

_START_NS = time.time_ns()
_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _attrs(values: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items()]


def _point(value: float, t_ns: int, attrs: dict[str, str]) -> NumberDataPoint:
    return NumberDataPoint(
        as_double=float(value),
        time_unix_nano=t_ns,
        start_time_unix_nano=_START_NS,
        attributes=_attrs(attrs),
    )


def _metric(name: str, points: list[NumberDataPoint]) -> Metric:
    """A metric of the table (name, unit, description, instrument) with these points."""
    spec = BY_NAME[name]
    if spec.instrument == "gauge":
        return Metric(
            name=name, unit=spec.unit, description=spec.description, gauge=Gauge(data_points=points)
        )
    return Metric(
        name=name,
        unit=spec.unit,
        description=spec.description,
        sum=Sum(
            data_points=points,
            aggregation_temporality=_CUMULATIVE,
            is_monotonic=spec.instrument == "counter",
        ),
    )


def encode(reading: Reading, labels: dict[str, str]) -> bytes:
    t = int(reading.time * 1e9)
    host = {"host.name": labels.get("host.name", "")}
    metrics = [
        _metric(
            "process.cpu.time",
            [
                _point(reading.cpu_user_s, t, {**labels, "cpu.mode": "user"}),
                _point(reading.cpu_system_s, t, {**labels, "cpu.mode": "system"}),
            ],
        ),
        _metric("process.memory.usage", [_point(reading.memory_rss_bytes, t, labels)]),
    ]
    if reading.net_sent_total is not None:
        metrics.append(
            _metric(
                "system.network.io",
                [
                    _point(reading.net_sent_total, t, {**host, "network.io.direction": "transmit"}),
                    _point(
                        reading.net_recv_total or 0, t, {**host, "network.io.direction": "receive"}
                    ),
                ],
            )
        )
    device = {**host, "hw.id": HOST_HW_ID}
    if reading.power_w is not None:
        metrics.append(_metric("hw.host.power", [_point(reading.power_w, t, device)]))
    if reading.energy_j is not None:
        metrics.append(_metric("hw.host.energy", [_point(reading.energy_j, t, device)]))
    if reading.process_energy_j is not None:
        metrics.append(
            _metric("edgewatt.process.energy", [_point(reading.process_energy_j, t, labels)])
        )
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource(attributes=_attrs({"service.name": "edgewatt-client", **host})),
                scope_metrics=[
                    ScopeMetrics(
                        scope=InstrumentationScope(name="edgewatt.client"), metrics=metrics
                    )
                ],
            )
        ]
    )
    return request.SerializeToString()
