"""OTLP push beside the Prometheus endpoint: devices behind NAT send their metrics.

The exporter classes are built here from the daemon's config (which already folded
in the standard ``OTEL_EXPORTER_OTLP_*`` variables), so nothing depends on what the
SDK reads from the environment by itself. Temporality is cumulative, as on the
Prometheus path. A collector that is down costs the export thread only: each export
gives up after ``otlp_timeout``, the batch is dropped (the next one carries the same
cumulative values), and the failure is logged once per outage, not once per retry.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from edgewatt.exporter.keys import OtlpOptions

log = logging.getLogger(__name__)


def metrics_url(endpoint: str) -> str:
    """OTLP/HTTP: the base endpoint gets /v1/metrics appended, as the spec says."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/metrics") else endpoint + "/v1/metrics"


def build_exporter(options: OtlpOptions) -> MetricExporter:
    headers = dict(options.headers or {})
    if options.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        scheme, _, rest = options.endpoint.partition("://")
        target = rest if rest else options.endpoint
        insecure = options.insecure or scheme == "http"
        credentials = None
        if options.ca_file and not insecure:
            with open(options.ca_file, "rb") as f:
                credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        return OTLPMetricExporter(
            endpoint=target,
            insecure=insecure,
            credentials=credentials,
            headers=headers,
            timeout=options.timeout_s,
        )
    import requests
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    class NoRedirects(requests.Session):
        """A 3xx is never followed: the batch fails (OutageLoggingExporter logs why)
        and its headers, a token among them, go to the configured endpoint alone,
        never to a host a redirect names. Raised, since the exporter
        would take a 3xx for success (requests' ``ok`` is any status below 400)."""

        def send(self, request: Any, **kwargs: Any) -> requests.Response:
            response = super().send(request, **{**kwargs, "allow_redirects": False})
            if 300 <= response.status_code < 400:
                where = response.headers.get("Location", "")
                raise requests.RequestException(
                    f"the collector answered {response.status_code} towards "
                    f"{where[:200]!r}: a redirect is not followed"
                )
            return response

    return OTLPMetricExporter(
        endpoint=metrics_url(options.endpoint),
        certificate_file=options.ca_file or None,
        headers=headers,
        timeout=options.timeout_s,
        session=NoRedirects(),
        # gzip unless the standard variables ask otherwise (None: the SDK reads them):
        # metrics text compresses ~10x, and a device's uplink is often metered.
        compression=None if _compression_asked() else Compression.Gzip,
    )


def _compression_asked() -> bool:
    return any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION")
    )


class OutageLoggingExporter(MetricExporter):
    """Wraps an exporter: one warning when exports start failing, one line when they
    work again; never an exception into the SDK's export thread."""

    def __init__(self, inner: MetricExporter, endpoint: str) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.endpoint = endpoint
        self.failing = False
        self.failures = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # the SDK thread must never see it
            log.debug("OTLP export raised: %s", exc)
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.FAILURE:
            self.failures += 1
            if not self.failing:
                self.failing = True
                log.warning("OTLP export to %s is failing; retrying every interval", self.endpoint)
        elif self.failing:
            self.failing = False
            log.info("OTLP export to %s works again", self.endpoint)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def build_reader(options: OtlpOptions) -> PeriodicExportingMetricReader:
    # The exporters log every retry; this module logs once per outage instead.
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.ERROR)
    exporter = OutageLoggingExporter(build_exporter(options), options.endpoint)
    return PeriodicExportingMetricReader(
        exporter,
        export_interval_millis=options.interval_s * 1000,
        export_timeout_millis=options.timeout_s * 1000,
    )
