"""An answer built once per pass and shared by every request for it: however often
and however many clients ask, the daemon builds and encodes it once a pass, and every
connection sends the same bytes (one copy in memory, whichever client reads slowly).

Keyed by the pass's instant: the snapshot's time moves with every pass, the regular
ones and those a registration, a phase or an exit takes, so an answer is never older
than the figures it is built from.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable
from typing import Any


class Encoded:
    """A body already encoded as JSON (unix_http sends it as it is)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class OncePerPass:
    def __init__(self) -> None:
        # One builder at a time: requests that come together wait for the one build
        # rather than each building its own.
        self._lock = threading.Lock()
        self._key: Hashable = None
        self._answer = Encoded(b"")
        self.builds = 0  # how often it was built (tests, benchmarks)

    def get(self, key: Hashable, build: Callable[[], Any]) -> Encoded:
        """The answer for the pass ``key``: built by ``build()`` if not yet."""
        with self._lock:
            if key is None or key != self._key:
                self._answer = Encoded(json.dumps(build()).encode())
                self._key = key
                self.builds += 1
            return self._answer
