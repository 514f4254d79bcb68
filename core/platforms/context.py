"""The run's context: what the board was set to while a target ran (power mode,
clocks pinned, their limits, release, model, throttling, temperature), so that two
runs' joules can be compared and a change mid-run is seen with its time.

Read by one thread every ``context_interval`` seconds (core/platforms/board.py reads
each fact; a read spawns nvpmodel or vcgencmd where they exist, so never per pass),
and kept as a timeline: the first read and every read whose settings differ from the
one before (bounded). A target's summary takes the context in effect at its
registration and at its end, and the changes in between as events with their time.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from edgewatt.core.platforms import board
from edgewatt.core.platforms.board import Clock, PowerMode, Roots, Zone

log = logging.getLogger(__name__)

# Changes kept: a mode switched every minute for 16 hours (the oldest then go, and a
# target registered before them is given the oldest kept as its start).
MAX_CHANGES = 1000
# The hottest zone of each read, for a run's highest: a day at the default interval.
MAX_TEMPERATURES = 8640
# What an event compares between two reads: the settings and the throttling, not the
# clocks' current rate or the temperature (both move all the time).
WATCHED = ("power_mode", "clocks_pinned", "clock_limits", "overcurrent_events", "pi_throttled")


@dataclass(frozen=True)
class DeviceContext:
    time: float  # unix seconds of the read
    model: str | None = None
    l4t_release: str | None = None
    power_mode: PowerMode | None = None
    clocks_pinned: bool | None = None
    cpu_clocks: tuple[Clock, ...] | None = None
    devfreq_clocks: tuple[Clock, ...] | None = None
    overcurrent_events: dict[str, int] | None = None
    hottest_zone: Zone | None = None
    pi_throttled: int | None = None

    @property
    def clock_limits(self) -> dict[str, list[int | None]] | None:
        clocks = (*(self.cpu_clocks or ()), *(self.devfreq_clocks or ()))
        return {c.name: [c.min_hz, c.max_hz] for c in clocks} or None

    def watched(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in WATCHED)

    def absent(self) -> list[str]:
        """The facts this board does not have (or this user cannot read)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is None]

    def labels(self) -> dict[str, str]:
        """edgewatt.device.info's attributes: the facts that name a run's setting."""
        mode, pinned = self.power_mode, self.clocks_pinned
        found = {
            "model": self.model,
            "l4t_release": self.l4t_release,
            "power_mode": None if mode is None else mode.name,
            "power_mode_id": None if mode is None or mode.id is None else str(mode.id),
            "clocks_pinned": None if pinned is None else str(pinned).lower(),
        }
        return {k: v for k, v in found.items() if v is not None}

    def document(self) -> dict[str, Any]:
        """As the API and the summaries give it: None where absent."""
        found = asdict(self)
        if self.pi_throttled is not None:
            found["pi_throttled"] = {
                "value": hex(self.pi_throttled),
                "flags": list(board.throttled_flags(self.pi_throttled)),
            }
        return found


def read(roots: Roots, clock: Callable[[], float] = time.time) -> DeviceContext:
    cpus = board.cpu_clocks(roots)
    devfreq = board.devfreq_clocks(roots)
    zones = board.thermal_zones(roots)
    return DeviceContext(
        time=clock(),
        model=board.board_model(roots),
        l4t_release=board.l4t_release(roots),
        power_mode=board.power_mode(roots),
        clocks_pinned=board.clocks_pinned((*(cpus or ()), *(devfreq or ()))),
        cpu_clocks=cpus,
        devfreq_clocks=devfreq,
        overcurrent_events=board.overcurrent_events(roots),
        hottest_zone=None if zones is None else board.hottest(zones),
        pi_throttled=board.pi_throttled(roots),
    )


def changes(before: DeviceContext, after: DeviceContext) -> list[dict[str, Any]]:
    """The events between two reads: one per watched fact that differs."""
    found = []
    for name in WATCHED:
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            event = {"time": after.time, "what": name}
            event.update(_values(name, old, new))
            found.append(event)
    return found


