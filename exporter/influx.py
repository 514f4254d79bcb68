"""InfluxDB as a store: the daemon's figures pushed over the line protocol.

- 1.x (and 3.x's v1 API): ``POST {url}/write?db=DATABASE&precision=ns``, user and
  password by Basic auth where set;
- 2.x and 3.x: ``POST {url}/api/v2/write?org=ORG&bucket=BUCKET&precision=ns`` with
  ``Authorization: Token TOKEN``.

Schema, one source of truth with /metrics: each metric of the table is a measurement
named as its Prometheus series without ``_total`` (``hw_power_watts``,
``edgewatt_process_energy_joules``, ``edgewatt_process_phase_energy_joules``), its
point's attributes are tags with dots as underscores (``host_name``, ``hw_name``,
``edgewatt_target_id``, ``edgewatt_phase``, the user's labels), and one float field,
``value``, in the metric's unit. So the power of each rail per host reads
``SELECT mean("value") FROM "hw_power_watts" GROUP BY time(10s), "host_name", "hw_name"``.

Every ``interval_s`` the latest pass's points are queued, and the final sample of each
target that exited since (its last point is its final figure, as its summary's); the
queue is written in gzip-compressed batches of at most 5,000 lines and 1 MiB. While the
server is unreachable, slow (each write has ``timeout_s`` for the whole exchange), or
answers with an error worth retrying (5xx, 429, 404: a database not created yet) or a
redirect (never followed: it would take the credentials elsewhere), the queue keeps up
to ``buffer_bytes`` (each line's bytes, its target's labels in them, and 48 for its
keeping), the oldest lines dropped beyond that (counted), with one warning when writes
start failing and one line when they work again. A batch is written only when the
server answers 2xx to it. A batch the server refuses as bad (400, 401, 403, 413) is
dropped with the server's reason: retrying would not change it.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import http.client
import logging
import math
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

from edgewatt.core.compat import name_thread
from edgewatt.core.http_exchange import Exchanges
from edgewatt.core.snapshot import Snapshot
from edgewatt.core.text import shown
from edgewatt.exporter.keys import InfluxOptions
from edgewatt.exporter.output import OutputStatus
from edgewatt.exporter.points import MetricSpec, metric_specs

log = logging.getLogger(__name__)

# Lines per request: InfluxDB advises batches of about 5,000 lines; and bytes, since a
# line carries its target's labels (up to 64 KiB of them): 5,000 such lines would make
# one request of ~280 MB.
BATCH_LINES = 5000
BATCH_BYTES = 1 << 20
# What keeping a queued line costs beside its bytes: the bytes object's header (33)
# and the deque's pointer, rounded up as the allocator does.
PER_LINE_BYTES = 48
RETRIED = {404, 429}  # and every 5xx


def write_url(options: InfluxOptions) -> str:
    base = options.url.rstrip("/")
    if options.database:
        return f"{base}/write?" + urllib.parse.urlencode(
            {"db": options.database, "precision": "ns"}
        )
    query = {"org": options.org, "bucket": options.bucket, "precision": "ns"}
    return f"{base}/api/v2/write?" + urllib.parse.urlencode(query)


def request_headers(options: InfluxOptions) -> dict[str, str]:
    headers = {"Content-Type": "text/plain; charset=utf-8", "Content-Encoding": "gzip"}
    if options.token:
        headers["Authorization"] = f"Token {options.token}"
    elif options.username:
        pair = f"{options.username}:{options.password}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    return headers


def escape_tag(text: str) -> str:
    """A tag key or value as the line protocol carries it (checked against InfluxDB
    1.6.7): commas, equals signs and spaces escaped; a backslash is literal, except
    that one ending the value would escape what follows, so a space follows it; line
    breaks, which no escape can carry, become spaces."""
    text = text.replace("\r", " ").replace("\n", " ")
    text = text.replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")
    if text.endswith("\\") and not text.endswith(r"\ "):
        text += r"\ "
    return text


def kept_bytes(data: bytes) -> int:
    """What a queued line counts against ``buffer_bytes``."""
    return len(data) + PER_LINE_BYTES


def measurement(spec: MetricSpec) -> str:
    name = spec.metric.prometheus_name
    return name[: -len("_total")] if name.endswith("_total") else name


def line(name: str, attributes: Mapping[str, Any], value: float, time_ns: int) -> str | None:
    """One point; None for a value the protocol cannot carry (NaN, infinity)."""
    number = float(value)
    if not math.isfinite(number):
        return None
    tags = "".join(
        f",{escape_tag(key.replace('.', '_'))}={escape_tag(str(v))}"
        for key, v in sorted(attributes.items())
        if str(v) != ""  # an empty tag value is not allowed: the tag is left out
    )
    return f"{name}{tags} value={number!r} {time_ns}"


def snapshot_lines(specs: tuple[MetricSpec, ...], snapshot: Snapshot) -> Iterator[str]:
    """The points of a pass, at the pass's time; then each exit sample's process points,
    at the sample's own time."""
    at = int(snapshot.time * 1e9)
    for spec in specs:
        name = measurement(spec)
        for value, attributes in spec.observe(snapshot):
            if (text := line(name, attributes, value, at)) is not None:
                yield text
    for sample in snapshot.exits:
        alone = dataclasses.replace(snapshot, processes=(sample,), exits=())
        at = int(sample.time * 1e9)
        for spec in specs:
            if spec.metric.subject != "process":
                continue
            name = measurement(spec)
            for value, attributes in spec.observe(alone):
                if (text := line(name, attributes, value, at)) is not None:
                    yield text


