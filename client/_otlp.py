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


def _sum(name: str, unit: str, points: list[NumberDataPoint], monotonic: bool) -> Metric:
    return Metric(
        name=name,
        unit=unit,
        sum=Sum(data_points=points, aggregation_temporality=_CUMULATIVE, is_monotonic=monotonic),
    )


def encode(reading: Reading, labels: dict[str, str]) -> bytes:
    t = int(reading.time * 1e9)
    host = {"host.name": labels.get("host.name", "")}
    metrics = [
        _sum(
            "process.cpu.time",
            "s",
            [
                _point(reading.cpu_user_s, t, {**labels, "cpu.mode": "user"}),
                _point(reading.cpu_system_s, t, {**labels, "cpu.mode": "system"}),
            ],
            monotonic=True,
        ),
        _sum("process.memory.usage", "By", [_point(reading.memory_rss_bytes, t, labels)], False),
    ]
    if reading.net_sent_total is not None:
        metrics.append(
            _sum(
                "system.network.io",
                "By",
                [
                    _point(reading.net_sent_total, t, {**host, "network.io.direction": "transmit"}),
                    _point(
                        reading.net_recv_total or 0, t, {**host, "network.io.direction": "receive"}
                    ),
                ],
                monotonic=True,
            )
        )
    if reading.power_w is not None:
        metrics.append(
            Metric(
                name="hw.host.power",
                unit="W",
                gauge=Gauge(data_points=[_point(reading.power_w, t, host)]),
            )
        )
    if reading.energy_j is not None:
        metrics.append(_sum("hw.host.energy", "J", [_point(reading.energy_j, t, host)], True))
    if reading.process_energy_j is not None:
        metrics.append(
            _sum(
                "edgewatt.process.energy", "J", [_point(reading.process_energy_j, t, labels)], True
            )
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
