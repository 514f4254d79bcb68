"""The /metrics endpoint: Prometheus text rendered straight from the latest snapshot.

The OTel SDK's Prometheus reader costs ~170 ms of CPU per scrape at 200 targets (it
re-aggregates every point, then prometheus_client re-sorts and re-escapes every label
set); this renders the same text in a few milliseconds, once per snapshot however many
scrapers ask (docs/performance.md). The names, types, HELP texts, label names and
label values are exactly what ``PrometheusMetricReader`` produces for the same
``METRICS`` table: family names and label keys come from the OTel exporter's own
mapping functions, and ``tests/test_exposition.py`` renders snapshots both ways and
compares them line for line. The OTel SDK stays the path for OTLP push
(``telemetry.OtelPipeline``).
"""

from __future__ import annotations

import gzip
import json
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
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
from edgewatt.exporter.telemetry import METRICS, MetricSpec

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


@dataclass(frozen=True, slots=True)
class _Labels:
    keys: tuple[str, ...]  # sanitized, sorted
    values: tuple[str, ...]  # escaped, in the order of keys
    braced: str  # {k1="v1",k2="v2"}, or "" without labels


class Exposition:
    """Renders ``METRICS`` for the latest snapshot and serves it over HTTP."""

    def __init__(self, resource: Resource, metrics: tuple[MetricSpec, ...] = METRICS) -> None:
        self._families = [_family(spec) for spec in metrics]
        self._labels = _LabelCache()
        info = self._labels.miss(resource.attributes)
        self._target_info = (
            "# HELP target_info Target metadata\n# TYPE target_info gauge\n"
            f"target_info{info.braced} 1.0\n"
        )
        self._numbers: dict[float, str] = {}  # value -> text, as of the last render
        self._snapshot: Snapshot | None = None
        self._rendered: tuple[int, bytes, bytes | None] | None = None  # sequence, text, gzip
        self._lock = threading.Lock()
        self._httpd: _PooledServer | None = None
        self._serving = False

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
            keys: tuple[str, ...] | None = None
            mixed = False
            for value, attributes in family.spec.observe(snapshot):
                hit = used.get(id(attributes))
                labels = (
                    hit[1] if hit is not None and hit[0] is attributes else cache.miss(attributes)
                )
                if labels.keys is not keys:
                    mixed = mixed or (keys is not None and labels.keys != keys)
                    keys = labels.keys
                if not value:  # 0.0 and -0.0 would be one key: two texts
                    number = _number(value, family)
                else:
                    number = numbers.get(value)
                    if number is None:
                        number = numbers_of.get(value) or floatToGoString(value)
                        numbers[value] = number
                lines.append(f"{name}{labels.braced} {number}\n")
            if not lines:
                continue
            out.append(family.header)
            if mixed:
                # Label sets differ between points: like the OTel exporter, write the
                # union of keys on every point, missing ones as "" (rare: observed again).
                out.extend(_backfilled(family, snapshot, cache))
            else:
                out.extend(lines)
        self._numbers = numbers
        return "".join(out).encode()

    def bind(self, host: str, port: int) -> int:
        """Bind and listen (connections wait in the backlog until serve()); returns the
        bound port. A port in use raises OSError here, before anything else started."""
        self._httpd = _PooledServer((host, port), _handler(self))
        return int(self._httpd.server_address[1])

    def serve(self) -> None:
        """Answer /metrics from a thread."""
        assert self._httpd is not None, "bind() first"
        threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True).start()
        self._serving = True

    def shutdown(self) -> None:
        if self._httpd is not None:
            if self._serving:  # shutdown() waits for serve_forever, which must run
                self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd, self._serving = None, False


