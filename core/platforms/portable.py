"""The psutil platform, where /proc is absent (macOS, Windows, BSD): psutil in place of
procfs behind the platform seam; everything else (sampler, target table, history,
summaries, phases, attribution) is the daemon's own code. Imported only when that
backend is chosen (edgewatt.core.platforms.choose).

Same keys, units and meaning as the procfs backend. Where an OS cannot give a figure
it is absent (None), never 0:

- disk bytes: macOS has no per-process I/O counters; Windows counts all I/O, not
  only what reached storage (psutil's read_bytes/write_bytes there).
- open file descriptors: Windows has handles, not fds: absent there.
- CPU of reaped descendants: Linux reports it in the parent (cutime/cstime, psutil's
  children_user/children_system) and it is counted as the procfs backend counts it;
  macOS and Windows do not, so a descendant's CPU is carried from the last time it was
  seen alive (its last interval before exiting is lost).
- per-process TCP bytes: only the daemon counts them (sock_diag), as on Linux
  without a daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import psutil

from edgewatt.core.channels import CHANNELS, NAMES, NO_COUNTS
from edgewatt.core.facts.cpu_rate import CpuRate
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.facts.procfs import NoSuchProcess
from edgewatt.core.facts.system import HostCpu, HostMemory, InterfaceBytes

# Resolution of the start time that, with the pid, names a process: psutil gives the
# creation time in seconds; the target table counts it in ticks since boot.
TICKS = 100
# Linux is the one OS where a parent's figures include its reaped children's.
_REAPED_IN_PARENT = psutil.LINUX
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)
# Host CPU time in interrupts: irq + softirq on Linux, interrupt + dpc on Windows.
_INTERRUPT_FIELDS = ("irq", "softirq", "interrupt", "dpc")


# A process's cumulative counters as psutil gives them (CPU in seconds, where
# member_counters.Counters counts /proc's ticks; reaped children's included where the
# OS adds them, Linux), by name, then its channels' (core/channels.py): its own on
# every OS (no parent shows its reaped children's), 0 where psutil has none here.
Counters = NamedTuple(  # its channels' fields from the declaration
    "Counters",
    [
        ("user_s", float),
        ("system_s", float),
        ("read_bytes", int),
        ("write_bytes", int),
        *((name, int) for name in NAMES),
    ],
)
# The psutil methods the channels are read from, each called once; whether psutil
# gives each channel on this OS (else its figure is None).
_METHODS = tuple(dict.fromkeys(c.psutil[0] for c in CHANNELS if c.psutil is not None))
_GIVEN = tuple(c.psutil is not None and hasattr(psutil.Process, c.psutil[0]) for c in CHANNELS)


ZERO = Counters(0.0, 0.0, 0, 0, *NO_COUNTS)


def _sum(counters: Iterable[Counters]) -> Counters:
    return Counters._make(map(sum, zip(ZERO, *counters)))


class PsutilHandle:
    """A process's identity as the target table keeps it (procfs.ProcHandle's role)."""

    def __init__(self, pid: int, proc: str = "", expect_start: int | None = None) -> None:
        try:
            self.process = psutil.Process(pid)
            created = self.process.create_time()
        except _GONE as exc:
            raise NoSuchProcess(pid) from exc
        try:
            self.executable = self.process.name()
        except psutil.Error:
            self.executable = ""
        self.pid = pid
        self.start_ticks = round((created - psutil.boot_time()) * TICKS)
        if expect_start is not None and self.start_ticks != expect_start:
            raise NoSuchProcess(pid, "pid reused by a newer process")

    def refuses(self, uid: int) -> None:
        """The client's own table watches only its own processes: nothing to refuse."""
        return None

    def close(self) -> None:
        pass  # psutil holds nothing open between calls


