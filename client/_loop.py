"""The monitors' sampling loop: register the pid, open the sink, read every interval.

A worker (``_workers.py``) runs it, in a thread of the caller or in the helper
interpreter (``_helper.py``); what the loop shares with the threads that steer it
(phase marks, stop, the registration and sink it opened, the summary it wrote) is a
:class:`LoopState`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from edgewatt.client._final_rows import FINAL_WAIT_S, FinalRows, settled_energies
from edgewatt.client._samples import Reading, Recorder
from edgewatt.client._sinks import (
    FileSink,
    HeflwrFileSink,
    NullSink,
    PrometheusSink,
    RemoteSink,
    header,
)

# final(summary, registration): the summary written and kept, once the last reading
# is in (`edgewatt run`'s last word).
Final = Callable[[Dict[str, Any], Any], Dict[str, Any]]
# ready(error, info): the loop started (error None; info: port, source, interval) or not.
Ready = Callable[[Optional[str], Dict[str, Any]], None]


@dataclass(frozen=True)
class Spec:
    """What the loop monitors and where its samples go; sent to the helper as JSON."""

    pid: int
    labels: dict[str, str]
    interval: float
    metrics: dict[str, bool]
    socket: str | None
    sink: str  # a key of SINKS
    sink_options: dict[str, Any]
    network: str = "host"  # what network bytes count: "host", or "process" (its own TCP)
    cgroup: str | None = None  # the daemon measures this cgroup (edgewatt run)
    command: str = ""  # what the file's header names the run by
    # What the pid will exec (`edgewatt run`'s held fork): the daemon's name for it
    # until then, as its own command line is still the launcher's.
    argv: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Mark:
    """A phase's start, for the sampling loop: ``done`` once its edge reading is in."""

    name: str
    at: float
    done: Callable[[], None]


@dataclass
class LoopState:
    """What one run of the loop shares with the threads that steer it."""

    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)  # a mark, or stop
    marks: queue.SimpleQueue[Mark] = field(default_factory=queue.SimpleQueue)
    registration: Any = None  # the Registration that samples the pid, once opened
    sink: Any = None  # once opened: phase marks and the write failure are read off it
    final: Final | None = None  # set by stop() before the last reading
    summary: dict[str, Any] | None = None  # what final() gave, once written

    @property
    def daemon_socket(self) -> str | None:
        """The socket of the daemon that samples the pid, or None."""
        source = self.registration
        return source.socket if source is not None and source.mode == "daemon" else None

    def helper_pids(self) -> set[int]:
        """The processes the monitoring itself runs (a power source's powermetrics or
        tegrastats, where it samples in-process), not the monitored work's."""
        return self.registration.helper_pids() if self.registration is not None else set()

    @property
    def write_failure(self) -> str | None:
        """Why the file stopped being written, and what it kept; None while every line
        was written."""
        return getattr(self.sink, "failure", None)

    def mark(self, mark: Mark) -> None:
        self.marks.put(mark)
        self.wake.set()

    def end(self, final: Final | None = None) -> None:
        """Stop after one last reading; ``final`` gives the summary written."""
        self.final = final
        self.stop.set()
        self.wake.set()

    def pending(self) -> list[Mark]:
        taken = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self.marks.get_nowait())
        return taken


SINKS = {
    "file": FileSink,
    "heflwr-file": HeflwrFileSink,
    "prometheus": PrometheusSink,
    "remote": RemoteSink,
    "none": NullSink,
}


def sampling_loop(
    spec: Spec,
    state: LoopState,
    emit: Callable[[Reading], None],
    ready: Ready,
    adjust: Callable[[Reading], Reading] | None = None,
) -> None:
    """Register the pid (the daemon samples it, else this process does, through the
    same Registration as register()), open the sink, then read every interval until
    ``state.stop`` is set. ``adjust`` takes each reading before anything sees it (the
    helper takes itself out of the figures)."""
    from edgewatt.client import open_registration

    try:
        source = open_registration(
            spec.labels,
            spec.pid,
            True,
            spec.socket,
            "auto",
            interval=spec.interval,
            power=spec.metrics["power"],
            sample_on_read=True,
            cgroup=spec.cgroup,
            argv=spec.argv,
            # The process's own TCP bytes, counted in-process too (sock_diag).
            network=spec.network == "process" and spec.metrics["network"],
        )
    except Exception as exc:  # bad labels: the caller's start() raises it
        ready(f"cannot monitor pid {spec.pid}: {exc}", {})
        return
    if not source.active:  # the monitored process is already gone
        ready(f"cannot monitor pid {spec.pid}: it is neither registered nor readable", {})
        return
    # With the daemon, each read takes a fresh sample, at most once per its minimum.
    interval = spec.interval
    if source.mode == "daemon":
        interval = max(interval, float(source.info.get("min_interval_s") or 0.0))
    recorder = Recorder(spec.metrics, interval, spec.network)
    try:
        sink = SINKS[spec.sink](**spec.sink_options)
        sink.start(header(spec.pid, spec.labels, interval, spec.metrics, source.mode, spec.command))
    except Exception as exc:  # reported to start(), which raises it in the caller
        source.close()
        ready(str(exc), {})
        return
    state.sink = sink
    state.registration = source

    # The baseline is read before start() returns, so the caller's first instruction
    # after it is counted; it is sent after the ready line, which the caller reads first.
    def read() -> Reading | None:
        reading = source.reading()  # never raises; a failure is logged once
        return adjust(reading) if adjust is not None and reading is not None else reading

    reading = read()
    ready(None, {"port": getattr(sink, "port", None), "source": source.mode, "interval": interval})
    deadline = time.monotonic()
    last = False
    taken: list[Mark] = []
    rows = FinalRows(sink, lambda readings, wait_s: settled_energies(source, readings, wait_s))
    while True:
        if reading is not None:
            # A phase's first reading is an edge: never merged into the sample before
            # it, so a phase's samples hold its whole CPU and energy.
            previous = recorder.last
            sample = recorder.observe(reading, edge=bool(taken))
            emit(reading)
            if sample is not None and previous is not None:
                rows.sample(sample, previous, reading)
            elif recorder.extended is not None:
                rows.extend(recorder.extended, reading)
        for mark in taken:  # after the sample that ends at it
            if hasattr(sink, "phase"):
                rows.phase(mark.name, mark.at)
            mark.done()
        rows.flush()
        if last:
            break
        if taken:  # the next interval a whole one from the edge
            deadline = time.monotonic()
        deadline += interval
        state.wake.wait(max(0.0, deadline - time.monotonic()))
        state.wake.clear()
        taken = state.pending()
        # A last reading that starts after stop(), however soon after the previous one:
        # the summary then ends at the call (a short one is merged into the previous
        # sample). Checked before the read: stop() during a slow pass (the caller's
        # busy thread holds the GIL) gets one more, else its end would be missed.
        last = state.stop.is_set()
        reading = read()
    final = state.final  # edgewatt run's last word
    if final is None or source.mode != "daemon":  # else its summary waits for them
        rows.flush(FINAL_WAIT_S, last=True)  # the monitor's samples then final too
    summary = recorder.summary()
    if final is not None:
        summary = state.summary = final(summary, source)
    rows.flush(last=True)
    sink.stop(summary)
    source.close()
