"""What a target runs, as a person names it: ``python train.py``, not ``python3.11``.

Read from /proc/PID/cmdline: the program's base name and its first arguments, bounded
(a command line can be 2 MiB) and escaped (an argument is whatever its author passed:
terminal escapes included)."""

from __future__ import annotations

import os

from edgewatt.core.text import printable

# A name shown in a table's column, a dashboard's legend: the rest adds nothing there.
MAX_COMMAND = 80
_READ = 4096  # bytes of the command line read: more than MAX_COMMAND shows


def command_line(pid: int, proc: str = "/proc") -> str | None:
    """The process's command, bounded and escaped; None where it has none to show (a
    kernel thread, a zombie, a process gone or not readable)."""
    try:
        fd = os.open(f"{proc}/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, _READ, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return command_name([w.decode("utf-8", "replace") for w in data.split(b"\0")])


def command_name(argv: list[str]) -> str | None:
    """A command line's name: its program's base name and arguments (the empty ones
    left out), bounded and escaped; None where it has no word to show."""
    words = [w for w in argv if w]
    if not words:
        return None
    words[0] = os.path.basename(words[0]) or words[0]
    text = printable(" ".join(words))
    return text if len(text) <= MAX_COMMAND else text[: MAX_COMMAND - 3] + "..."


def executable_of(name: str | None) -> str | None:
    """The program of a command's name (command_name's first word), None for none."""
    return name.split(" ", 1)[0] if name else None
