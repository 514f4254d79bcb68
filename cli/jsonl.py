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


def is_number(value: Any) -> bool:
    """A finite int or float (never a bool, a string or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_numbers(lines: Lines, number: int, record: dict[str, Any], keys: tuple[str, ...]) -> None:
    """ValueError naming file, line and field for each of ``keys`` present in
    ``record`` that is not a number (None allowed: a figure not measured)."""
    for key in keys:
        value = record.get(key)
        if value is not None and not is_number(value):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise lines.error(number, f"{key} must be a number, got {shown}")
