"""An answer built once per pass and shared by every request for it: however often
and however many clients ask, the daemon builds and encodes it once a pass, and every
connection sends the same bytes (one copy in memory, whichever client reads slowly).

Keyed by the pass's instant: the snapshot's time moves with every pass, the regular
ones and those a registration, a phase or an exit takes, so an answer is never older
than the figures it is built from.

Readers may see it differently (read_rules.py: root all of it, a user the owner-only
fields of her own targets alone): its source is built once a pass, each variant of it
once a pass when first asked, and ``MAX_VARIANTS`` of them are kept for the pass (a
user who owns targets has her own; whoever owns none shares one).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable
from typing import Any

MAX_VARIANTS = 8  # kept a pass; beyond, a variant is built for its request alone


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
        self._source: Any = None
        self._answers: dict[Hashable, Encoded] = {}
        self.builds = 0  # how often the source was built (tests, benchmarks)

    def get(
        self,
        key: Hashable,
        build: Callable[[], Any],
        variant: Callable[[Any], Hashable] = lambda source: None,
        render: Callable[[Any], Any] = lambda source: source,
    ) -> Encoded:
        """The answer for the pass ``key``: its source built by ``build()`` if not yet;
        the variant ``variant(source)`` names rendered by ``render(source)`` if not yet."""
        with self._lock:
            if key is None or key != self._key:
                self._source = build()
                self._answers = {}
                self._key = key
                self.builds += 1
            which = variant(self._source)
            answer = self._answers.get(which)
            if answer is None:
                answer = Encoded(json.dumps(render(self._source)).encode())
                if len(self._answers) < MAX_VARIANTS:
                    self._answers[which] = answer
            return answer
