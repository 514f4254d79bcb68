"""The edgewatt figures a Flower client may put in its line of the server's round file:
known keys only, each of one type and within what is physically possible. A client's
record is input from another machine: whatever it holds, it can change only its own
figures, never the fields the server sets (``type``, ``round``, ``kind``,
``node_id``) nor the file's format."""

from __future__ import annotations

import math
from typing import Any

KIND = "fl-round"  # each line's type: what `edgewatt report` reads
MAX_TEXT = 256  # characters of a string field (a host name is at most 64 on Linux)
MAX_SECONDS = 1e7  # ~116 days: a round's wall or CPU time
MAX_JOULES = 1e9  # 1 kW for ~12 days
MAX_BYTES = 1 << 50  # 1 PiB in one round

_SECONDS = ("duration_s", "cpu_s")
_JOULES = ("energy_j", "device_energy_j")
_BYTES = ("bytes_received", "bytes_sent", "rss_peak_bytes")
# The *_provenance: where each energy figure comes from, as a line (core/energy_source.py).
_TEXT = ("phase", "bytes_source", "host_name", "source", "target", "energy_provenance",
         "device_energy_provenance")  # fmt: skip
_FLAGS = ("exact", "shorter_than_sensor_period", "final")


def _number(value: Any, bound: float) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= bound
    )


def _valid(key: str, value: Any) -> bool:
    if key in _SECONDS:
        return _number(value, MAX_SECONDS)
    if key in _JOULES:
        return _number(value, MAX_JOULES)
    if key in _BYTES:
        return isinstance(value, int) and _number(value, MAX_BYTES)
    if key in _TEXT:
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if key in _FLAGS:
        return isinstance(value, bool)
    return False  # unknown, or one of the server's


def client_figures(record: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the figures of ``record`` that are valid, the keys of those dropped, each cut
    to ``MAX_TEXT`` characters)."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in record.items():
        if key in ("round", "kind"):  # the mod's copy of what the server sets anyway
            continue
        if isinstance(key, str) and _valid(key, value):
            kept[key] = value
        else:
            dropped.append(str(key)[:MAX_TEXT])
    return kept, dropped
