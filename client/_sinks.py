"""Where a monitor's samples go: heflwr's text file or a JSON Lines file, a remote
server, a /metrics port (heflwr's gauges or the daemon's names)."""

from __future__ import annotations

import collections
import contextlib
import datetime
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
from typing import Any

from edgewatt.client._samples import Reading, units
from edgewatt.client.heflwr import records as _heflwr
from edgewatt.core import compat
from edgewatt.core.http_exchange import Exchanges
from edgewatt.core.metrics import BY_NAME, HOST_HW_ID

log = logging.getLogger(__name__)


def measured_phases(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A summary's phases that carry figures (the daemon's summary items), not the
    bare marks of Monitor.phase()."""
    return [p for p in summary.get("phases") or [] if "duration_s" in p]


class FileSink:
    """JSON Lines: a header, one line per sample, a summary line; each line written
    whole with one write(2).

    An unwritable path fails at start(). A write failing later (disk full) is warned
    about once, the line it cut is taken back (the file ends after the last whole
    record) and nothing more is written: a reader finds whole records, and
    ``failure`` says what was kept; monitoring goes on.
    """

    # Its sample rows are written once their device energy is final (_final_rows.py).
    final_rows = True

    def __init__(self, path: str, network: str = "host") -> None:
        self.path = path
        self.network = network  # what its network bytes count (the header's units say)
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._whole = 0  # the file's size after the last whole record
        self.lines = 0  # written whole by this sink
        self.failure: str | None = None  # why writing stopped, with what was kept

    def start(self, header: dict[str, Any]) -> None:
        self._open()
        self._write({"type": "header", **header, "units": units(self.network)})

    def _open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            self._whole = os.fstat(self._fd).st_size
        except OSError as exc:
            raise OSError(f"cannot write monitor file {self.path}: {exc.strerror}") from exc

    def sample(self, sample: dict[str, Any], reading: Reading) -> None:
        self._write({"type": "sample", **sample})

    def phase(self, name: str, at: float) -> None:
        self._write({"type": "phase", "name": name, "timestamp": at})

    def stop(self, summary: dict[str, Any]) -> None:
        # The phases the daemon measured (edgewatt run's summary has them, whoever
        # opened them) as records before the summary, as marks are: a reader finds each
        # phase, with its figures, in one kind of record.
        for item in measured_phases(summary):
            figures = {k: v for k, v in item.items() if k != "name"}
            self._write({"type": "phase", "name": item["name"], "timestamp": item["started_at"],
                         **figures})  # fmt: skip
        self._write({"type": "summary", **summary})
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _write(self, record: dict[str, Any]) -> None:
        self._write_text(json.dumps(record) + "\n")

    def _write_text(self, text: str) -> None:
        data = text.encode("utf-8")
        size = len(data)
        with self._lock:  # phase marks come from the caller's thread
            if self._fd is None:
                return
            try:
                while data:  # a short write (a signal) goes on where it stopped
                    data = data[os.write(self._fd, data) :]
            except OSError as exc:
                self._failed(exc)
                return
            self._whole += size
            self.lines += 1

    def _failed(self, exc: OSError) -> None:
        """Take back the part of a line that was written, and write no more."""
        assert self._fd is not None
        with contextlib.suppress(OSError):  # freeing blocks works on a full disk
            os.ftruncate(self._fd, self._whole)
        self._close()
        self.failure = (
            f"writing {self.path} failed ({exc.strerror or exc}): it holds this run's "
            f"first {self.lines} lines, nothing after"
        )
        log.warning("edgewatt: %s; monitoring goes on", self.failure)


class HeflwrFileSink(FileSink):
    """heflwr's text log: at each start a line with the local date and time, then one
    line per sample (``CPU Usage: 1.0%, Memory Usage: 0.5%, Bytes Sent: 0, ...``, the
    rails when power is on and measured), appended; no header, phase or summary line."""

    final_rows = False  # no energy in its lines: each written as it comes

    def start(self, header: dict[str, Any]) -> None:
        self._open()
        self._write_text(datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S") + "\n")

    def sample(self, sample: dict[str, Any], reading: Reading) -> None:
        self._write_text(_heflwr.file_line(sample) + "\n")

    def phase(self, name: str, at: float) -> None: ...

    def stop(self, summary: dict[str, Any]) -> None:
        self._close()


class NullSink:
    """Keeps nothing: for `edgewatt run` without --output."""

    def __init__(self, **_options: Any) -> None: ...

    def start(self, header: dict[str, Any]) -> None: ...
    def sample(self, sample: dict[str, Any], reading: Reading) -> None: ...
    def stop(self, summary: dict[str, Any]) -> None: ...


def _url(host: str, path: str) -> str:
    base = host if "://" in host else f"http://{host}"
    return base.rstrip("/") + path


class RemoteSink:
    """Posts samples to a server, in order, from a bounded buffer.

    ``protocol="heflwr"`` speaks heflwr's logging wire format: a form-encoded POST to
    ``/simple_log`` (``identifier``, ``message``) or, with ``simple=False``, to
    ``/log`` with the fields of a log record. ``protocol="otlp"`` sends each sample as
    an OTLP/HTTP protobuf request to ``/v1/metrics`` with the daemon's metric names.
    While the server is unreachable, answers 5xx or takes longer than ``timeout_s`` for
    a whole exchange, samples wait in the buffer (``buffer`` entries; the oldest are
    dropped and counted) and are delivered in order once it is back. A sample is sent
    only on a 2xx; a redirect is not followed (the sample would go as a GET without
    its body, to whatever host the server names): it is refused, like a 4xx, and said.
    """

    def __init__(
        self,
        host: str,
        identifier: str,
        *,
        simple: bool = True,
        protocol: str = "heflwr",
        buffer: int = 10_000,
        timeout_s: float = 2.0,
    ) -> None:
        if protocol not in ("heflwr", "otlp"):
            raise ValueError(f"protocol must be 'heflwr' or 'otlp', got {protocol!r}")
        self.host = host
        self.identifier = identifier
        self.simple = simple
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.queue: collections.deque[tuple[bytes, str, str]] = collections.deque(maxlen=buffer)
        self.dropped = 0
        self.sent = 0
        self.refused = 0
        self._exchanges = Exchanges("edgewatt-remote-post")
        self._pid_labels: dict[str, str] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._give_up = False
        self._thread = threading.Thread(target=self._run, name="edgewatt-remote", daemon=True)

    def start(self, header: dict[str, Any]) -> None:
        self._pid_labels = {
            "process.pid": str(header["pid"]),
            "host.name": header["host"],
            **header.get("labels", {}),
        }
        self._thread.start()

    def sample(self, sample: dict[str, Any], reading: Reading) -> None:
        request = self._encode(sample, reading)
        with self._cond:
            if len(self.queue) == self.queue.maxlen:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning(
                        "edgewatt: remote %s unreachable, buffer full: %d oldest samples dropped",
                        self.host,
                        self.dropped,
                    )
            self.queue.append(request)
            self._cond.notify()

    def stop(self, summary: dict[str, Any], flush_timeout_s: float = 5.0) -> None:
        """Deliver what is buffered, for at most ``flush_timeout_s``; a post still
        waiting then is cut short."""
        deadline = time.monotonic() + flush_timeout_s
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            while self.queue and time.monotonic() < deadline:
                self._cond.wait(0.05)
            self._give_up = True
            self._cond.notify_all()
        self._exchanges.abort()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        if self.queue:
            log.warning("edgewatt: %d samples not delivered to %s", len(self.queue), self.host)

    def _encode(self, sample: dict[str, Any], reading: Reading) -> tuple[bytes, str, str]:
        if self.protocol == "otlp":
            from edgewatt.client._otlp import encode

            body = encode(reading, self._pid_labels)
            return body, _url(self.host, "/v1/metrics"), "application/x-protobuf"
        message = _heflwr.message(sample)
        if self.simple:
            fields: dict[str, Any] = {"identifier": self.identifier, "message": message}
            path = "/simple_log"
        else:
            fields = _heflwr.log_fields(self.identifier, _heflwr.record(message))
            path = "/log"
        body = urllib.parse.urlencode(fields).encode()
        return body, _url(self.host, path), "application/x-www-form-urlencoded"

    def _run(self) -> None:
        backoff = 0.1
        outage = False
        while True:
            with self._cond:
                while not self.queue and not self._stopping:
                    self._cond.wait()
                if not self.queue or self._give_up:
                    return
                item = self.queue[0]
            body, url, content_type = item
            try:
                deadline = time.monotonic() + self.timeout_s
                answer = self._exchanges.post(url, body, {"Content-Type": content_type}, deadline)
                problem = f"HTTP {answer.status}" if answer.status >= 500 else ""
            except (OSError, http.client.HTTPException) as exc:  # TimeoutError included
                answer, problem = None, f"{type(exc).__name__}: {exc}"
            if answer is None or problem:
                outage = self._retry(outage, url, problem, backoff)
                backoff = min(backoff * 2, 5.0)
                if self._give_up:
                    return
                continue
            if outage:
                outage = False
                log.info("edgewatt: %s reachable again", url)
            backoff = 0.1
            if answer.status >= 300:
                self._refused(url, answer.status, answer.location)
            with self._cond:
                if self.queue and self.queue[0] is item:  # not evicted meanwhile
                    self.queue.popleft()
                if answer.status < 300:
                    self.sent += 1
                self._cond.notify_all()

    def _refused(self, url: str, status: int, location: str) -> None:
        self.refused += 1
        why = f"HTTP {status}"
        if location:
            why += f", a redirect to {location[:200]}, not followed"
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("edgewatt: %s refused a sample (%s); %d dropped", url, why, self.refused)

    def _retry(self, outage: bool, url: str, problem: str, backoff: float) -> bool:
        if not outage:
            log.warning("edgewatt: cannot reach %s (%s); buffering samples", url, problem)
        with self._cond:
            if not self._give_up:
                self._cond.wait(backoff)
        return True


class PrometheusSink:
    """A /metrics endpoint for the monitored process: heflwr's gauges (``names="heflwr"``:
    cpu_usage, memory_usage, bytes_sent, bytes_recv, vdd_in, vdd_cpu_gpu_cv, vdd_soc, no
    labels unless given, with the process_*, python_* series heflwr's default registry
    serves, of the monitored process) or the daemon's names (``names="edgewatt"``)."""

    def __init__(self, port: int, addr: str = "0.0.0.0", names: str = "edgewatt") -> None:
        self.port = port
        self.addr = addr
        self.names = names
        self._latest: Reading | None = None
        self._labels: dict[str, str] = {}
        self._httpd: Any = None
        # heflwr's gauges start at 0.0 and keep their last value while a metric is off.
        self._gauges = dict.fromkeys(HEFLWR_GAUGES, 0.0)

    def start(self, header: dict[str, Any]) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        labels = {k.replace(".", "_"): v for k, v in header.get("labels", {}).items()}
        registry = CollectorRegistry()
        if self.names == "heflwr":
            from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

            self._labels = labels
            pid = header["pid"]
            ProcessCollector(pid=lambda: pid, registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        else:
            own = {"process_pid": str(header["pid"]), "host_name": header["host"]}
            self._labels = {**own, **labels}
        registry.register(self)  # type: ignore[arg-type]
        try:
            self._httpd, _ = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on port {self.port}: {exc.strerror}") from exc
        self.port = int(self._httpd.server_address[1])

    def sample(self, sample: dict[str, Any], reading: Reading) -> None:
        self._latest = reading
        for name, key in HEFLWR_GAUGES.items():
            if key in sample:
                self._gauges[name] = float(_heflwr.value(key, sample[key]))

    def stop(self, summary: dict[str, Any]) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def _heflwr_families(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families = []
        for name, value in self._gauges.items():
            family = GaugeMetricFamily(name, HEFLWR_HELP[name], labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            families.append(family)
        return families

    def collect(self) -> list[Any]:
        if self.names == "heflwr":
            return self._heflwr_families()
        r = self._latest
        if r is None:
            return []
        names = list(self._labels)
        values = list(self._labels.values())
        host = [self._labels["host_name"]]
        cpu = _family("process.cpu.time", [*names, "cpu_mode"])
        cpu.add_metric([*values, "user"], r.cpu_user_s)
        cpu.add_metric([*values, "system"], r.cpu_system_s)
        rss = _family("process.memory.usage", names)
        rss.add_metric(values, r.memory_rss_bytes)
        families = [cpu, rss]
        if r.net_sent_total is not None:
            # Host-wide and loopback excluded: one interface, "all".
            net = _family("system.network.io", ["host_name", "network_io_direction"])
            net.add_metric([*host, "transmit"], r.net_sent_total)
            net.add_metric([*host, "receive"], r.net_recv_total or 0)
            families.append(net)
        device = [*host, HOST_HW_ID]
        if r.power_w is not None:
            power = _family("hw.host.power", ["host_name", "hw_id"])
            power.add_metric(device, r.power_w)
            families.append(power)
        if r.energy_j is not None:
            energy = _family("hw.host.energy", ["host_name", "hw_id"])
            energy.add_metric(device, r.energy_j)
            families.append(energy)
        if r.process_energy_j is not None:
            mine = _family("edgewatt.process.energy", names)
            mine.add_metric(values, r.process_energy_j)
            families.append(mine)
        return families


# heflwr's gauge -> the sample key it shows; units: percent of one core, percent of
# host memory, bytes in the last interval, milliwatts (0.0 while power is off).
HEFLWR_GAUGES = {
    "cpu_usage": "cpu_usage",
    "memory_usage": "memory_usage",
    "bytes_sent": "network_bytes_sent",
    "bytes_recv": "network_bytes_recv",
    "vdd_in": "power_vdd_in",
    "vdd_cpu_gpu_cv": "power_vdd_cpu_gpu_cv",
    "vdd_soc": "power_vdd_soc",
}
HEFLWR_HELP = {  # heflwr's HELP texts
    "cpu_usage": "CPU usage percentage",
    "memory_usage": "Memory usage percentage",
    "bytes_sent": "Bytes sent",
    "bytes_recv": "Bytes recv",
    "vdd_in": "VDD in",
    "vdd_cpu_gpu_cv": "VDD cpu_gpu_cv",
    "vdd_soc": "VDD soc",
}


def _family(name: str, labels: list[str]) -> Any:
    """A prometheus_client family for a metric of the table: its name, unit, HELP."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    metric = BY_NAME[name]
    family_name = compat.removesuffix(metric.prometheus_name, "_total")
    kind = CounterMetricFamily if metric.instrument == "counter" else GaugeMetricFamily
    return kind(family_name, metric.description, labels=labels)


def header(
    pid: int,
    labels: dict[str, str],
    interval: float,
    metrics: dict[str, bool],
    source: str,
    command: str = "",
) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "command": command,  # the monitored process's command line, for titles
        "labels": labels,
        "interval_s": interval,
        "metrics": metrics,
        "source": source,
        "started_at": time.time(),
        "edgewatt_pid": os.getpid(),
    }
