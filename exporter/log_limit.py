"""The daemon's log bounded per kind of line: whatever a client sends, one kind of
line (one logger, one message template) is written at most ``burst`` times a
``window_s``; the first line of the next window says how many were left out.

A kind is the template, not the formatted line: a flood of requests that each fail
differently (another path, another pid) is still one kind. Tracebacks count with
their line. The kinds remembered are bounded too (the oldest window is dropped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

# Per kind: 10 lines a minute; at most 1,000 kinds remembered (a kind is a
# template of the code's, so far fewer exist).
BURST = 10
WINDOW_S = 60.0
MAX_KINDS = 1000


class _Window:
    __slots__ = ("dropped", "start", "written")

    def __init__(self, start: float) -> None:
        self.start = start
        self.written = 0
        self.dropped = 0


class KindLimit(logging.Filter):
    """A handler's filter: at most ``burst`` records of one kind per ``window_s``."""

    def __init__(
        self,
        burst: int = BURST,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()
        self._lock = threading.Lock()  # records come from every thread

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window.start >= self.window_s:
                dropped = window.dropped if window is not None else 0
                window = self._windows[kind] = _Window(now)
                self._windows.move_to_end(kind)
                while len(self._windows) > MAX_KINDS:
                    self._windows.popitem(last=False)
                if dropped:
                    # Said on the line itself: a filter may not add a record.
                    left_out = f"{dropped} more like this left out in {self.window_s:g} s"
                    record.msg = f"{record.msg} [{left_out}]"
            if window.written >= self.burst:
                window.dropped += 1
                return False
            window.written += 1
            return True


def limit_handlers(logger: logging.Logger, limit: KindLimit) -> None:
    """Put ``limit`` on each of ``logger``'s handlers (once)."""
    for handler in logger.handlers:
        if limit not in handler.filters:
            handler.addFilter(limit)
