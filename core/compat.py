"""What differs between the Python versions edgewatt runs on (3.8 to 3.13), in one
place. Standard library only: the client imports it."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, TypeVar

# dataclass(slots=True) is 3.10+: where present, slots save memory per sample and
# time per attribute; on 3.8 and 3.9 the classes are plain dataclasses.
SLOTS: dict[str, Any] = {"slots": True} if sys.version_info >= (3, 10) else {}

T = TypeVar("T", str, bytes)


def removeprefix(text: T, prefix: T) -> T:
    """str.removeprefix (3.9+), for str and bytes."""
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


def removesuffix(text: T, suffix: T) -> T:
    """str.removesuffix (3.9+), for str and bytes."""
    return text[: -len(suffix)] if suffix and text.endswith(suffix) else text


def exit_code(status: int) -> int:
    """os.waitstatus_to_exitcode (3.9+): the exit status, or -N for signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def name_thread(thread: threading.Thread) -> None:
    """Give a started thread its name in the kernel too (15 bytes: what ``top -H``,
    ``ps -L`` and /proc/PID/task/TID/comm show, how the benchmarks tell the threads
    apart): before 3.14 Python leaves every thread named after the process."""
    if thread.native_id is None:  # not started
        return
    # No /proc, or the thread already ended: it keeps the process's name.
    with contextlib.suppress(OSError), open(f"/proc/self/task/{thread.native_id}/comm", "w") as f:
        f.write(thread.name[:15])