def _read(process: psutil.Process) -> tuple[Counters, dict[str, Any]]:
    """(Its counters, its other figures and when the CPU was read) of one process."""
    with process.oneshot():
        # Rates divide by the time between two reads: stamp just before the CPU read.
        # The thread holds the GIL until the read's syscall; after it, each GIL
        # release (open, read, close) may wait a switch interval in a busy process.
        stamp = (time.time(), time.monotonic())
        cpu = process.cpu_times()
        memory = process.memory_info()
        threads = process.num_threads()
        try:
            io = process.io_counters()
        except (AttributeError, psutil.AccessDenied):  # macOS has none
            io = None
        try:
            fds = process.num_fds()
        except (AttributeError, psutil.AccessDenied):  # Windows has handles
            fds = None
        ppid = process.ppid()
        given = {m: getattr(process, m)() for m in _METHODS if hasattr(process, m)}
    user = cpu.user + getattr(cpu, "children_user", 0.0)
    system = cpu.system + getattr(cpu, "children_system", 0.0)
    read, write = (io.read_bytes, io.write_bytes) if io else (0, 0)
    counts = (
        getattr(given[c.psutil[0]], c.psutil[1]) if ok and c.psutil is not None else 0
        for c, ok in zip(CHANNELS, _GIVEN)
    )
    counters = Counters(user, system, read, write, *counts)
    other = {"rss": memory.rss, "vms": memory.vms, "threads": threads, "fds": fds, "io": io}
    return counters, {**other, "ppid": ppid, "stamp": stamp}


class PsutilTree:
    """One target and (by default) its descendants, read through psutil; the same
    counting rules as core/facts/process.py: counters never go backwards.

    Descendants are found once with ``children(recursive=True)`` and then followed by
    looking only at processes started since the last pass (``psutil.pids()``, one
    call): a new process whose parent is a member joins. ``children()`` itself reads
    every process on Linux, which inside a busy training process costs a thread
    switch per file (465 ms measured against one spinning thread).
    """

    def __init__(self, handle: PsutilHandle, *, children: bool, logical_cpus: int) -> None:
        self.root = handle.process
        self.children = children
        self._rate = CpuRate(logical_cpus)
        self._members: dict[int, psutil.Process] = {self.root.pid: self.root}
        self._pids: set[int] | None = None  # every pid at the last discovery
        # (pid, create time) -> (counters, ppid) as last seen
        self._last: dict[tuple[int, float], tuple[Counters, int]] = {}
        self._carried = ZERO
        self._value = ZERO
        self.lost_members = False
        self.last: TreeReading | None = None
        # As held_fork.py on Linux: 1 once a first process that was a held fork (its
        # parent's command line, not exec'd yet: `edgewatt run`'s) has exec'd; the
        # memory read before was the registrant's. Told by the command line, else (a
        # zombie has none) by the name.
        self.root_execs = 0
        self._held: tuple[list[str], str] | None = None
        self._first = True

    def _note_exec(self) -> None:
        if not self._first and self._held is None:
            return  # known
        try:
            name = self.root.name()
            try:
                cmdline: list[str] | None = self.root.cmdline() or None
            except psutil.ZombieProcess:
                cmdline = None
        except (*_GONE, psutil.AccessDenied):
            return
        if self._first:
            self._first = False
            try:
                parent = self.root.parent()
                held = parent is not None and cmdline is not None and parent.cmdline() == cmdline
            except (*_GONE, psutil.AccessDenied):
                held = False
            self._held = (cmdline, name) if held and cmdline is not None else None
            return
        assert self._held is not None
        if (cmdline != self._held[0]) if cmdline is not None else (name != self._held[1]):
            self.root_execs, self._held = 1, None

    def exit_figures(self) -> None:
        return None  # taskstats is Linux's: the daemon's

    def sample(self, children_of: Any) -> TreeReading:
        self._note_exec()  # a zombie's too, before its end is found
        try:
            root = _read(self.root)
        except _GONE as exc:
            raise NoSuchProcess(self.root.pid) from exc
        read_at, read_at_monotonic = root[1]["stamp"]
        if self.children:
            self._discover()
        members = {(self.root.pid, self.root.create_time()): root}
        for pid, process in list(self._members.items()):
            if process is self.root:
                continue
            try:
                if not process.is_running():  # exited, or its pid reused
                    raise psutil.NoSuchProcess(pid)
                members[(pid, process.create_time())] = _read(process)
            except (*_GONE, psutil.AccessDenied):
                del self._members[pid]
        self._carry_departed(members)
        combined = _sum([*(m[0] for m in members.values()), self._carried])
        self._value = value = Counters._make(map(max, self._value, combined))
        user, system = value.user_s, value.system_s
        figures = [m[1] for m in members.values()]
        io_known = root[1]["io"] is not None
        fds = [f["fds"] for f in figures]
        by_mode = self._rate.update(read_at_monotonic, user, system)
        self.last = TreeReading(
            time=read_at,
            cpu_user_s=user,
            cpu_system_s=system,
            cpu_utilization=None if by_mode is None else by_mode[0] + by_mode[1],
            cpu_mode_utilization=by_mode,
            rss_bytes=sum(f["rss"] for f in figures),
            vms_bytes=sum(f["vms"] for f in figures),
            read_bytes=int(value.read_bytes) if io_known else None,
            write_bytes=int(value.write_bytes) if io_known else None,
            threads=sum(f["threads"] for f in figures),
            open_fds=None if None in fds else sum(fds),
            pids=tuple(pid for pid, _ in members),
            root_execs=self.root_execs,
            counts=tuple(v if ok else None for v, ok in zip(value[4:], _GIVEN)),
        )
        return self.last

    def _discover(self) -> None:
        pids = set(psutil.pids())
        if self._pids is None:
            try:
                found = self.root.children(recursive=True)
            except _GONE:
                found = []
            self._members.update((p.pid, p) for p in found)
        else:
            # Parents are older than their children: ascending order meets them first.
            for pid in sorted(pids - self._pids):
                try:
                    process = psutil.Process(pid)
                    parent = process.ppid()
                except (*_GONE, psutil.AccessDenied):
                    continue
                if parent in self._members:
                    self._members[pid] = process
        self._pids = pids

    def _carry_departed(self, members: dict[tuple[int, float], Any]) -> None:
        live_pids = {pid for pid, _ in members}
        departed = [v for k, v in self._last.items() if k not in members]
        self.lost_members = bool(departed)
        self._carried = _sum(
            [self._carried]
            # Reaped by a live member: the kernel moved its figures there, all but its
            # channels' counts.
            + [
                c._replace(user_s=0.0, system_s=0.0, read_bytes=0, write_bytes=0)
                if _REAPED_IN_PARENT and ppid in live_pids
                else c
                for c, ppid in departed
            ]
        )
        self._last = {k: (v[0], v[1]["ppid"]) for k, v in members.items()}

    def close(self) -> None:
        pass


