"""The /metrics endpoint: Prometheus text rendered straight from the latest snapshot.

The OTel SDK's Prometheus reader costs ~170 ms of CPU per scrape at 200 targets (it
re-aggregates every point, then prometheus_client re-sorts and re-escapes every label
set); this renders the same text in a few milliseconds, once per snapshot however many
scrapers ask (docs/performance.md). The names, types, HELP texts, label names and
label values are exactly what ``PrometheusMetricReader`` produces for the same
``METRICS`` table: family names are the table's (``Metric.prometheus_name``), label
keys and numbers follow the OTel exporter's rules, and ``tests/test_exposition.py``
renders snapshots both ways and compares them line for line. A target whose figures
did not change since the last render keeps its lines (most targets wait). One
difference: where points of a family differ in label names, each point here carries
its own, where the OTel exporter adds the others as "" (which Prometheus reads as
absent), so the text grows linearly with targets. The OTel SDK stays the path for
OTLP push (``telemetry.OtelPipeline``). The HTTP side is ``scrape_server.py``.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import threading
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from math import copysign
from operator import attrgetter
from typing import Any

from edgewatt.core.snapshot import ProcessSample, Snapshot
from edgewatt.core.text import shown
from edgewatt.core.uids import alone
from edgewatt.exporter.output import OutputStatus
from edgewatt.exporter.points import METRICS, MetricSpec
from edgewatt.exporter.scrape_server import Answer, Request, ScrapeServer, accepts_gzip

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
    per_target: bool  # one series set per target: its lines are kept per target


# A sample's fields that no metric reads: left out of the comparison that tells an
# unchanged target's figures (they move every pass; tests/test_exposition.py checks
# that changing them changes no point).
UNEXPORTED = frozenset({"time", "monotonic", "device_energy_j"})
_figures = attrgetter(*(f.name for f in fields(ProcessSample) if f.name not in UNEXPORTED))
_TARGET_ID = "edgewatt.target.id"  # in every target's attributes (registration reserves it)


class _Targets:
    """What a per-target metric's observer reads of a snapshot: its targets (here those
    whose lines are rendered again) and the carbon intensity."""

    __slots__ = ("carbon", "processes")

    def __init__(self, processes: tuple[ProcessSample, ...], carbon: object) -> None:
        self.processes = processes
        self.carbon = carbon


def _family(spec: MetricSpec) -> _Family:
    # The table's Prometheus name: the OTel exporter's mapping (the unit's suffix,
    # _total on counters), which tests/test_metrics.py checks against that exporter.
    sample_name = spec.metric.prometheus_name
    kind = "counter" if spec.kind == "counter" else "gauge"  # up-down counters: gauges
    help_text = spec.description.replace("\\", r"\\").replace("\n", r"\n")
    return _Family(
        spec,
        sample_name,
        f"# HELP {sample_name} {help_text}\n# TYPE {sample_name} {kind}\n",
        "-0.0" if spec.kind == "gauge" else "0.0",
        spec.metric.subject == "process",
    )


# The OTel Prometheus exporter's rules for label keys and numbers (its
# sanitize_attribute, prometheus_client's floatToGoString), written out here: importing
# them loads prometheus_client and the exporter, ~9 MiB of the daemon's memory for two
# small functions. tests/test_exposition.py renders through the real ones and compares.
_NOT_IN_KEY = re.compile(r"[^a-zA-Z0-9]+")


def sanitize_attribute(key: str) -> str:
    if key and key[0].isdigit():
        key = "_" + key[1:]
    return _NOT_IN_KEY.sub("_", key)


def float_to_go_string(value: float) -> str:
    if value == _INF:
        return "+Inf"
    if value == -_INF:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


_INF = float("inf")


def _label_value(value: object) -> str:
    # What the OTel exporter does: non-strings are written as JSON (pid 7 -> "7").
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


_Hit = typing.Tuple[typing.Mapping[str, Any], typing.Optional[str]]  # attributes, their labels
_Kept = typing.Tuple[
    typing.Tuple[Any, ...], typing.List[str], typing.Optional[int], typing.Dict[int, _Hit]
]


class Exposition:
    """Renders ``METRICS`` for the latest snapshot and serves it over HTTP (an
    ``Output``, output.py, bound first: bind())."""

    name = "exposition"

    def __init__(
        self, resource: Mapping[str, Any], metrics: tuple[MetricSpec, ...] = METRICS
    ) -> None:
        """``resource``: the resource's attributes (otel_resource.py), as target_info."""
        self._families = [_family(spec) for spec in metrics]
        self._per_target = sum(f.per_target for f in self._families)
        self._labels = _LabelCache()
        # The per-target families' label sets: a target whose lines are kept keeps its
        # own (carried from render to render), so that when its figures next move (a PSS
        # read, the safety re-read: every waiting target at once) none is written again.
        self._target_labels = _LabelCache()
        info = self._labels.miss(resource)
        self._target_info = (
            "# HELP target_info Target metadata\n# TYPE target_info gauge\n"
            f"target_info{info or ''} 1.0\n"
        )
        self._numbers: dict[float, str] = {}  # value -> text, as of the last render
        # target id -> (its figures, its lines of each per-target family, the pass whose
        # figures they are: Snapshot.figures_since, its label sets by the identity of
        # their attributes), as of the last render; with the carbon intensity they were
        # rendered with.
        self._kept: dict[str, _Kept] = {}
        self._kept_carbon: object = None
        # Each per-target family's text as of the last render, and the targets' order
        # it was joined in (None: no render yet): kept whole while no target's figures
        # changed.
        self._joined: list[str] = []
        self._order: tuple[str, ...] | None = None
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
        # A target whose figures are those of the last render keeps its lines (most
        # targets wait); the others' are rendered again, in one observation per family.
        kept, carbon = self._kept, snapshot.carbon
        same_carbon = carbon is self._kept_carbon
        lines_of: dict[str, _Kept] = {}
        changed = []
        since_of = snapshot.figures_since
        for p in snapshot.processes:
            entry = kept.get(p.target_id)
            since = since_of.get(p.target_id)
            if entry is not None and same_carbon and since is not None and since == entry[2]:
                lines_of[p.target_id] = entry  # the sampler says: the same figures
                continue
            figures = _figures(p)
            if entry is None or not same_carbon or entry[0] != figures:
                entry = (figures, [""] * self._per_target, since, {})
                changed.append(p)
            elif since != entry[2]:
                entry = (figures, entry[1], since, entry[3])
            lines_of[p.target_id] = entry
        self._kept, self._kept_carbon = lines_of, carbon
        targets = _Targets(tuple(changed), carbon)
        ids = tuple(lines_of)
        unchanged = not changed and ids == self._order
        joined = self._joined if unchanged else []
        self._joined, self._order = joined, ids
        order = [] if unchanged else [lines_of[p.target_id][1] for p in snapshot.processes]
        # Label sets and numbers are cached from render to render (an idle target's
        # figures repeat), keeping only what this render used: exited targets leave.
        cache, target_cache = self._labels, self._target_labels
        used, target_used = cache.start_render(), None
        if changed:  # the per-target families are observed for these targets only
            target_used = target_cache.start_render()
            renewed = {p.target_id for p in changed}
            for target_id, entry in lines_of.items():
                if target_id not in renewed:
                    target_used.update(entry[3])
        numbers_of = self._numbers
        numbers: dict[float, str] = {}
        slot = 0
        for family in self._families:
            name = family.sample_name
            lines: list[str] = []
            if family.per_target:
                if unchanged:  # every target's lines as they were, in the same order
                    text = joined[slot]
                    slot += 1
                    if text:
                        out.append(family.header)
                        out.append(text)
                    continue
                points = family.spec.observe(targets) if changed else ()  # type: ignore[arg-type]
                by_target: dict[str, list[str]] = {}
                found, source = target_used if target_used is not None else {}, target_cache
            else:
                points = family.spec.observe(snapshot)
                found, source = used, cache
            for value, attributes in points:
                key = id(attributes)
                hit = found.get(key)
                if hit is None or hit[0] is not attributes:  # its first use in this render
                    source.miss(attributes)
                    hit = found[key]
                    if family.per_target:  # kept with the target's lines
                        lines_of[attributes[_TARGET_ID]][3][key] = hit
                labels = hit[1]
                if labels is None:  # cannot be written (logged once): this point only
                    continue
                if not value:  # 0.0 and -0.0 would be one key: two texts
                    number = _number(value, family)
                else:
                    number = numbers.get(value)
                    if number is None:
                        number = numbers_of.get(value) or float_to_go_string(float(value))
                        numbers[value] = number
                # Each point with its own label names (the text format allows it). The
                # OTel exporter writes the family's union of names on every point, ""
                # where a point has none: with many distinct names that grows with
                # targets squared, for labels Prometheus reads as absent anyway.
                line = f"{name}{labels} {number}\n"
                if family.per_target:
                    by_target.setdefault(attributes[_TARGET_ID], []).append(line)
                else:
                    lines.append(line)
            if family.per_target:
                for target_id, texts in by_target.items():
                    lines_of[target_id][1][slot] = "".join(texts)
                lines = [kept_lines[slot] for kept_lines in order]
                slot += 1
            text = "".join(lines)
            if family.per_target:
                joined.append(text)
            if text:
                out.append(family.header)
                out.append(text)
        self._numbers = numbers
        return "".join(out).encode()

    def bind(self, host: str, port: int, person: Callable[[int], int] = alone) -> int:
        """Bind and listen (connections wait in the backlog until serve()); returns the
        bound port. A port in use raises OSError here, before anything else started.
        ``person``: whose share a local peer's connections take (ScrapeServer)."""
        self._server = ScrapeServer(host, port, self.respond, person)
        return self._server.port

    def serve(self) -> None:
        """Answer /metrics from a thread."""
        assert self._server is not None, "bind() first"
        self._server.serve()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def start(self) -> None:
        self.serve()

    def stop(self, deadline: float) -> None:
        self.shutdown()  # at once: a scrape in flight is cut short

    def report(self) -> OutputStatus | None:
        return None

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
    return float_to_go_string(float(value))
