"""Text shown to people, made safe to show: bounded however large the value, and free
of control characters that a terminal would act on."""

from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 8, 8
_REPR.maxstring = _REPR.maxother = 80
# C0 and C1 controls and DEL: ESC sequences could retitle, recolour or rewrite what a
# terminal shows; newlines and tabs would break a table's rows.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}


def shown(value: object) -> str:
    """repr() of ``value`` cut to a few dozen characters, without building the whole
    repr first (a YAML alias bomb expands to millions of items)."""
    return _REPR.repr(value)


def printable(text: str) -> str:
    """``text`` with every control character written as a \\xNN escape."""
    return text.translate(_CONTROLS)