class PsutilPlatform:
    """The platform seam (edgewatt.core.platforms.Platform) through psutil."""

    name = "psutil"
    clock_ticks = TICKS

    def boot_time(self) -> float:
        return psutil.boot_time()

    def open_process(self, pid: int, proc: str = "", expect_start: int | None = None) -> Any:
        return PsutilHandle(pid, proc, expect_start)

    def logical_cpus(self) -> int:
        return psutil.cpu_count() or 1

    def process_tree(
        self, handle: Any, *, children: bool, logical_cpus: int, **_: Any
    ) -> PsutilTree:
        # Lineage from the kernel's events and its exit records are the daemon's (Linux).
        assert isinstance(handle, PsutilHandle)
        return PsutilTree(handle, children=children, logical_cpus=logical_cpus)

    def descendants(self, fresh: Callable[[], bool]) -> Callable[[int], list[int]]:
        # A PsutilTree follows its own descendants (see its docstring).
        return lambda pid: []

    def holds_gpu(self, pid: int) -> bool:
        return False  # psutil lists regular files only; GPU rails are a Jetson's

    def read_host(self) -> tuple[HostCpu, HostMemory, dict[str, InterfaceBytes]]:
        memory = psutil.virtual_memory()
        buffers = getattr(memory, "buffers", 0)
        cached = getattr(memory, "cached", 0)
        free = memory.free
        used = max(memory.total - free - buffers - cached, 0)
        states = {"used": used, "free": free, "buffers": buffers, "cached": cached}
        network = {
            name: InterfaceBytes(receive=io.bytes_recv, transmit=io.bytes_sent)
            for name, io in psutil.net_io_counters(pernic=True).items()
        }
        return self.read_host_cpu(), HostMemory(memory.total, states), network

    def read_host_cpu(self) -> HostCpu:
        times = psutil.cpu_times()
        modes = {
            "user": times.user,
            "nice": getattr(times, "nice", 0.0),
            "system": times.system,
            "idle": times.idle,
            "iowait": getattr(times, "iowait", 0.0),
            "interrupt": sum(getattr(times, k, 0.0) for k in _INTERRUPT_FIELDS),
            "steal": getattr(times, "steal", 0.0),
        }
        return HostCpu(modes, self.logical_cpus())

    def close(self) -> None:
        pass  # psutil holds nothing open between calls