def _values(name: str, old: Any, new: Any) -> dict[str, Any]:
    if name == "clock_limits" and old and new:  # only the clocks whose limits moved
        moved = [k for k in {**old, **new} if old.get(k) != new.get(k)]
        return {"before": {k: old.get(k) for k in moved}, "after": {k: new.get(k) for k in moved}}
    if name == "power_mode":
        return {"before": old and asdict(old), "after": new and asdict(new)}
    if name == "pi_throttled":
        return {
            "before": None if old is None else hex(old),
            "after": None if new is None else hex(new),
        }
    return {"before": old, "after": new}


class ContextLog:
    """The timeline of reads, kept by its own thread (:meth:`start`), or by calls to
    :meth:`poll`."""

    def __init__(self, reader: Callable[[], DeviceContext], interval_s: float) -> None:
        self._reader = reader
        self.interval_s = interval_s
        self.latest: DeviceContext | None = None
        self.cost_s: float | None = None  # CPU of the last read, children included
        self._changes: deque[DeviceContext] = deque(maxlen=MAX_CHANGES)
        # Each read's time and hottest zone, in time order: a run's reads are found by
        # bisection (a summary is built for every target at each `edgewatt top` refresh).
        self._read_times: deque[float] = deque(maxlen=MAX_TEMPERATURES)
        self._hottest_c: deque[float] = deque(maxlen=MAX_TEMPERATURES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgewatt-context", daemon=True)

    def poll(self) -> DeviceContext:
        """One read now, added to the timeline."""
        started = _cpu()
        context = self._reader()
        self.cost_s = _cpu() - started
        with self._lock:
            last = self._changes[-1] if self._changes else None
            if last is None or last.watched() != context.watched():
                if last is not None:
                    log.info("device context changed: %s", changes(last, context))
                self._changes.append(context)
            if context.hottest_zone is not None:
                self._read_times.append(context.time)
                self._hottest_c.append(context.hottest_zone.celsius)
            self.latest = context
        return context

    def start(self) -> None:
        """The first read now (the first snapshot and registration have it), then
        one every interval on the thread."""
        self._guarded_poll()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._guarded_poll()

    def _guarded_poll(self) -> None:
        try:
            self.poll()
        except Exception:  # a reader's bug must not end the daemon: logged, retried
            log.exception("reading the device context failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=board.TIMEOUT_S * 2 + 1)

    def during(self, start: float, end: float | None) -> dict[str, Any] | None:
        """A run's context (``end`` None: running): in effect at its start and at its
        end (the latest read while it runs), the changes in between as events, and
        the highest temperature read meanwhile. None before the first read."""
        with self._lock:
            kept = list(self._changes)
            latest = self.latest
            first = bisect.bisect_left(self._read_times, start)
            last = (
                len(self._read_times) if end is None else bisect.bisect_right(self._read_times, end)
            )
            highest = max(itertools.islice(self._hottest_c, first, last), default=None)
        if not kept or latest is None:
            return None
        at_start = _at(kept, start)
        at_end = latest if end is None else _at(kept, end)
        events: list[dict[str, Any]] = []
        for before, after in zip(kept, kept[1:]):
            if start < after.time and (end is None or after.time <= end):
                events.extend(changes(before, after))
        return {
            "start": at_start.document(),
            "end": at_end.document(),
            "events": events,
            "highest_temperature_c": highest,
        }


def _at(kept: list[DeviceContext], instant: float) -> DeviceContext:
    """The read in effect at ``instant``: the last change read at or before it (the
    oldest kept, for an instant before every read)."""
    found = kept[0]
    for context in kept:
        if context.time > instant:
            break
        found = context
    return found


def _cpu() -> float:
    """This thread's CPU and the reaped children's (the spawned tools; other threads'
    children too, where they reap meanwhile: an upper bound)."""
    times = os.times()  # not resource's: the client loads this module on Windows too
    return time.thread_time() + times.children_user + times.children_system
