"""Text shown to people, made safe to show: bounded however large the value, and free
of characters that a terminal would act on or that change how the text reads."""

from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 8, 8
_REPR.maxstring = _REPR.maxother = 80


def shown(value: object) -> str:
    """repr() of ``value`` cut to a few dozen characters, without building the whole
    repr first (a YAML alias bomb expands to millions of items)."""
    return _REPR.repr(value)


def printable(text: str) -> str:
    """``text`` with every character that changes how text reads written as an escape
    (\\xNN, \\uNNNN or \\UNNNNNNNN): controls (ESC sequences could retitle, recolour
    or rewrite what a terminal shows; newlines and tabs would break a table's rows),
    and what str.isprintable() refuses beside them: BiDi overrides and isolates
    (U+202E shows "exe.txt" as "txt.exe"), invisible format characters (U+200B,
    U+2060, U+FEFF), line and paragraph separators, unassigned and private code
    points, and spaces other than ASCII's."""
    if text.isprintable():  # the common case, decided in C
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