class InfluxPusher:
    """Queues the latest pass's lines every interval and writes them, on its thread (an
    ``Output``, output.py)."""

    name = "influx"

    def __init__(self, options: InfluxOptions) -> None:
        self.options = options
        self.specs = metric_specs()  # observers of its own (they keep a per-pass memo)
        self.queue: deque[bytes] = deque()  # encoded lines, oldest first
        self.queued_bytes = 0  # counted as the bound counts them (kept_bytes)
        self.dropped = 0  # lines dropped from a full buffer, since start
        self.dropped_bytes = 0
        self.refused = 0  # lines the server refused as bad, since start
        self.written = 0
        self.failing = False
        self.last_error = ""
        self._exchanges = Exchanges("influx-write")
        self._deadline = math.inf  # no write goes past it (set at close)
        self._latest: Snapshot | None = None
        self._queued_sequence = -1
        self._exits: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="influx", daemon=True)

    def start(self) -> None:
        self._thread.start()
        name_thread(self._thread)

    def report(self) -> OutputStatus:
        return OutputStatus(self.failing, self.status())

    def status(self) -> dict[str, Any]:
        busy = self._exchanges.busy_s()
        return {
            "failing": self.failing,
            "error": self.last_error if self.failing else None,
            # Seconds the write in flight has waited for its answer (null: none).
            "writing_s": None if busy is None else round(busy, 3),
            "queued_lines": len(self.queue),
            "queued_bytes": self.queued_bytes,
            "buffer_bytes": self.options.buffer_bytes,
            "written_lines": self.written,
            "dropped_lines": self.dropped,
            "dropped_bytes": self.dropped_bytes,
            "refused_lines": self.refused,
        }

    def update(self, snapshot: Snapshot) -> None:
        """Each pass (the sampler's thread): cheap, the lines are made on push."""
        with self._lock:
            self._latest = snapshot
            self._exits.extend(snapshot.exits)

    def _run(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            self.push()

    def push(self) -> None:
        """Queue the latest pass's lines (once per pass) and write what is queued."""
        with self._lock:
            latest, exits, self._exits = self._latest, self._exits, []
        if latest is not None and (latest.sequence != self._queued_sequence or exits):
            self._queued_sequence = latest.sequence
            self._enqueue(
                snapshot_lines(self.specs, dataclasses.replace(latest, exits=tuple(exits)))
            )
        while self.queue and time.monotonic() < self._deadline and self._write_batch():
            pass

    def _enqueue(self, lines: Iterator[str]) -> None:
        limit = self.options.buffer_bytes
        for text in lines:
            data = text.encode()
            self.queue.append(data)
            self.queued_bytes += kept_bytes(data)
            while self.queued_bytes > limit:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        size = kept_bytes(self.queue.popleft())
        self.queued_bytes -= size
        self.dropped += 1
        self.dropped_bytes += size
        if self.dropped == 1 or self.dropped % 100_000 == 0:
            log.warning(
                "InfluxDB buffer full (%d bytes): %d oldest lines (%d bytes) dropped so far",
                self.options.buffer_bytes,
                self.dropped,
                self.dropped_bytes,
            )

    def _write_batch(self) -> bool:
        """Write the oldest batch; False when the server is not taking writes now."""
        count, size = 0, 0
        for data in self.queue:
            if count == BATCH_LINES or (count and size + len(data) + 1 > BATCH_BYTES):
                break
            count, size = count + 1, size + len(data) + 1
        body = gzip.compress(b"".join(self.queue[i] + b"\n" for i in range(count)))
        deadline = min(time.monotonic() + self.options.timeout_s, self._deadline)
        url = write_url(self.options)
        try:
            answer = self._exchanges.post(url, body, request_headers(self.options), deadline)
        except (OSError, ValueError, http.client.HTTPException) as exc:  # unreachable, slow
            return self._failed(str(exc) or type(exc).__name__)
        reason = shown(answer.body.decode("utf-8", "replace").strip())
        if 200 <= answer.status < 300:
            self._done(count)
            self.written += count
            if self.failing:
                self.failing = False
                log.info("InfluxDB writes to %s work again", self.options.url)
            return True
        if 300 <= answer.status < 400:
            # Never followed: urllib did, as a GET without the body, to any host, with
            # the token; its 2xx there counted lines nobody wrote.
            where = shown(answer.location[:200])
            return self._failed(f"HTTP {answer.status} to {where}, not followed: set influx_url")
        if answer.status in RETRIED or answer.status >= 500 or answer.status < 200:
            return self._failed(f"HTTP {answer.status}: {reason}")
        self._done(count)
        self.refused += count
        log.warning("InfluxDB refused %d lines (HTTP %d): %s", count, answer.status, reason)
        return True

    def _done(self, count: int) -> None:
        for _ in range(count):
            self.queued_bytes -= kept_bytes(self.queue.popleft())

    def _failed(self, why: str) -> bool:
        self.last_error = why
        if not self.failing:
            self.failing = True
            log.warning(
                "InfluxDB writes to %s are failing (%s); keeping up to %d bytes of lines and "
                "retrying every %g s",
                self.options.url,
                why,
                self.options.buffer_bytes,
                self.options.interval_s,
            )
        return False

    def stop(self, deadline: float) -> None:
        """``close`` by ``deadline`` (time.monotonic())."""
        self.close(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float = 5.0) -> None:
        """A last push of what is queued; stopped within ``timeout_s`` whatever the
        server does (a write in flight then is cut short)."""
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(0.0, self._deadline - time.monotonic()))
            if self._thread.is_alive():
                self._exchanges.abort()
                self._thread.join(timeout=0.5)
                return
        self.push()
