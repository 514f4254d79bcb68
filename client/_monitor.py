"""The heflwr.monitor interface: set_metrics(), start(), stop(), stats(), summary().

A monitor's class names its worker (``_workers.py``), where the sampling loop
(``_loop.py``) runs: a thread of the caller (ThreadWorker) or a helper interpreter
(HelperProcessWorker). Either way the readings reach the monitor's recorder, so
stats() and summary() work in the caller, and the daemon does the sampling when one
answers. (`edgewatt run` runs the loop itself: cli/run.py.)

The drop-in classes (``heflwr/``) give heflwr 0.1.91's shapes (``records="heflwr"``:
``heflwr/records.py``); ``records="edgewatt"`` gives edgewatt's own (the JSON Lines
file, the daemon's metric names, stats() and summary() with every figure).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from typing import Any, ClassVar

from edgewatt.client._loop import Mark, Spec
from edgewatt.client._samples import Reading, Recorder
from edgewatt.client._workers import ThreadWorker, Worker
from edgewatt.client.heflwr import records as heflwr_records

log = logging.getLogger(__name__)

METRICS = ("cpu", "memory", "network", "power")
RECORDS = ("heflwr", "edgewatt")
# How long phase() waits, beyond an interval, for the reading at its edge (a daemon's
# pass on a busy machine).
EDGE_WAIT_S = 2.0


class Monitor:
    """Base of FileMonitor, PrometheusMonitor and RemoteMonitor (heflwr's attributes:
    the drop-ins', ``heflwr/shape.py``)."""

    worker: ClassVar[type[Worker]] = ThreadWorker  # the process drop-ins: HelperProcessWorker
    sink = ""
    records = "edgewatt"  # the drop-ins: "heflwr"
    network = "host"  # what network bytes count; the drop-ins: "process" (its own TCP)

    def __init__(
        self,
        interval: float,
        labels: dict[str, str] | None,
        socket: str | None,
        records: str | None = None,
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        if records is not None and records not in RECORDS:
            raise ValueError(f"records must be 'heflwr' or 'edgewatt', got {records!r}")
        self.records = records or self.records
        self.interval = float(interval)
        self.labels = dict(labels or {})
        self.socket = socket  # None: looked for as register() looks (core.transport)
        self.pid = os.getpid()
        # What the file's header names the run by.
        self.command = " ".join(" ".join(_command_line()).split())
        self.metrics = {"cpu": True, "memory": True, "network": True, "power": False}
        self.source: str | None = None
        # One for the monitor's life: stats() and summary() accumulate over start()/stop().
        self._recorder = Recorder(dict(self.metrics), self.interval, self.network)
        # The last worker started (heflwr's thread and monitor_process read off it).
        self._worker: Worker | None = None
        self._running = threading.Event()  # set while monitoring

    def _sink_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_metrics(self, **metrics: bool) -> None:
        """Which metrics the next start() samples (heflwr: cpu, memory, network on,
        power off)."""
        for name, value in metrics.items():
            if name not in METRICS:
                raise ValueError(
                    f"metric {name!r} is not supported; available: {', '.join(METRICS)}"
                )
            if not isinstance(value, bool):
                raise TypeError(f"metric {name!r} must be True or False, got {value!r}")
            self.metrics[name] = value

    def _spec(self) -> Spec:
        return Spec(
            pid=self.pid,
            labels=self.labels,
            interval=self.interval,
            metrics=dict(self.metrics),
            socket=self.socket,
            sink=self.sink,
            sink_options=self._sink_options(),
            network=self.network,
            command=self.command,
        )

    @property
    def running(self) -> bool:
        return self._running.is_set()

    def start(self) -> None:
        """Start monitoring; a path that cannot be written or a port in use raises here.
        Samples add to those of earlier start()/stop() (heflwr keeps them all)."""
        if self.running:
            return
        worker = self.worker()
        info = worker.start(self._spec(), self._observe, self._begin)
        self._worker = worker
        self.interval = info.get("interval", self.interval)  # as really used
        if info.get("port"):
            self.port = info["port"]
        self._running.set()

    def _begin(self, info: dict[str, Any]) -> None:
        """A new segment in the recorder, at the interval really used."""
        self._recorder.begin(info.get("interval", self.interval), self.metrics)
        self.source = info.get("source")

    def _observe(self, reading: Reading) -> dict[str, Any] | None:
        return self._recorder.observe(reading)

    def stop(self) -> None:
        """Stop, after one last reading (merged into the previous sample when it comes
        less than a quarter interval after it); the JSON Lines file gets its summary
        line."""
        if not self.running or self._worker is None:
            return
        self._worker.stop()
        self._running.clear()

    def phase(self, name: str) -> None:
        """Mark the start of a named phase (an epoch, a round) in the file and summary."""
        if not isinstance(name, str) or not name:
            raise ValueError("phase name must be a non-empty string")
        at = time.time()
        self._recorder.phases.append({"name": name, "started_at": at})
        if not self.running or self._worker is None:
            return
        # The caller waits for the reading at the edge: what it runs next is the new
        # phase's, what it ran before the previous one's, to the clock tick.
        done = threading.Event()
        try:
            self._worker.mark(Mark(name, at, done.set))
        except OSError as exc:
            log.warning("edgewatt: marking phase %r failed: %s", name, exc)
            return
        if not done.wait(EDGE_WAIT_S + self.interval):
            log.warning("edgewatt: phase %r: no reading at its start; it starts later", name)

    def stats(self) -> dict[str, list[Any]]:
        """One entry per sample over every start()/stop(): heflwr's seven keys, each a
        list, empty where a metric is off or unmeasured (``records="edgewatt"``: every
        figure a sample has)."""
        if self.records == "heflwr":
            return heflwr_records.stats(self._recorder.samples)
        return self._recorder.stats()

    def summary(self) -> dict[str, Any]:
        """Over every start()/stop(): heflwr's seven keys, 0 where nothing was measured
        (``records="edgewatt"``: every figure, with its unit in its name)."""
        figures = self._recorder.summary()
        return heflwr_records.summary(figures) if self.records == "heflwr" else figures

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FileMonitor(Monitor):
    """Writes ``file``: heflwr's text log (a date line at each start, then one
    ``CPU Usage: ...`` line per sample), or with ``records="edgewatt"`` JSON Lines (a
    header, one line per sample, phase marks, a summary)."""

    def __init__(
        self,
        file: str,
        interval: float = 5,
        *,
        records: str | None = None,
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket, records)
        self.file = os.path.abspath(os.fspath(file))
        self.sink = "heflwr-file" if self.records == "heflwr" else "file"

    def _sink_options(self) -> dict[str, Any]:
        if self.sink == "file":
            return {"path": self.file, "network": self.network}
        return {"path": self.file}


class PrometheusMonitor(Monitor):
    """Serves the monitored process's metrics on ``port``: heflwr's gauges, or with
    ``records="edgewatt"`` the daemon's names."""

    sink = "prometheus"

    def __init__(
        self,
        port: int = 8003,
        interval: float = 5,
        *,
        records: str | None = None,
        addr: str = "0.0.0.0",
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket, records)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port!r}")
        self.port = port
        self.addr = addr

    def _sink_options(self) -> dict[str, Any]:
        return {"port": self.port, "addr": self.addr, "names": self.records}


class RemoteMonitor(Monitor):
    """Sends samples to ``host`` (heflwr's /simple_log or /log, or OTLP/HTTP) and, as
    heflwr's logger does, echoes each on stdout through the "HeFlwr" logger."""

    sink = "remote"

    def __init__(
        self,
        host: str,
        interval: float = 5,
        identifier: str | None = None,
        simple: bool = True,
        *,
        protocol: str = "heflwr",
        buffer: int = 10_000,
        records: str | None = None,
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket, records)
        if protocol not in ("heflwr", "otlp"):
            raise ValueError(f"protocol must be 'heflwr' or 'otlp', got {protocol!r}")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ValueError(f"buffer must be a positive number of samples, got {buffer!r}")
        self.host = host
        self.identifier = identifier or f"remote-monitor-{uuid.uuid4().hex}"
        self.simple = simple
        self.protocol = protocol
        self.buffer = buffer

    def _sink_options(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "identifier": self.identifier,
            "simple": self.simple,
            "protocol": self.protocol,
            "buffer": self.buffer,
        }

    def _observe(self, reading: Reading) -> dict[str, Any] | None:
        sample = super()._observe(reading)
        if sample is not None and self.records == "heflwr" and self.protocol == "heflwr":
            heflwr_records.echo(heflwr_records.message(sample))
        return sample


def _command_line() -> list[str]:
    """The interpreter's own command line (sys.orig_argv is 3.10+: before it, Linux's
    /proc/self/cmdline, else sys.argv, which has "-c" for the code it ran)."""
    argv = getattr(sys, "orig_argv", None)
    if argv:
        return list(argv)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return list(sys.argv)
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a] or list(sys.argv)
