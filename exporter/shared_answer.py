"""An answer built once per pass and shared by every request for it: however often
and however many clients ask, the daemon builds and encodes it once a pass, and every
connection sends the same bytes (one copy in memory, whichever client reads slowly).

Keyed by the pass and the API's count of changes (api.py): the snapshot's sequence
(/v1/top: its time) moves with every pass, the regular ones and those a
registration, a phase or an exit takes, and the count with every change a request
makes without one (a second holder leaving, labels joined), so an answer is never
older than what it is built from. GET /v1/top, /v1/targets and each target's
description, summary and samples (without ``since``) are shared so.

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


class Shared:
    """One target's document (its description, summary or samples): encoded once
    whole and once redacted (read_rules.py), the document itself not kept."""

    __slots__ = ("_other", "_owner", "_whole")

    def __init__(self, document: dict[str, Any], owner: int | None) -> None:
        """``owner``: its registrant (None: unknown, gone between two reads)."""
        self._owner = owner
        self._whole = json.dumps(document).encode()
        self._other = json.dumps(redacted(document)).encode()

    def read_by(self, reader: int) -> Encoded:
        return Encoded(self._whole if may_read_all(reader, self._owner) else self._other)


class PerPass(Generic[T]):
    """Answers of the pass by name (each target's summary, say): each built when first
    asked in the pass, all let go when the pass moves on. At most one for each name
    a pass can have (a target's, of those the table holds)."""

    def __init__(self) -> None:
        # One builder at a time: requests that come together wait for the one build
        # rather than each building its own.
        self._lock = threading.Lock()
        self._key: Hashable = None
        self._built: dict[Hashable, T] = {}

    def get(self, key: Hashable, name: Hashable, build: Callable[[], T]) -> T:
        """What ``build()`` built for ``name`` in the pass ``key`` (None: no pass
        known, built anew and not kept)."""
        if key is None:
            return build()
        with self._lock:
            if key != self._key:
                self._built = {}
                self._key = key
            found = self._built.get(name)
            if found is None:
                found = self._built[name] = build()
            return found


class OncePerPass(Generic[T]):
    """The one answer of its kind for the pass (GET /v1/top's, /v1/targets'): a
    PerPass of one name."""

    def __init__(self) -> None:
        self._answers: PerPass[T] = PerPass()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """What ``build()`` built for the pass ``key``: built now if not yet."""
        return self._answers.get(key, None, build)