class _LabelCache:
    """Rendered label sets, looked up by the identity of the attribute mapping (a
    target's is the same object every pass, so a dict lookup finds it) and, when that
    misses, by content (the small mappings of host figures are built afresh each
    pass). A render keeps only the entries it used: exited targets leave."""

    def __init__(self) -> None:
        # id(attributes) -> (attributes, labels): the entry holds the attributes, so
        # the id stays theirs while it is kept.
        self._by_id: dict[int, tuple[Mapping[str, Any], _Labels]] = {}
        self._used_ids: dict[int, tuple[Mapping[str, Any], _Labels]] = {}
        self._by_content: dict[tuple[tuple[str, Any], ...], _Labels] = {}
        self._used_content: dict[tuple[tuple[str, Any], ...], _Labels] = {}
        # One tuple object per distinct key set: points of one family compare keys
        # by identity first.
        self._keysets: dict[tuple[str, ...], tuple[str, ...]] = {}

    def start_render(self) -> dict[int, tuple[Mapping[str, Any], _Labels]]:
        """Begin a render; returns the by-identity entries it has used so far, for
        the renderer's own first lookup (a method call per point would cost more)."""
        self._by_id, self._used_ids = self._used_ids, {}
        self._by_content, self._used_content = self._used_content, {}
        return self._used_ids

    def miss(self, attributes: Mapping[str, Any]) -> _Labels:
        key = id(attributes)
        hit = self._by_id.get(key)
        if hit is None or hit[0] is not attributes:
            content = tuple(attributes.items())
            labels = self._used_content.get(content) or self._by_content.get(content)
            if labels is None:
                labels = self._render(attributes)
            self._used_content[content] = labels
            hit = (attributes, labels)
        self._used_ids[key] = hit
        return hit[1]

    def _render(self, attributes: Mapping[str, Any]) -> _Labels:
        labels: dict[str, str] = {}
        for key, value in attributes.items():
            labels[sanitize_attribute(key)] = _label_value(value)
        keys = tuple(sorted(labels))
        if len(self._keysets) > 1000:  # bounded whatever label names clients send
            self._keysets.clear()
        keys = self._keysets.setdefault(keys, keys)
        return _make_labels(keys, tuple(labels[k] for k in keys))


def _backfilled(family: _Family, snapshot: Snapshot, cache: _LabelCache) -> list[str]:
    points = [(value, cache.miss(a)) for value, a in family.spec.observe(snapshot)]
    keysets = {labels.keys for _, labels in points}
    return [
        f"{family.sample_name}{_backfill(labels, keysets).braced} {_number(value, family)}\n"
        for value, labels in points
    ]


def _number(value: float, family: _Family) -> str:
    if not value:
        return family.negative_zero if copysign(1.0, value) < 0 else "0.0"
    return floatToGoString(value)


def _backfill(labels: _Labels, keysets: set[tuple[str, ...]]) -> _Labels:
    have = dict(zip(labels.keys, labels.values, strict=True))
    keys = tuple(sorted(set().union(*keysets)))
    return _make_labels(keys, tuple(have.get(k, "") for k in keys))


def _make_labels(keys: tuple[str, ...], values: tuple[str, ...]) -> _Labels:
    text = ",".join(f'{k}="{v}"' for k, v in zip(keys, values, strict=True))
    return _Labels(keys, values, f"{{{text}}}" if text else "")


class _PooledServer(HTTPServer):
    """An HTTP server with a fixed set of worker threads.

    A thread per scrape would hand out a new pid on every scrape, and the parent index
    (``procfs.ParentIndex``) lists /proc again whenever the host's last pid moves.
    """

    workers = 4

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        # Before binding: a failed bind calls server_close(), which feeds the queue.
        self._queue: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        super().__init__(address, handler)
        for i in range(self.workers):
            threading.Thread(target=self._work, name=f"metrics-{i}", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._queue.put((request, client_address))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request, address = item
            try:
                self.finish_request(request, address)
            except Exception:
                self.handle_error(request, address)
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        for _ in range(self.workers):
            self._queue.put(None)


def _handler(exposition: Exposition) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # One request per connection (as prometheus_client's server): a kept-alive
        # idle connection would hold one of the few workers.
        protocol_version = "HTTP/1.0"
        timeout = 10  # seconds a client may take to send its request

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self._reply(404, b"not found: /metrics serves the metrics\n", "text/plain")
                return
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            body = exposition._current(gzipped=gzipped)
            self._reply(200, body, CONTENT_TYPE, gzipped=gzipped)

        def _reply(
            self, status: int, body: bytes, content_type: str, gzipped: bool = False
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape would flood the journal

    return Handler
