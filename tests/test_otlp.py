"""OTLP push from the real daemon to receivers that decode with opentelemetry-proto."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from benchmarks.measure import rss_bytes
from tests.conftest import ROOT, wait_for
from tests.semconv import REQUIRED_1_44

TEGRASTATS = str(ROOT / "tests" / "bin" / "tegrastats")


class Received:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []

    def target_metrics(self, target: str) -> dict[str, Any]:
        """The newest data points carrying edgewatt.target.id == target, by metric name."""
        found: dict[str, Any] = {}
        for request in self.requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            attrs = {a.key: a.value for a in point.attributes}
                            tid = attrs.get("edgewatt.target.id")
                            if tid is not None and tid.string_value == target:
                                found[metric.name] = (metric, attrs, rm.resource)
        return found

    def points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """Every data point of metric ``name`` received: (attributes, value)."""
        found = []
        for request in self.requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name:
                            data = getattr(metric, metric.WhichOneof("data"))
                            found.extend(
                                ({a.key: _value(a.value) for a in p.attributes}, p.as_double)
                                for p in data.data_points
                            )
        return found


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/metrics"
            received.requests.append(ExportMetricsServiceRequest.FromString(body))
            received.headers.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            received.requests.append(request)
            received.headers.append(dict(context.invocation_metadata()))
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", received
    server.stop(0)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_push_names_units_attributes_resource(
    protocol: str, daemon_factory: Any, spawn: Any, request: Any
) -> None:
    fixture = "http_receiver" if protocol == "http/protobuf" else "grpc_receiver"
    endpoint, received = request.getfixturevalue(fixture)
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--otlp-endpoint", endpoint, "--otlp-protocol", protocol],
        env={
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cret",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=lab",
        },
    )
    child = spawn("while True: pass")
    tid = daemon.register(child.pid, labels={"run": "otlp"})["id"]
    metrics = wait_for(
        lambda: (m := received.target_metrics(tid)) and "process.cpu.time" in m and m,
        timeout=20,
        step=0.2,
    )
    cpu, attrs, resource = metrics["process.cpu.time"]
    assert cpu.unit == "s" and cpu.sum.is_monotonic
    assert cpu.sum.aggregation_temporality == 2  # cumulative
    assert attrs["run"].string_value == "otlp"
    assert attrs["process.pid"].int_value == child.pid
    assert metrics["process.memory.usage"][0].unit == "By"
    res = {a.key: a.value.string_value for a in resource.attributes}
    assert res["service.name"] == "edgewatt" and res["deployment.environment"] == "lab"
    assert res["host.arch"] in ("amd64", "arm64") and res["os.type"] == "linux"
    assert len(res["service.instance.id"]) >= 16 and res["host.name"]
    headers = {k.lower(): v for k, v in received.headers[-1].items()}
    assert headers["authorization"] == "Bearer s3cret"
    if protocol == "http/protobuf":  # gzip unless OTEL_EXPORTER_OTLP_COMPRESSION says
        assert headers["content-encoding"] == "gzip"


def test_pushed_points_carry_what_the_semantic_conventions_require(
    http_receiver: tuple[str, Received], daemon_factory: Any, spawn: Any
) -> None:
    # Semantic conventions v1.44 (tests/semconv.py): every point of a metric under a
    # convention's name carries its required attributes: hw.id on the device's power
    # and energy, cpu.mode on a target's CPU utilization.
    endpoint, received = http_receiver
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--otlp-endpoint", endpoint, "--tegrastats", TEGRASTATS],
        env={"OTEL_METRIC_EXPORT_INTERVAL": "500", "EDGEWATT_POWER_SOURCES": "tegrastats"},
    )
    tid = daemon.register(spawn("while True: pass").pid)["id"]
    wanted = ("hw.host.power", "hw.host.energy", "process.cpu.utilization")
    wait_for(lambda: all(received.points(n) for n in wanted), timeout=20, step=0.2)
    for name, (_, _, required) in REQUIRED_1_44.items():
        for attributes, _ in received.points(name):
            assert set(required) <= set(attributes), (name, attributes)
    for name in ("hw.host.power", "hw.host.energy"):
        assert {a["hw.id"] for a, _ in received.points(name)} == {"host"}
    modes = {
        a["cpu.mode"]
        for a, _ in received.points("process.cpu.utilization")
        if a["edgewatt.target.id"] == tid
    }
    assert modes == {"user", "system"}


def test_otlp_compression_variable_wins_over_the_gzip_default(
    http_receiver: tuple[str, Any], daemon_factory: Any
) -> None:
    endpoint, received = http_receiver
    daemon_factory(
        extra_args=["--otlp-endpoint", endpoint],
        env={"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_COMPRESSION": "none"},
    )
    wait_for(lambda: received.headers, timeout=20, step=0.1)
    assert "Content-Encoding" not in received.headers[0]


def test_collector_down_scrapes_stay_fast_one_log_line_quick_stop(daemon_factory: Any) -> None:
    # A collector that accepts connections and never answers: the worst case.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    held: list[socket.socket] = []
    threading.Thread(
        target=lambda: [held.append(silent.accept()[0]) for _ in range(64)], daemon=True
    ).start()
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--otlp-endpoint", f"http://127.0.0.1:{silent.getsockname()[1]}"],
        env={"EDGEWATT_OTLP_INTERVAL": "1", "EDGEWATT_OTLP_TIMEOUT": "0.5"},
    )
    assert daemon.proc is not None
    rss = []
    latencies = []
    for _ in range(20):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5) as r:
            r.read()
        latencies.append(time.perf_counter() - started)
        rss.append(rss_bytes(daemon.proc.pid))
        time.sleep(0.3)
    assert sorted(latencies)[-2] < 0.1  # scrapes never wait for the collector
    assert rss[-1] - rss[5] < 5 * 2**20  # flat while every export fails
    log = daemon.log()
    assert log.count("OTLP export to http://127.0.0.1") == 1  # once per outage
    assert daemon.stop() < 3.0
    silent.close()


def test_resource_device_facts(tmp_path: Any) -> None:
    from edgewatt.exporter.otel_resource import device_facts

    (tmp_path / "device-tree").mkdir()
    (tmp_path / "device-tree" / "model").write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\0")
    (tmp_path / "nv_tegra_release").write_text(
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n"
    )
    assert device_facts(str(tmp_path), str(tmp_path)) == {
        "device.model.name": "NVIDIA Jetson Orin Nano Developer Kit",
        "edgewatt.l4t.release": "36.4.3",
    }
    assert device_facts(str(tmp_path / "none"), str(tmp_path / "none")) == {}


def test_a_redirect_is_not_followed_and_the_batch_is_not_counted_as_sent() -> None:
    # A collector answering 307 (which keeps method and body) towards another host:
    # nothing reaches that host, neither the batch nor the configured headers, and
    # the export is a failure, not a batch sent.
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    from edgewatt.exporter.otlp import OtlpOptions, OutageLoggingExporter, build_exporter

    elsewhere: list[dict[str, str]] = []

    def serve(answer: Any) -> ThreadingHTTPServer:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                answer(self)

            def log_message(self, *args: Any) -> None: ...

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def take(handler: BaseHTTPRequestHandler) -> None:
        elsewhere.append(dict(handler.headers))
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    other = serve(take)
    where = f"http://127.0.0.2:{other.server_address[1]}/v1/metrics"

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("Location", where)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    collector = serve(redirect)
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        # Wrapped as the daemon wraps it (older SDKs let the session's error out).
        exporter = OutageLoggingExporter(
            build_exporter(
                OtlpOptions(endpoint=endpoint, headers={"x-api-key": "s3cret"}, timeout_s=2.0)
            ),
            endpoint,
        )
        result = exporter.export(MetricsData(resource_metrics=[]), timeout_millis=2000)
        exporter.shutdown()
        assert result is MetricExportResult.FAILURE
        assert elsewhere == []
    finally:
        for server in (collector, other):
            server.shutdown()
            server.server_close()
