"""Whether a target began as a fork held before its exec (`edgewatt run`'s: registered,
then released to exec the command), and when it exec'd: the memory sampled before was
the registrant's own (16-17 MiB of Python), not the command's.

A fork shares its parent's address space layout, the stack's start included, until it
execs, and every exec places a new stack (ASLR). So a first process whose stack starts
where its parent's does has not exec'd since the fork. Only that first exec counts: a
command that execs again (a shell's ``exec``, a program re-exec'ing itself after its
work) holds its own memory before the later exec, and a process registered after its
exec (a script's own register(), a pid) never was the registrant's.
"""

from __future__ import annotations

from edgewatt.core.facts.procfs import Stat, parse_stat


def read_stat(pid: int, proc: str = "/proc") -> Stat | None:
    """The process's stat (a zombie's too); None once it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="utf-8") as f:
            return parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


class HeldFork:
    """Watches a target's first process from its first reading until it is known: a
    held fork that exec'd (``execs`` 1), or not a held fork (``execs`` stays 0)."""

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self.pid = pid
        self._proc = proc
        self._first = True
        # While held: its identity (start ticks), comm and stack's start then.
        self._held: tuple[int, str, int] | None = None
        self.execs = 0
        # Its start (ticks after boot) where it was a held fork at the first reading:
        # then it is the root of everything its target runs (its exit status is theirs).
        self.held_start: int | None = None

    def note(self, stat: Stat | None = None) -> None:
        """A pass's ``stat`` of the process (None: read here, a zombie's included: a
        command that ran and exited between two passes still shows its comm)."""
        if not self._first and self._held is None:
            return  # known: nothing more to read
        stat = stat or read_stat(self.pid, self._proc)
        if stat is None:
            return
        if self._first:
            self._first = False
            parent = read_stat(stat.ppid, self._proc)
            if stat.start_stack and parent is not None and parent.start_stack == stat.start_stack:
                self._held = (stat.start_ticks, stat.comm, stat.start_stack)
                self.held_start = stat.start_ticks
            return
        assert self._held is not None
        ticks, comm, stack = self._held
        if stat.start_ticks != ticks:  # another process under its pid: it went unseen
            self._held = None
            return
        # The stack's start where the kernel shows it; a zombie (no memory left) has
        # none, and only its comm tells (`true` after the wrapper's `python3`).
        if (stat.start_stack != stack) if stat.start_stack else (stat.comm != comm):
            self.execs, self._held = 1, None
