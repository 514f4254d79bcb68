"""The largest peak RSS among a command's processes, from what the kernel recorded at
each one's exit: for a run no sampling pass saw alive (`/bin/true`, a 0.06 s curl).

Two records, the better first:

- taskstats (CAP_NET_ADMIN): each exiting process's peak RSS of the address space it
  exits with, so of the program it exec'd, never of the fork before. A process is the
  command's when its parent's chain ends at the command's first process, or at one of
  the orphans `edgewatt run` reaped (records come child first: a child waits under its
  parent's pid until the parent's own record places it).
- wait4 (no privilege): each reaped process's ru_maxrss, its reaped children's
  included. The kernel keeps it across an exec, so the command's first process counts
  the fork of this Python before its exec too; the fork reports its own ru_maxrss just
  before the exec (run._Held), and only a figure above that one (by more than the
  kernel's counters may move on their own: counter_slack) is the command's.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS

# How often the listener's socket is drained during a run (its buffer holds ~27,000
# records: seconds of a busy host's exits).
DRAIN_S = 0.5
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, **SLOTS)
class ExitPeak:
    """The largest peak RSS of one of the command's processes, in bytes."""

    bytes: int
    source: str  # which record, in words
    bound: bool = False  # True: at most ``bytes`` (wait4 could not tell the fork apart)


class Listener:
    """Every process exit on the host from the command's fork on (taskstats), folded
    into the command's processes' largest peak RSS as the records come."""

    def __init__(self, root: int) -> None:
        from edgewatt.core.kernel.taskstats import TaskstatsSocket

        self.root = root
        self._own = os.getpid()
        self._socket = TaskstatsSocket()  # OSError without CAP_NET_ADMIN
        self.overflowed = False
        self.root_peak: int | None = None
        # Exited processes whose parent's record has not come: their subtree's largest
        # peak under the parent's pid (one entry per parent still running).
        self._waiting: dict[int, int] = {}
        # This process's children but the command's first (orphans it reaped, and
        # the monitoring's helpers): each one's subtree's largest peak.
        self._adopted: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain_loop, daemon=True)
        self._thread.start()

    def _drain_loop(self) -> None:
        while not self._stop.wait(DRAIN_S):
            self.drain()

    def drain(self) -> None:
        records, overflowed = self._socket.drain()
        self.overflowed = self.overflowed or overflowed
        for r in records:
            peak = r.hiwater_rss_bytes
            if r.pid != r.tgid:  # a thread: its process's address space, its leader's
                self._waiting[r.tgid] = max(self._waiting.get(r.tgid, 0), peak)
                continue
            peak = max(peak, self._waiting.pop(r.pid, 0))
            if r.pid == self.root and r.ppid == self._own:
                self.root_peak = peak
            elif r.ppid == self._own:
                self._adopted[r.pid] = peak
            else:
                self._waiting[r.ppid] = max(self._waiting.get(r.ppid, 0), peak)

    def close(self, reaped: set[int]) -> int | None:
        """The largest peak over the command's first process and the orphans of it in
        ``reaped``; None where records were lost or the first process's never came."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.drain()  # every reaped process's record is in the buffer already
        self._socket.close()
        if self.overflowed or self.root_peak is None:
            return None
        return max([self.root_peak, *(self._adopted.get(pid, 0) for pid in reaped)])


def counter_slack() -> int:
    """Bytes by which the kernel's RSS counters may move without a page more mapped: each
    CPU keeps up to a batch of pages (max(32, 2 x CPUs)) of each of the three counters
    (anon, file, shmem) before folding them into the count that ru_maxrss reads; the
    fork's last faults before its exec may fold them in."""
    cpus = os.cpu_count() or 1
    return max(32, 2 * cpus) * cpus * 3 * PAGE


class ExitPeaks:
    """The command's processes' exit records of peak RSS, gathered while it runs."""

    def __init__(self, root: int, listen: bool = True) -> None:
        """``listen`` False: a daemon hears every exit record already (its final
        summary has the command's peaks), and no second listener is opened."""
        self.root = root
        self.fork_peak: int | None = None  # bytes: the fork's own, reported before its exec
        self.reaped: dict[int, int] = {}  # pid -> wait4's ru_maxrss, bytes
        self.listener: Listener | None = None
        self.why_not = ""  # why there is no taskstats listener
        if not listen:
            self.why_not = "taskstats: the daemon listens, and its records had no peak of it"
            return
        try:
            self.listener = Listener(root)
        except OSError as exc:
            self.why_not = f"taskstats: {exc.strerror or exc}"
        except AttributeError:  # no AF_NETLINK: not Linux
            self.why_not = "taskstats: Linux only"

    @staticmethod
    def bytes(maxrss: int) -> int:
        """An ru_maxrss in bytes (it is KiB on Linux, bytes on macOS)."""
        return maxrss if sys.platform == "darwin" else maxrss * 1024

    def reaped_one(self, pid: int, maxrss: int) -> None:
        """wait4's ru_maxrss of a process just reaped."""
        self.reaped[pid] = self.bytes(maxrss)

    def result(self) -> ExitPeak | None:
        """The largest peak RSS, from the exit records where the listener heard them all,
        else wait4's where it is above the fork's own (or a bound at the fork's)."""
        if self.listener is not None:
            peak = self.listener.close(set(self.reaped) - {self.root})
            self.listener = None
            if peak is not None:
                return ExitPeak(peak, "the kernel's exit records (taskstats)")
            self.why_not = "taskstats: records lost (its socket's buffer overflowed)"
        if not self.reaped:
            return None
        peak = max(self.reaped.values())
        if self.fork_peak is not None and peak > self.fork_peak + counter_slack():
            return ExitPeak(peak, "wait4 (each reaped process's ru_maxrss)")
        if self.fork_peak is None:
            return None
        why = f"wait4, which counts edgewatt run's fork before the exec; {self.why_not}"
        return ExitPeak(self.fork_peak, why, bound=True)
