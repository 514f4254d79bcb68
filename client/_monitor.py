"""The heflwr.monitor interface: set_metrics(), start(), stop(), stats(), summary().

Two variants share one sampling loop. The thread variant samples in a thread of the
calling process. The process variant runs the loop in a helper, a fresh interpreter
(``python -m client._helper``: nothing of the training process is forked, and unlike
multiprocessing's "spawn" the caller's script is not imported again, so scripts
without an ``if __name__ == "__main__"`` guard work as with heflwr). The helper samples
the caller's pid and sends each reading back over a pipe, so stats() and summary()
work in the caller as with the thread variant; it stops when the caller does, even
if the caller dies. Either way the daemon does the sampling when one answers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from edgewatt.client._samples import Reading, Recorder
from edgewatt.client._sinks import FileSink, NullSink, PrometheusSink, RemoteSink, header

log = logging.getLogger(__name__)

METRICS = ("cpu", "memory", "network", "power")


def make_sink(kind: str, options: dict[str, Any]) -> Any:
    sinks = {"file": FileSink, "prometheus": PrometheusSink, "remote": RemoteSink, "none": NullSink}
    return sinks[kind](**options)


def sampling_loop(
    spec: dict[str, Any],
    stop: Any,
    emit: Callable[[Reading], None],
    ready: Callable[[str | None, dict[str, Any]], None],
    shared: dict[str, Any] | None = None,
) -> None:
    """Register the pid (the daemon samples it, else this process does, through the
    same Registration as register()), open the sink, then read every interval until
    ``stop`` is set. The sink is left in ``shared["sink"]`` for phase marks from other
    threads."""
    from edgewatt.client import _register

    try:
        source = _register(
            spec["labels"],
            spec["pid"],
            True,
            spec["socket"],
            "auto",
            interval=spec["interval"],
            power=spec["metrics"]["power"],
            sample_on_read=True,
            cgroup=spec.get("cgroup"),
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
    recorder = Recorder(spec["metrics"])
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
    reading = source.reading()  # never raises; a failure is logged once
    ready(None, {"port": getattr(sink, "port", None), "source": source.mode, "interval": interval})
    deadline = time.monotonic()
    while True:
        if reading is not None:
            sample = recorder.observe(reading)
            emit(reading)
            if sample is not None:
                sink.sample(sample, reading)
        if stop.is_set():
            break
        deadline += interval
        stop.wait(max(0.0, deadline - time.monotonic()))
        # A last reading at stop, however soon after the previous one: the summary
        # then ends at the call (its rate over a short span is coarse, its totals not).
        reading = source.reading()
    summary = recorder.summary()
    if shared is not None and shared.get("final") is not None:  # edgewatt run's last word
        summary = shared["summary"] = shared["final"](summary, source)
    sink.stop(summary)
    source.close()


class Monitor:
    """Base of FileMonitor, PrometheusMonitor and RemoteMonitor in both variants."""

    variant = "thread"
    sink = ""

    def __init__(self, interval: float, labels: dict[str, str] | None, socket: str | None) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        self.labels = dict(labels or {})
        self.socket = socket  # None: looked for as register() looks (core.transport)
        self.pid = os.getpid()
        self.cgroup: str | None = None  # the daemon measures this cgroup (edgewatt run)
        # What the file's header names the run by (`edgewatt run` sets the command).
        self.command = " ".join(" ".join(_command_line()).split())
        self.metrics = {"cpu": True, "memory": True, "network": True, "power": False}
        self.source: str | None = None
        self._recorder = Recorder(self.metrics)
        self._stop: Any = None
        self._worker: Any = None
        self._reader: Any = None
        self._shared: dict[str, Any] = {}

    def _sink_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_metrics(self, **metrics: bool) -> None:
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
            "labels": self.labels,
            "interval": self.interval,
            "metrics": dict(self.metrics),
            "socket": self.socket,
            "sink": self.sink,
            "sink_options": self._sink_options(),
        }

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
        """Start monitoring; a path that cannot be written or a port in use raises here."""
        if self.running:
            return
        self._recorder = Recorder(dict(self.metrics))
        self._shared.pop("summary", None)
        if self.variant == "process":
            self._start_process()
        else:
            self._start_thread()

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        outcome: list[tuple[str | None, dict[str, Any]]] = []
        started = threading.Event()

        def ready(error: str | None, info: dict[str, Any]) -> None:
            outcome.append((error, info))
            started.set()

        worker = threading.Thread(
            target=sampling_loop,
            args=(self._spec(), self._stop, self._recorder.observe, ready, self._shared),
            name="edgewatt-monitor",
            daemon=True,
        )
        worker.start()
        if not started.wait(60):
            raise OSError("the monitor did not start within 60 s")
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
            self._reader = threading.Thread(
                target=self._read_helper, args=(helper,), name="edgewatt-monitor", daemon=True
            )
            self._reader.start()
        self._started(helper, message["error"], message["info"])

    def _read_helper(self, helper: subprocess.Popen[str]) -> None:
        assert helper.stdout is not None
        for line in helper.stdout:
            self._recorder.observe(Reading(**json.loads(line)))

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
        """Stop, after one last reading; the file gets its summary line. ``final``
        (thread variant): ``final(summary, registration)`` gives the summary written and
        kept, once the last reading is in."""
        if not self.running:
            return
        self._shared["final"] = final
        if self.variant == "process":
            with contextlib.suppress(OSError):
                self._worker.stdin.close()  # end of input: a last reading, then it exits
            try:
                self._worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._worker.kill()
            self._reader.join(timeout=5)
        else:
            self._stop.set()
            self._worker.join(timeout=15)
        self._worker = None

    def phase(self, name: str) -> None:
        """Mark the start of a named phase (an epoch, a round) in the file and summary."""
        if not isinstance(name, str) or not name:
            raise ValueError("phase name must be a non-empty string")
        at = time.time()
        self._recorder.phases.append({"name": name, "started_at": at})
        if not self.running:
            return
        try:
            if self.variant == "process":
                self._worker.stdin.write(json.dumps({"phase": name, "at": at}) + "\n")
                self._worker.stdin.flush()
            elif hasattr(self._shared.get("sink"), "phase"):
                self._shared["sink"].phase(name, at)
        except OSError as exc:
            log.warning("edgewatt: marking phase %r failed: %s", name, exc)

    def stats(self) -> dict[str, list[Any]]:
        return self._recorder.stats()

    def summary(self) -> dict[str, Any]:
        return self._shared.get("summary") or self._recorder.summary()

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FileMonitor(Monitor):
    """Writes JSON Lines to ``file``: a header, one line per sample, a summary."""

    sink = "file"

    def __init__(
        self,
        file: str,
        interval: float = 5,
        *,
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket)
        self.file = os.path.abspath(os.fspath(file))

    def _sink_options(self) -> dict[str, Any]:
        return {"path": self.file}


class PrometheusMonitor(Monitor):
    """Serves the monitored process's metrics, with the daemon's names, on ``port``."""

    sink = "prometheus"

    def __init__(
        self,
        port: int = 8003,
        interval: float = 5,
        *,
        addr: str = "0.0.0.0",
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port!r}")
        self.port = port
        self.addr = addr

    def _sink_options(self) -> dict[str, Any]:
        return {"port": self.port, "addr": self.addr}


class RemoteMonitor(Monitor):
    """Sends samples to ``host`` (heflwr's /simple_log or /log, or OTLP/HTTP)."""

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
        labels: dict[str, str] | None = None,
        socket: str | None = None,
    ) -> None:
        super().__init__(interval, labels, socket)
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
