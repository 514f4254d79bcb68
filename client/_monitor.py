"""The heflwr.monitor interface: set_metrics(), start(), stop(), stats(), summary().

Two variants share one sampling loop. The thread variant samples in a thread of the
calling process. The process variant runs the loop in a helper, a fresh interpreter
(``python -m client._helper``: nothing of the training process is forked, and unlike
multiprocessing's "spawn" the caller's script is not imported again, so scripts
without an ``if __name__ == "__main__"`` guard work as with heflwr). The helper samples
the caller's pid and sends each reading back over a pipe, so stats() and summary()
work in the caller as with the thread variant; it stops when the caller does, even
if the caller dies. Either way the daemon does the sampling when one answers.

The drop-in classes (thread_monitor.py, process_monitor.py) give heflwr 0.1.91's
shapes (``records="heflwr"``: ``_heflwr.py``); ``records="edgewatt"`` gives edgewatt's
own (the JSON Lines file, the daemon's metric names, stats() and summary() with every
figure), which `edgewatt run` uses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgewatt.client import _heflwr
from edgewatt.client._samples import Reading, Recorder
from edgewatt.client._sinks import (
    FileSink,
    HeflwrFileSink,
    NullSink,
    PrometheusSink,
    RemoteSink,
    header,
)

log = logging.getLogger(__name__)

METRICS = ("cpu", "memory", "network", "power")
RECORDS = ("heflwr", "edgewatt")
# How long phase() waits, beyond an interval, for the reading at its edge (a daemon's
# pass on a busy machine).
EDGE_WAIT_S = 2.0


def make_sink(kind: str, options: dict[str, Any]) -> Any:
    sinks = {
        "file": FileSink,
        "heflwr-file": HeflwrFileSink,
        "prometheus": PrometheusSink,
        "remote": RemoteSink,
        "none": NullSink,
    }
    return sinks[kind](**options)


def sampling_loop(
    spec: dict[str, Any],
    stop: Any,
    emit: Callable[[Reading], None],
    ready: Callable[[str | None, dict[str, Any]], None],
    shared: dict[str, Any] | None = None,
    adjust: Callable[[Reading], Reading] | None = None,
) -> None:
    """Register the pid (the daemon samples it, else this process does, through the
    same Registration as register()), open the sink, then read every interval until
    ``stop`` is set. The sink is left in ``shared["sink"]`` for phase marks from other
    threads. ``adjust`` takes each reading before anything sees it (the process
    variant's helper takes itself out of the figures)."""
    from edgewatt.client import open_registration

    try:
        source = open_registration(
            spec["labels"],
            spec["pid"],
            True,
            spec["socket"],
            "auto",
            interval=spec["interval"],
            power=spec["metrics"]["power"],
            sample_on_read=True,
            cgroup=spec.get("cgroup"),
            argv=spec.get("argv"),
            # The process's own TCP bytes, counted in-process too (sock_diag).
            network=spec.get("network") == "process" and spec["metrics"]["network"],
        )
    except Exception as exc:  # bad labels: the caller's start() raises it
        ready(f"cannot monitor pid {spec['pid']}: {exc}", {})
        return
    if not source.active:  # the monitored process is already gone
        ready(f"cannot monitor pid {spec['pid']}: it is neither registered nor readable", {})
        return
    # With the daemon, each read takes a fresh sample, at most once per its minimum.
    interval = spec["interval"]
    if source.mode == "daemon":
        interval = max(interval, float(source.info.get("min_interval_s") or 0.0))
    recorder = Recorder(spec["metrics"], interval, spec.get("network", "host"))
    try:
        sink = make_sink(spec["sink"], spec["sink_options"])
        sink.start(
            header(
                spec["pid"],
                spec["labels"],
                interval,
                spec["metrics"],
                source.mode,
                spec.get("command", ""),
            )
        )
    except Exception as exc:  # reported to start(), which raises it in the caller
        source.close()
        ready(str(exc), {})
        return
    if shared is not None:
        shared["sink"] = sink
        shared["source"] = source

    # The baseline is read before start() returns, so the caller's first instruction
    # after it is counted; it is sent after the ready line, which the caller reads first.
    def read() -> Reading | None:
        reading = source.reading()  # never raises; a failure is logged once
        return adjust(reading) if adjust is not None and reading is not None else reading

    reading = read()
    ready(None, {"port": getattr(sink, "port", None), "source": source.mode, "interval": interval})
    deadline = time.monotonic()
    last = False
    wake, marks = edges(shared)
    taken: list[Mark] = []
    while True:
        if reading is not None:
            # A phase's first reading is an edge: never merged into the sample before
            # it, so a phase's samples hold its whole CPU and energy.
            sample = recorder.observe(reading, edge=bool(taken))
            emit(reading)
            if sample is not None:
                sink.sample(sample, reading)
        for mark in taken:  # after the sample that ends at it
            if hasattr(sink, "phase"):
                sink.phase(mark.name, mark.at)
            mark.done()
        if last:
            break
        if taken:  # the next interval a whole one from the edge
            deadline = time.monotonic()
        deadline += interval
        wake.wait(max(0.0, deadline - time.monotonic()))
        wake.clear()
        taken = _pending(marks)
        # A last reading that starts after stop(), however soon after the previous one:
        # the summary then ends at the call (a short one is merged into the previous
        # sample). Checked before the read: stop() during a slow pass (the caller's
        # busy thread holds the GIL) gets one more, else its end would be missed.
        last = stop.is_set()
        reading = read()
    summary = recorder.summary()
    if shared is not None and shared.get("final") is not None:  # edgewatt run's last word
        summary = shared["summary"] = shared["final"](summary, source)
    sink.stop(summary)
    source.close()


@dataclass(frozen=True)
class Mark:
    """A phase's start, for the sampling loop: ``done`` once its edge reading is in."""

    name: str
    at: float
    done: Callable[[], None]


def edges(shared: dict[str, Any] | None) -> tuple[threading.Event, queue.SimpleQueue[Mark]]:
    """The loop's wake-up (a phase mark, stop()) and its queue of marks, kept in
    ``shared`` for the threads that mark phases."""
    holder = shared if shared is not None else {}
    wake = holder.setdefault("wake", threading.Event())
    return wake, holder.setdefault("marks", queue.SimpleQueue())


def _pending(marks: queue.SimpleQueue[Mark]) -> list[Mark]:
    taken = []
    with contextlib.suppress(queue.Empty):
        while True:
            taken.append(marks.get_nowait())
    return taken


class Monitor:
    """Base of FileMonitor, PrometheusMonitor and RemoteMonitor in both variants.

    heflwr's public attributes: ``monitoring`` (a bool in the thread variant, an Event
    in the process variant, as heflwr's), ``thread`` (the sampling thread),
    ``monitor_process`` (the process variant's helper, a ``subprocess.Popen``),
    ``process`` (a ``psutil.Process`` of the monitored pid) and ``update_metrics()``.
    """

    variant = "thread"
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
        self.cgroup: str | None = None  # the daemon measures this cgroup (edgewatt run)
        # What the file's header names the run by (`edgewatt run` sets the command).
        self.command = " ".join(" ".join(_command_line()).split())
        # What the pid will exec (`edgewatt run`'s held fork): the daemon's name for it
        # until then, as its own command line is still the launcher's.
        self.argv: list[str] | None = None
        self.metrics = {"cpu": True, "memory": True, "network": True, "power": False}
        self.source: str | None = None
        # One for the monitor's life: stats() and summary() accumulate over start()/stop().
        self._recorder = Recorder(dict(self.metrics), self.interval, self.network)
        self._stop: Any = None
        self._worker: Any = None
        self._reader: Any = None
        self._shared: dict[str, Any] = {}
        self._running = threading.Event()  # the process variant's ``monitoring``
        self.thread: threading.Thread | None = None
        self.monitor_process: subprocess.Popen[str] | None = None
        self._process: Any = None  # psutil's, made on first use (psutil is optional)
        self._marked: dict[float, threading.Event] = {}  # the helper's phase marks, by time

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

    def _spec(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "cgroup": self.cgroup,
            "command": self.command,
            "argv": self.argv,
            "labels": self.labels,
            "interval": self.interval,
            "metrics": dict(self.metrics),
            "network": self.network,
            "socket": self.socket,
            "sink": self.sink,
            "sink_options": self._sink_options(),
        }

    @property
    def monitoring(self) -> Any:
        """heflwr's flag: True while monitoring (thread variant); the process variant's
        is an Event, set while monitoring (heflwr's multiprocessing.Event)."""
        return self._running if self.variant == "process" else self.running

    @property
    def process(self) -> Any:
        """The monitored process as a ``psutil.Process`` (heflwr's thread variant's),
        one object, so its cpu_percent() compares with its previous call."""
        if self._process is None or self._process.pid != self.pid:
            try:
                import psutil
            except ImportError:
                why = "monitor.process is a psutil.Process: install psutil"
                raise AttributeError(why) from None
            self._process = psutil.Process(self.pid)
        return self._process

    @property
    def daemon_socket(self) -> str | None:
        """The socket of the daemon that samples the process (thread variant), or None."""
        source = self._shared.get("source")
        return source.socket if source is not None and source.mode == "daemon" else None

    @property
    def registration(self) -> Any:
        """The registration that samples the process (thread variant), or None."""
        return self._shared.get("source")

    @property
    def running(self) -> bool:
        return self._worker is not None

    def helper_pids(self) -> set[int]:
        """The processes the monitoring itself runs (a power source's powermetrics or
        tegrastats, where it samples in-process), not the monitored work's."""
        source = self._shared.get("source")
        return source.helper_pids() if source is not None else set()

    def start(self) -> None:
        """Start monitoring; a path that cannot be written or a port in use raises here.
        Samples add to those of earlier start()/stop() (heflwr keeps them all)."""
        if self.running:
            return
        self._shared.pop("summary", None)
        if self.variant == "process":
            self._start_process()
        else:
            self._start_thread()
        self._running.set()

    def _begin(self, info: dict[str, Any]) -> None:
        """A new segment in the recorder, at the interval really used."""
        self._recorder.begin(info.get("interval", self.interval), self.metrics)

    def update_metrics(self) -> None:
        """heflwr's sampling loop: sample every interval until stop(), in the calling
        thread (the thread variant's thread runs it; a script may too, as heflwr's)."""
        ready = self._shared.pop("ready", None)
        if ready is None:  # called by the script itself: monitoring until stop()
            if self.running:
                return
            self._stop = threading.Event()
            self._worker = threading.current_thread()
            self._running.set()

            def ready(error: str | None, info: dict[str, Any]) -> None:
                if error is not None:
                    log.warning("edgewatt: %s", error)
                    return
                self._begin(info)
                self.source = info.get("source")

        sampling_loop(self._spec(), self._stop, self._observe, ready, self._shared)

    def _observe(self, reading: Reading) -> dict[str, Any] | None:
        return self._recorder.observe(reading)

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        outcome: list[tuple[str | None, dict[str, Any]]] = []
        started = threading.Event()

        def ready(error: str | None, info: dict[str, Any]) -> None:
            if error is None:
                self._begin(info)  # before the loop's first reading reaches the recorder
            outcome.append((error, info))
            started.set()

        self._shared["ready"] = ready
        worker = threading.Thread(target=self.update_metrics, name="edgewatt-monitor", daemon=True)
        worker.start()
        if not started.wait(60):
            raise OSError("the monitor did not start within 60 s")
        self.thread = worker
        self._started(worker, *outcome[0])

    def _start_process(self) -> None:
        # The same interpreter, so the same installed edgewatt; nothing is forked.
        helper = subprocess.Popen(
            [sys.executable, "-m", "edgewatt.client._helper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write(json.dumps(self._spec()) + "\n")
        helper.stdin.flush()
        line = helper.stdout.readline()
        if not line:
            helper.wait()
            raise OSError(f"the monitor helper exited with status {helper.returncode}")
        message = json.loads(line)
        self._stop = helper
        if message["error"] is None:
            self._begin(message["info"])
            self.monitor_process = helper
            self._reader = threading.Thread(
                target=self._read_helper, args=(helper,), name="edgewatt-monitor", daemon=True
            )
            self._reader.start()
        self._started(helper, message["error"], message["info"])

    def _read_helper(self, helper: subprocess.Popen[str]) -> None:
        assert helper.stdout is not None
        for line in helper.stdout:
            message = json.loads(line)
            if "marked" in message:  # a phase's edge reading is in
                done = self._marked.get(message["marked"])
                if done is not None:
                    done.set()
                continue
            self._observe(Reading(**message))

    def _started(self, worker: Any, error: str | None, info: dict[str, Any]) -> None:
        if error is not None:
            if isinstance(worker, subprocess.Popen):
                worker.wait(timeout=5)
            else:
                worker.join(timeout=5)
            raise OSError(error)
        self._worker = worker
        self.source = info.get("source")
        self.interval = info.get("interval", self.interval)  # as really used
        if info.get("port"):
            self.port = info["port"]

    def stop(self, final: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None) -> None:
        """Stop, after one last reading (merged into the previous sample when it comes
        less than a quarter interval after it); the JSON Lines file gets its summary
        line. ``final`` (thread variant): ``final(summary, registration)`` gives the
        summary written and kept, once the last reading is in."""
        if not self.running:
            return
        self._shared["final"] = final
        if isinstance(self._worker, subprocess.Popen):
            with contextlib.suppress(OSError):
                self._worker.stdin.close()  # end of input: a last reading, then it exits
            try:
                self._worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._worker.kill()
            self._reader.join(timeout=5)
        else:
            self._stop.set()
            edges(self._shared)[0].set()
            if self._worker is not threading.current_thread():  # a script's update_metrics()
                self._worker.join(timeout=15)
        self._worker = None
        self._running.clear()

    @property
    def write_failure(self) -> str | None:
        """Why the file stopped being written, and what it kept (the thread variant's
        sink; the process variant's logs it); None while every line was written."""
        return getattr(self._shared.get("sink"), "failure", None)

    def phase(self, name: str) -> None:
        """Mark the start of a named phase (an epoch, a round) in the file and summary."""
        if not isinstance(name, str) or not name:
            raise ValueError("phase name must be a non-empty string")
        at = time.time()
        self._recorder.phases.append({"name": name, "started_at": at})
        if not self.running:
            return
        # The caller waits for the reading at the edge: what it runs next is the new
        # phase's, what it ran before the previous one's, to the clock tick.
        done = threading.Event()
        try:
            if isinstance(self._worker, subprocess.Popen):
                self._marked[at] = done
                self._worker.stdin.write(json.dumps({"phase": name, "at": at}) + "\n")
                self._worker.stdin.flush()
            else:
                wake, marks = edges(self._shared)
                marks.put(Mark(name, at, done.set))
                wake.set()
        except OSError as exc:
            log.warning("edgewatt: marking phase %r failed: %s", name, exc)
            return
        if not done.wait(EDGE_WAIT_S + self.interval):
            log.warning("edgewatt: phase %r: no reading at its start; it starts later", name)
        self._marked.pop(at, None)

    def stats(self) -> dict[str, list[Any]]:
        """One entry per sample over every start()/stop(): heflwr's seven keys, each a
        list, empty where a metric is off or unmeasured (``records="edgewatt"``: every
        figure a sample has)."""
        if self.records == "heflwr":
            return _heflwr.stats(self._recorder.samples)
        return self._recorder.stats()

    def summary(self) -> dict[str, Any]:
        """Over every start()/stop(): heflwr's seven keys, 0 where nothing was measured
        (``records="edgewatt"``: every figure, with its unit in its name)."""
        figures = self._shared.get("summary") or self._recorder.summary()
        return _heflwr.summary(figures) if self.records == "heflwr" else figures

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
        return {"path": self.file} if self.sink == "heflwr-file" else {}


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
            _heflwr.echo(_heflwr.message(sample))
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
