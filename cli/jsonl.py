"""The JSON Lines files `edgewatt report` reads (a monitor's, a federation's rounds):
each record with its line number, every problem named by file and line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class Lines:
    """The records of one file, in order, as ``(line number, record)``. A last line
    without its newline that is not a record (a run cut off mid-write, a board that
    lost power) is skipped, and said once in ``warnings``; any other line that is not
    UTF-8 text or not a JSON object raises ValueError naming file and line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.warnings: list[str] = []
        self.records: list[tuple[int, dict[str, Any]]] = []
        data = Path(path).read_bytes()
        lines = data.split(b"\n")
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:  # UnicodeDecodeError is one
                if number == len(lines):  # after the last newline: cut off
                    self.warnings.append(
                        f"{path}:{number}: the last line is cut off ({len(raw)} bytes without "
                        "a newline); skipped"
                    )
                    continue
                raise ValueError(f"{path}:{number}: {_why(exc)}") from None
            self.records.append((number, record))

    def error(self, number: int, what: str) -> ValueError:
        return ValueError(f"{self.path}:{number}: {what}")


def _why(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        byte = exc.object[exc.start]
        return f"not UTF-8 text (byte 0x{byte:02x} at column {exc.start + 1})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not a JSON record ({exc.msg} at column {exc.colno})"
    return f"not a record ({exc})"


# What a figure in a record can physically be. A Unix time from 1970 until 2106;
# a duration or CPU time at most as long; bytes, counts and percentages at most
# 2**63 and never below zero. Watts and joules may read a little below zero (a
# current monitor's offset at rest), never beyond LARGEST either way.
TIME_KEYS = frozenset({"timestamp", "started_at", "ended_at", "start_time", "end_time"})
LATEST_S = 2.0**32
LARGEST = 2.0**63


def is_number(value: Any) -> bool:
    """A finite int or float (never a bool, a string or NaN), of at most LARGEST."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # An int of thousands of digits is no float (math.isfinite() raises on it).
    return abs(value) <= LARGEST if isinstance(value, int) else math.isfinite(value)


def _impossible(key: str, value: float) -> str | None:
    """Why ``value`` cannot be the figure ``key`` (its unit's range), or None."""
    if key in TIME_KEYS:
        return None if 0 <= value < LATEST_S else "a Unix time from 1970 to 2106"
    if key.endswith(("_w", "_j")) or key.startswith("power_"):
        return None if abs(value) <= LARGEST else f"within +-{LARGEST:.0e}"
    if key.endswith("_s"):
        return None if 0 <= value < LATEST_S else f"0 to {LATEST_S:.0f} s"
    return None if 0 <= value <= LARGEST else f"0 to {LARGEST:.0e}"


def check_numbers(lines: Lines, number: int, record: dict[str, Any], keys: tuple[str, ...]) -> None:
    """ValueError naming file, line and field for each of ``keys`` present in
    ``record`` that is not a number (None allowed: a figure not measured) or not one
    its unit allows."""
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        if not is_number(value):
            raise lines.error(number, f"{key} must be a number, got {_shown(value)}")
        why = _impossible(key, value)
        if why is not None:
            raise lines.error(number, f"{key} must be {why}, got {_shown(value)}")


def _shown(value: Any) -> str:
    """Its repr, cut to 40 characters (never the whole of a 4,000-digit int)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST:
        return f"an integer of {len(str(abs(value)))} digits"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
