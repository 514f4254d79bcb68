"""An answer built once per pass and shared by every request for it: however often
and however many clients ask, the daemon builds and encodes it once a pass, and every
connection sends the same bytes (one copy in memory, whichever client reads slowly).

Keyed by the pass's instant: the snapshot's time moves with every pass, the regular
ones and those a registration, a phase or an exit takes, so an answer is never older
than the figures it is built from.

Readers may read it differently (read_rules.py: root all of it, a user the owner-only
fields of her own targets alone): a list of targets is built as fragments, each entry
encoded twice (whole, and as another user reads it), and each request's answer is the
list of its fragments, sent one after the other, never joined into a copy of its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from edgewatt.exporter.read_rules import may_read_all, redacted

T = TypeVar("T")


class Encoded:
    """A body already encoded as JSON, in parts sent as they are, one after the other
    (unix_http)."""

    __slots__ = ("parts",)

    def __init__(self, *parts: bytes) -> None:
        self.parts = parts


class Listing:
    """A JSON object whose last field, ``key``, lists targets: the rest encoded once,
    each target's entry once whole and once redacted (read_rules.py)."""

    __slots__ = ("_entries", "_head")

    def __init__(self, document: dict[str, Any], key: str, owners: list[int]) -> None:
        """``owners``: each entry's registrant, in the order of ``document[key]``."""
        rest = {k: v for k, v in document.items() if k != key}
        self._head = json.dumps(rest)[:-1].encode() + f'{", " if rest else ""}"{key}": ['.encode()
        self._entries = [
            (owner, json.dumps(entry).encode(), json.dumps(redacted(entry)).encode())
            for entry, owner in zip(document[key], owners)
        ]

    def read_by(self, reader: int) -> Encoded:
        """The document as ``reader`` (a uid) may read it."""
        parts = [self._head]
        for owner, whole, other in self._entries:
            parts.append(whole if may_read_all(reader, owner) else other)
            parts.append(b", ")
        if self._entries:
            parts.pop()
        parts.append(b"]}")
        return Encoded(*parts)


class OncePerPass(Generic[T]):
    def __init__(self) -> None:
        # One builder at a time: requests that come together wait for the one build
        # rather than each building its own.
        self._lock = threading.Lock()
        self._key: Hashable = None
        self._built: T | None = None

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """What ``build()`` built for the pass ``key``: built now if not yet."""
        with self._lock:
            if self._built is None or key is None or key != self._key:
                self._built = build()
                self._key = key
            return self._built
