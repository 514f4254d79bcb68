"""The /metrics endpoint: Prometheus text rendered straight from the latest snapshot.

The OTel SDK's Prometheus reader costs ~170 ms of CPU per scrape at 200 targets (it
re-aggregates every point, then prometheus_client re-sorts and re-escapes every label
set); this renders the same text in a few milliseconds, once per snapshot however many
scrapers ask (docs/performance.md). The names, types, HELP texts, label names and
label values are exactly what ``PrometheusMetricReader`` produces for the same
``METRICS`` table: family names and label keys come from the OTel exporter's own
mapping functions, and ``tests/test_exposition.py`` renders snapshots both ways and
compares them line for line. One difference: where points of a family differ in label
names, each point here carries its own, where the OTel exporter adds the others as ""
(which Prometheus reads as absent), so the text grows linearly with targets. The OTel
SDK stays the path for OTLP push (``telemetry.OtelPipeline``). The HTTP side is
``scrape_server.py``.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from math import copysign
from typing import Any

from opentelemetry.exporter.prometheus._mapping import (
    map_unit,
    sanitize_attribute,
    sanitize_full_name,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from edgewatt.core.snapshot import Snapshot
from edgewatt.core.text import shown
from edgewatt.exporter.scrape_server import Answer, Request, ScrapeServer, accepts_gzip
from edgewatt.exporter.telemetry import METRICS, MetricSpec

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Small: rendering is what costs, and Prometheus asks for gzip on every scrape.
GZIP_LEVEL = 1


@dataclass(frozen=True)
class _Family:
    spec: MetricSpec
    sample_name: str  # counters end in _total here, as prometheus_client writes them
    header: str  # the HELP and TYPE lines
    negative_zero: str  # how -0.0 reads: the SDK's sums add it to 0, gauges keep it


def _family(spec: MetricSpec) -> _Family:
    # The same classes and arguments as the OTel exporter: prometheus_client appends
    # the unit and handles _total exactly as it does there.
    name, unit = sanitize_full_name(spec.name), map_unit(spec.unit)
    if spec.kind == "counter":
        family: Any = CounterMetricFamily(name, spec.description, unit=unit)
        sample_name, kind = family.name + "_total", "counter"
    else:  # gauges, and up-down counters (cumulative non-monotonic sums)
        family = GaugeMetricFamily(name, spec.description, unit=unit)
        sample_name, kind = family.name, "gauge"
    help_text = spec.description.replace("\\", r"\\").replace("\n", r"\n")
    return _Family(
        spec,
        sample_name,
        f"# HELP {sample_name} {help_text}\n# TYPE {sample_name} {kind}\n",
        "-0.0" if spec.kind == "gauge" else "0.0",
    )


def _label_value(value: object) -> str:
    # What the OTel exporter does: non-strings are written as JSON (pid 7 -> "7").
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Exposition:
    """Renders ``METRICS`` for the latest snapshot and serves it over HTTP."""

    def __init__(self, resource: Resource, metrics: tuple[MetricSpec, ...] = METRICS) -> None:
        self._families = [_family(spec) for spec in metrics]
        self._labels = _LabelCache()
        info = self._labels.miss(resource.attributes)
        self._target_info = (
            "# HELP target_info Target metadata\n# TYPE target_info gauge\n"
            f"target_info{info or ''} 1.0\n"
        )
        self._numbers: dict[float, str] = {}  # value -> text, as of the last render
        self._snapshot: Snapshot | None = None
        self._rendered: tuple[int, bytes, bytes | None] | None = None  # sequence, text, gzip
        self._lock = threading.Lock()
        self._server: ScrapeServer | None = None

    def update(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def render(self) -> bytes:
        return self._current(gzipped=False)

    def _current(self, *, gzipped: bool) -> bytes:
        with self._lock:
            snapshot = self._snapshot
            if snapshot is None:
                return b""
            if self._rendered is None or self._rendered[0] != snapshot.sequence:
                self._rendered = (snapshot.sequence, self._render(snapshot), None)
            sequence, text, packed = self._rendered
            if not gzipped:
                return text
            if packed is None:
                packed = gzip.compress(text, GZIP_LEVEL)
                self._rendered = (sequence, text, packed)
            return packed

    def _render(self, snapshot: Snapshot) -> bytes:
        out = [self._target_info]
        # Label sets and numbers are cached from render to render (an idle target's
        # figures repeat), keeping only what this render used: exited targets leave.
        cache = self._labels
        used = cache.start_render()
        numbers_of = self._numbers
        numbers: dict[float, str] = {}
        for family in self._families:
            name = family.sample_name
            lines = []
            for value, attributes in family.spec.observe(snapshot):
                hit = used.get(id(attributes))
                labels = (
                    hit[1] if hit is not None and hit[0] is attributes else cache.miss(attributes)
                )
                if labels is None:  # cannot be written (logged once): this point only
                    continue
                if not value:  # 0.0 and -0.0 would be one key: two texts
                    number = _number(value, family)
                else:
                    number = numbers.get(value)
                    if number is None:
                        number = numbers_of.get(value) or floatToGoString(value)
                        numbers[value] = number
                # Each point with its own label names (the text format allows it). The
                # OTel exporter writes the family's union of names on every point, ""
                # where a point has none: with many distinct names that grows with
                # targets squared, for labels Prometheus reads as absent anyway.
                lines.append(f"{name}{labels} {number}\n")
            if lines:
                out.append(family.header)
                out.extend(lines)
        self._numbers = numbers
        return "".join(out).encode()

    def bind(self, host: str, port: int) -> int:
        """Bind and listen (connections wait in the backlog until serve()); returns the
        bound port. A port in use raises OSError here, before anything else started."""
        self._server = ScrapeServer(host, port, self.respond)
        return self._server.port

    def serve(self) -> None:
        """Answer /metrics from a thread."""
        assert self._server is not None, "bind() first"
        self._server.serve()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def respond(self, request: Request) -> Answer:
        if request.path not in ("/metrics", "/"):
            body = b"not found: /metrics serves the metrics\n"
            return Answer(404, "Not Found", body, (("Content-Type", "text/plain"),))
        gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
        headers = [("Content-Type", CONTENT_TYPE)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return Answer(200, "OK", self._current(gzipped=gzipped), tuple(headers))


class _LabelCache:
    """Rendered label sets, looked up by the identity of the attribute mapping (a
    target's is the same object every pass, so a dict lookup finds it) and, when that
    misses, by content (the small mappings of host figures are built afresh each
    pass). A render keeps only the entries it used: exited targets leave. A label set
    that cannot be written as UTF-8 is None: its points are left out, logged once."""

    def __init__(self) -> None:
        # id(attributes) -> (attributes, labels): the entry holds the attributes, so
        # the id stays theirs while it is kept.
        self._by_id: dict[int, tuple[Mapping[str, Any], str | None]] = {}
        self._used_ids: dict[int, tuple[Mapping[str, Any], str | None]] = {}
        self._by_content: dict[tuple[tuple[str, Any], ...], str | None] = {}
        self._used_content: dict[tuple[tuple[str, Any], ...], str | None] = {}
        self._unwritable: set[object] = set()  # targets logged as unwritable

    def start_render(self) -> dict[int, tuple[Mapping[str, Any], str | None]]:
        """Begin a render; returns the by-identity entries it has used so far, for
        the renderer's own first lookup (a method call per point would cost more)."""
        self._by_id, self._used_ids = self._used_ids, {}
        self._by_content, self._used_content = self._used_content, {}
        return self._used_ids

    def miss(self, attributes: Mapping[str, Any]) -> str | None:
        key = id(attributes)
        hit = self._by_id.get(key)
        if hit is None or hit[0] is not attributes:
            content = tuple(attributes.items())
            if content in self._used_content:
                labels = self._used_content[content]
            elif content in self._by_content:
                labels = self._by_content[content]
            else:
                labels = _render_labels(attributes)
                if labels is None:
                    self._say_unwritable(attributes)
            self._used_content[content] = labels
            hit = (attributes, labels)
        self._used_ids[key] = hit
        return hit[1]

    def _say_unwritable(self, attributes: Mapping[str, Any]) -> None:
        """Log once per target (its series have several label sets)."""
        target = attributes.get("edgewatt.target.id", "")
        if target in self._unwritable:
            return
        if len(self._unwritable) > 1000:
            self._unwritable.clear()
        self._unwritable.add(target)
        log.error(
            "target %s: labels %s cannot be written as UTF-8; its series are left out of /metrics",
            shown(target),
            shown(dict(attributes)),
        )


def _render_labels(attributes: Mapping[str, Any]) -> str | None:
    """{k1="v1",k2="v2"}, keys sanitized and sorted, values escaped; "" for none."""
    labels: dict[str, str] = {}
    for key, value in attributes.items():
        labels[sanitize_attribute(key)] = _label_value(value)
    keys = tuple(sorted(labels))
    text = ",".join(f'{k}="{labels[k]}"' for k in keys)
    braced = f"{{{text}}}" if text else ""
    try:
        braced.encode()
    except UnicodeEncodeError:
        # Registration refuses what cannot be encoded; this guards whatever slips
        # past it, so one target can never break every scrape.
        return None
    return braced


def _number(value: float, family: _Family) -> str:
    if not value:
        return family.negative_zero if copysign(1.0, value) < 0 else "0.0"
    return floatToGoString(value)
