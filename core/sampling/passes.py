"""When the sampler's passes run: at a fixed cadence in the sampling thread, and on
demand (an edge: a registration, a phase, a monitor's read) in callers' threads; one
at a time, asks that come together sharing one."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol

from edgewatt.core.sampling.clock import Clock

if TYPE_CHECKING:
    from edgewatt.core.snapshot import Snapshot

log = logging.getLogger(__name__)

Step = str  # where a pass in steps stops (Sampler.pass_steps)
READ: Step = "read"  # the targets' counters and the host's CPU, at the pass's instant
RECORDED: Step = "recorded"  # the power read, the rows in the histories: the figures known


class Passing(Protocol):
    interval: float  # seconds between scheduled passes (a reload changes it)
    snapshot: Snapshot  # the last pass's
    closed: bool

    def pass_steps(self, record: set[str] | None = None) -> Generator[Step, None, Snapshot]: ...

    def close(self) -> None: ...


class Passes:
    def __init__(self, sampler: Passing, clock: Clock) -> None:
        self._sampler = sampler
        self._clock = clock
        self.overruns = 0  # scheduled passes that ended after the next was due
        # Passes on demand (sample_now): counted as started and done under _edge.
        self._pass_lock = threading.Lock()
        self._edge = threading.Lock()
        self._wake = threading.Event()
        self._started = self._done = 0
        self._asked: set[str] | None = set()  # targets that asked for the next pass

    def run(self, stop: threading.Event) -> None:
        """Pass at a fixed cadence until ``stop`` is set (then :meth:`wake`), then
        close the sampler."""
        monotonic = self._clock.monotonic
        deadline = monotonic()
        try:
            while not stop.is_set():
                with self._pass_lock:  # one pass at a time, whoever runs it
                    self._scheduled_pass()
                deadline, overran = next_pass(deadline, self._sampler.interval, monotonic())
                self.overruns += overran
                self._clock.wait(self._wake, max(0.0, deadline - monotonic()))
        finally:
            with self._pass_lock:  # a pass on demand in another thread ends first
                self._sampler.close()

    def wake(self) -> None:
        """End the wait between passes now: to stop."""
        self._wake.set()

    def on_demand(self, target_id: str | None, timeout_s: float) -> Snapshot:
        """A pass that starts after this call, and its snapshot (Sampler.sample_now)."""
        self.edge(target_id, timeout_s, None)()
        return self._sampler.snapshot

    def edge(
        self, target_id: str | None, timeout_s: float, until: Step | None
    ) -> Callable[[], None]:
        """A pass that starts after this call, run now up to its step ``until``
        (Sampler.pass_steps; None: whole); the rest of it, which the caller calls once
        (an edge's answer written in between), ends it and lets the next pass run."""
        with self._edge:
            if self._asked is not None:
                if target_id is None:
                    self._asked = None
                else:
                    self._asked.add(target_id)
            wanted = self._started + 1
        if not self._pass_lock.acquire(timeout=timeout_s):
            return nothing  # a pass is stuck: the log says why; never block
        with self._edge:
            done = self._done >= wanted or self._sampler.closed  # one after the ask is
            if not done:
                self._started += 1
                asked, self._asked = self._asked, set()
        if done:
            self._pass_lock.release()
            return nothing
        steps = self._sampler.pass_steps(asked)
        rest = functools.partial(self._rest, steps)
        try:
            stopped = until is not None and _run(steps, until)
        except BaseException:
            rest()
            raise
        if stopped:
            return rest
        rest()
        return nothing

    def _rest(self, steps: Generator[str, None, Snapshot]) -> None:
        """The rest of a pass begun by :meth:`edge`, then the pass lock released."""
        try:
            _run(steps, None)
        finally:
            with self._edge:
                self._done += 1
            self._pass_lock.release()

    def _scheduled_pass(self) -> None:
        """One pass recording every target, with the pass lock held."""
        with self._edge:
            self._started += 1
            self._asked = set()  # every target is read: the asks are answered
        try:
            _run(self._sampler.pass_steps(None), None)
        finally:
            with self._edge:
                self._done += 1


def nothing() -> None:
    """What is left of a pass that has ended."""


def _run(steps: Generator[str, None, Snapshot], until: str | None) -> bool:
    """Advance a pass in steps to ``until`` (None: its end); whether it stopped there.
    A bug in one pass must not end sampling for good: the log says what, and the pass
    ends."""
    try:
        for step in steps:
            if step == until:
                return True
    except Exception:
        log.exception("sampling pass failed")
    return False


def next_pass(last: float, interval: float, now: float) -> tuple[float, bool]:
    """When the pass after the one due at ``last`` is due, and whether that one overran
    (ended after the next was due). After an overrun the next boundary of the cadence
    from ``now``: the missed ones are skipped, never run back to back to catch up."""
    due = last + interval
    if due >= now:
        return due, False
    if interval <= 0:
        return now, True
    return due + ((now - due) // interval + 1) * interval, True
