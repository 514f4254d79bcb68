"""The board input streamed by the native reader (_stream.c), where it was built.

A Python thread's wake is most of what a reading costs (docs/performance.md); the
native thread reads the same open sysfs files without the GIL, at a rate the meter
changes at once (the window rate at an edge), and keeps the raw values, which the
meter drains at each edge. Where the extension is absent (no C compiler or Python
headers at install), or ``EDGEWATT_NATIVE_READER=0``, the meter's own threads read.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

log = logging.getLogger(__name__)

# Readings a stream's ring holds between two drains: 33 s at the highest rate (1 kHz).
# The meter drains it at every edge and, between edges further apart, every
# meter.NATIVE_DRAIN_S, so none is dropped whatever the pass interval.
RING_READINGS = 32768

try:
    from edgewatt.core.power import _stream
except ImportError:  # built optionally: the Python reader then
    _stream = None


class Streamable(Protocol):
    """A source whose stream is a few value files (ina3221.Ina3221Source)."""

    name: str

    def stream_fds(self) -> tuple[int, ...] | None: ...

    def total_from(self, values: tuple[int, ...]) -> float | None: ...


def available() -> bool:
    return _stream is not None and os.environ.get("EDGEWATT_NATIVE_READER", "1") != "0"


class NativeStream:
    def __init__(self, source: Streamable, fds: tuple[int, ...], hz: float) -> None:
        self.source = source
        self._stream = _stream.Stream(fds, hz, RING_READINGS)  # type: ignore[union-attr]
        self.hz = hz
        self._lost = 0

    def set_hz(self, hz: float) -> None:
        if hz != self.hz:
            self._stream.set_hz(hz)
            self.hz = hz

    def drain(self) -> list[tuple[float, float]]:
        """(monotonic, W) of the board total at each reading since the last drain."""
        total_from = self.source.total_from
        lost = self._stream.stats()[1]
        if lost > self._lost:  # the drains came too seldom: a bug, say so
            log.warning(
                "native power reader of %s: %d readings dropped, its ring was full",
                self.source.name,
                lost - self._lost,
            )
            self._lost = lost
        return [
            (t, w) for t, values in self._stream.drain() if (w := total_from(values)) is not None
        ]

    def cpu_s(self) -> float:
        """The native thread's CPU clock (wakes included)."""
        return self._stream.cpu_s()

    def close(self) -> None:
        self._stream.close()


def stream(source: object, hz: float) -> NativeStream | None:
    """The native stream of ``source``, or None where it cannot have one."""
    if not available():
        return None
    fds = getattr(source, "stream_fds", lambda: None)()
    if not fds:
        return None
    try:
        return NativeStream(source, fds, hz)  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        log.warning("native power reader unavailable, the Python one reads: %s", exc)
        return None
