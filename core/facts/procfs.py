"""One function per /proc fact, and a handle that pins one process's identity.

Every path is relative to a ``proc`` root (default ``/proc``) so tests can point the
real code at a captured tree. Errors are turned into two domain errors at this
boundary: :class:`NoSuchProcess` (gone, or the pid now belongs to someone else) and
:class:`AccessDenied`.
"""

from __future__ import annotations

import contextlib
import errno
import operator
import os
from typing import NamedTuple

from edgewatt.core import compat
from edgewatt.core.channels import CHANNELS

# Importable where os.sysconf is missing (Windows): the client's psutil backend shares
# the bookkeeping modules that import these; nothing here reads /proc at import.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_GONE = (errno.ESRCH, errno.ENOENT)


class NoSuchProcess(Exception):
    """The process exited, or its pid now names a different process."""

    def __init__(self, pid: int, detail: str = "") -> None:
        super().__init__(f"no such process: pid {pid}" + (f" ({detail})" if detail else ""))
        self.pid = pid


class AccessDenied(Exception):
    """The kernel refused to show this fact for this process."""

    def __init__(self, pid: int, what: str) -> None:
        super().__init__(f"access denied reading {what} of pid {pid}")
        self.pid = pid


class Stat(NamedTuple):
    """The figures of /proc/PID/stat that edgewatt uses, in kernel units (a tuple:
    built for every process on every pass, twice as fast as a frozen dataclass)."""

    comm: str
    state: str
    ppid: int
    utime: int  # clock ticks
    stime: int
    cutime: int  # ticks of reaped (waited-for) descendants
    cstime: int
    num_threads: int
    start_ticks: int  # since boot: with the pid, the process's identity
    vsize: int  # bytes
    rss_pages: int
    # Where its stack starts: randomized at every exec (ASLR); 0 where the kernel hides
    # it (no ptrace access), the process has no memory left (a zombie), or the text
    # stops before field 28 (a stand-in's stat: the other figures are still read).
    start_stack: int
    # The channels read from this file (core/channels.py's stat_field), in their order.
    counts: tuple[int, ...] = ()


# The stat fields of the channels read there (field N is N - 3 after the comm), and
# the keys of those in /proc/PID/status (each line "key:\tvalue").
_STAT_COUNTS = tuple(c.stat_field - 3 for c in CHANNELS if c.stat_field)
_STATUS_KEYS = tuple(b"\n" + c.status_key.encode() + b":" for c in CHANNELS if c.status_key)
# From (status counts..., stat counts...) to the channels' order.
_read_order = [i for i, c in enumerate(CHANNELS) if c.status_key] + [
    i for i, c in enumerate(CHANNELS) if c.stat_field
]
_in_order = (
    None
    if _read_order == sorted(_read_order)
    else operator.itemgetter(*(_read_order.index(i) for i in range(len(CHANNELS))))
)


def parse_stat(text: str) -> Stat:
    # comm may hold spaces and parentheses: it ends at the last ')'.
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    rest = text[close_paren + 2 :].split(maxsplit=26)
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return Stat(
        comm=text[open_paren + 1 : close_paren],
        state=rest[0],
        ppid=int(rest[1]),
        utime=int(rest[11]),
        stime=int(rest[12]),
        cutime=int(rest[13]),
        cstime=int(rest[14]),
        num_threads=int(rest[17]),
        start_ticks=int(rest[19]),
        vsize=int(rest[20]),
        rss_pages=int(rest[21]),
        start_stack=int(rest[25]) if len(rest) > 25 else 0,
        counts=tuple([int(rest[i]) for i in _STAT_COUNTS]),
    )


def parse_io(text: str) -> tuple[int, int]:
    """(read_bytes, write_bytes) from /proc/PID/io: bytes that reached storage."""
    tokens = text.split()  # "name:", value pairs, read for every process every pass
    try:
        return (
            int(tokens[tokens.index("read_bytes:") + 1]),
            int(tokens[tokens.index("write_bytes:") + 1]),
        )
    except (ValueError, IndexError):
        raise ValueError(f"no read_bytes/write_bytes in /proc/PID/io: {text[:80]!r}") from None


class ProcHandle:
    """Open /proc/PID files kept for the life of the process and read with pread.

    Keeping the fds open costs ~20 us a sample instead of ~70 us (field notes), and a
    read through an fd opened before the process died fails with ESRCH even when the
    pid has been reused: the handle can never report a stranger.
    """

    __slots__ = (
        "_io_fd", "_sched_fd", "_stat", "_stat_bytes", "_stat_fd", "_status_fd",
        "executable", "pid", "proc", "start_ticks",
    )  # fmt: skip

    def __init__(self, pid: int, proc: str = "/proc", expect_start: int | None = None) -> None:
        self.pid = pid
        self.proc = proc
        self._io_fd: int | None = None
        self._sched_fd: int | None = None  # opened on first use: threaded processes never ask
        self._status_fd: int | None = None  # opened on first use: a member that ran
        self._stat_bytes = b""  # the stat file as last read, and its parse
        self._stat: Stat | None = None
        try:
            self._stat_fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NoSuchProcess(pid) from exc
        try:
            stat = self.stat()
        except NoSuchProcess:
            self.close()
            raise
        if expect_start is not None and stat.start_ticks != expect_start:
            self.close()
            raise NoSuchProcess(pid, "pid reused by a newer process")
        self.start_ticks = stat.start_ticks
        self.executable = executable_name(pid, stat.comm, proc)
        try:
            self._io_fd = os.open(f"{proc}/{pid}/io", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._io_fd = None  # another user's process without privilege

    def stat(self) -> Stat:
        """The stat file now: the same object as the last call's while its bytes are
        the same (most processes wait: their stat is not parsed again, and a caller
        can tell "unchanged" by identity)."""
        try:
            data = os.pread(self._stat_fd, 4096, 0)
        except OSError as exc:
            raise NoSuchProcess(self.pid) from exc
        if data == self._stat_bytes and self._stat is not None:
            return self._stat
        if not data:
            raise NoSuchProcess(self.pid)
        stat = parse_stat(data.decode("utf-8", "replace"))
        self._stat_bytes, self._stat = data, stat
        return stat

    def io(self) -> tuple[int, int] | None:
        """(read_bytes, write_bytes), or None where the kernel does not show them."""
        if self._io_fd is None:
            return None
        try:
            data = os.pread(self._io_fd, 4096, 0)
        except OSError as exc:
            if exc.errno in _GONE:
                raise NoSuchProcess(self.pid) from exc
            return None
        return parse_io(data.decode()) if data else None

    def fd_count(self) -> int | None:
        return fd_count(self.pid, self.proc)

    def activity(self) -> bytes | None:
        """The main thread's scheduler counters (/proc/PID/schedstat: nanoseconds run,
        nanoseconds waited, times scheduled). Two equal readings mean the thread did
        not run in between: the kernel adds to them whenever it takes the thread off
        a CPU, and at every tick while it runs. None where the kernel keeps none
        (without CONFIG_SCHED_INFO it shows "0 0 0")."""
        if self._sched_fd is None:
            self._sched_fd = self._open_held("schedstat")
        if self._sched_fd < 0:
            return None
        try:
            data = os.pread(self._sched_fd, 128, 0)
        except OSError as exc:
            raise NoSuchProcess(self.pid) from exc
        return None if data.startswith(b"0 ") else data

    def counts(self, stat: Stat) -> tuple[int, ...] | None:
        """Its channels' counts (core/channels.py), in their order: those of
        /proc/PID/status (its main thread's, as psutil and process-exporter read
        them) and those of ``stat`` (its last stat()). None where the status file
        cannot be read."""
        status = self._status_counts() if _STATUS_KEYS else ()
        if status is None:
            return None
        counts = status + stat.counts if stat.counts else status
        return counts if _in_order is None else tuple(_in_order(counts))

    def _status_counts(self) -> tuple[int, ...] | None:
        if self._status_fd is None:
            self._status_fd = self._open_held("status")
        if self._status_fd < 0:
            return None
        try:
            data = os.pread(self._status_fd, 8192, 0)
        except OSError as exc:
            if exc.errno in _GONE:
                raise NoSuchProcess(self.pid) from exc
            return None
        counts = []
        for key in _STATUS_KEYS:
            at = data.rfind(key)  # the context switches' lines are the last
            if at < 0:
                return None
            at += len(key)
            end = data.find(b"\n", at)
            counts.append(int(data[at : end if end >= 0 else len(data)]))
        return tuple(counts)

    def _open_held(self, name: str) -> int:
        """/proc/PID/``name`` opened to be held; -1 where it cannot be."""
        try:
            return os.open(f"{self.proc}/{self.pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def close(self) -> None:
        for fd in (self._stat_fd, self._io_fd, self._sched_fd, self._status_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._io_fd = None
        self._sched_fd = None
        self._status_fd = None
        self._stat_fd = -1

    def refuses(self, uid: int) -> str | None:
        """Why a non-root ``uid`` may not watch this process, None when it may.

        The kernel's rule for reading another process's /proc files (ptrace access):
        its real, effective and saved uids are the caller's, and it is dumpable (a
        setuid program, or one that cleared the flag with prctl, is not; the kernel
        then shows its /proc/PID files as root's). Checked after this handle pinned the
        process: if the stat file still reads afterwards, the process is the one
        opened, so a pid reused in between cannot pass as the caller's."""
        try:
            with open(f"{self.proc}/{self.pid}/status", "rb") as f:
                line = next((x for x in f if x.startswith(b"Uid:")), b"")
            # A file's owner, not the directory's: the kernel keeps /proc/PID itself
            # the effective uid's (procps reads it there) whatever the dumpable flag.
            dump_owner = os.stat(f"{self.proc}/{self.pid}/stat").st_uid
            state = self.stat().state
        except (OSError, NoSuchProcess):
            return f"pid {self.pid} has exited"
        ids = line.split()[1:4]
        if len(ids) != 3:
            return f"pid {self.pid} shows no uids"
        real, effective, saved = (int(x) for x in ids)
        if (real, effective, saved) != (uid, uid, uid):
            runs_as = "" if real == effective == saved else f" (runs as {effective}: setuid)"
            return f"pid {self.pid} belongs to uid {real}{runs_as}, you are uid {uid}"
        # An exited process not yet reaped has no memory left, so no dumpable flag: the
        # kernel then shows its files as root's, and checks the uids alone (a short
        # command registered by `edgewatt run` is often one already).
        if dump_owner != uid and state not in ("Z", "X"):
            return (
                f"pid {self.pid} is not dumpable (a setuid program, or prctl): "
                "only root may watch it"
            )
        return None

    def __repr__(self) -> str:
        return f"ProcHandle(pid={self.pid}, start_ticks={self.start_ticks})"


def executable_name(pid: int, comm: str, proc: str = "/proc") -> str:
    """Base name of /proc/PID/exe (OTel semconv), else the kernel's 15-char comm."""
    try:
        target = os.readlink(f"{proc}/{pid}/exe".encode())
    except OSError:
        return comm
    # Bytes, decoded with replacement: a path need not be UTF-8, and a lone surrogate
    # (what str paths would give) could not be written to /metrics.
    name = os.path.basename(compat.removesuffix(target, b" (deleted)")).decode("utf-8", "replace")
    return name or comm


def fd_count(pid: int, proc: str = "/proc") -> int | None:
    """Open file descriptors, or None where the kernel does not show them."""
    path = f"{proc}/{pid}/fd"
    try:
        # Linux >= 6.2 reports the count as the directory's size: no listing needed.
        size = os.stat(path).st_size
        return size if size > 0 else len(os.listdir(path))
    except PermissionError:
        return None
    except OSError:
        return None


# Device files a process holds while it uses a GPU: Jetson's host1x channels and
# nvgpu nodes, its nvmap allocator, NVIDIA's dGPU nodes.
GPU_DEVICES = (b"/dev/nvhost-", b"/dev/nvgpu/", b"/dev/nvmap", b"/dev/nvidia")


def holds_gpu(pid: int, proc: str = "/proc") -> bool:
    """Whether any of the process's open files is a GPU device (False where the kernel
    does not show them, or the process is gone)."""
    directory = f"{proc}/{pid}/fd".encode()
    try:
        fds = os.listdir(directory)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(directory + b"/" + fd).startswith(GPU_DEVICES):
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def has_children_files(proc: str = "/proc") -> bool:
    """Whether the kernel lists children in /proc/PID/task/TID/children
    (CONFIG_PROC_CHILDREN, missing on some kernels)."""
    pid = os.getpid()
    return os.path.exists(f"{proc}/{pid}/task/{pid}/children")


def child_pids(pid: int, proc: str = "/proc") -> list[int]:
    """Direct children of every thread of a process (needs CONFIG_PROC_CHILDREN)."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children", "rb") as f:
                children.extend(int(c) for c in f.read().split())
        except OSError:
            continue  # the thread exited meanwhile
    return children


class ParentIndex:
    """Children of every process, from one listing of /proc, redone only when needed.

    /proc/PID/task/TID/children costs ~17 us per process and is missing where the
    kernel lacks CONFIG_PROC_CHILDREN; reading every /proc/PID/stat costs ~12 us per
    process on the host. Instead:

    - no listing at all while no process has been created since the last one: the
      last pid in /proc/loadavg has not moved (exits need none: a tree notices its own
      members leaving; re-parenting, which follows a parent's exit, is caught by the
      caller asking for a fresh listing after a tree lost a member);
    - otherwise one listing (~0.6 us an entry), reading the stat of a process only when
      it is new: each entry's inode number (d_ino, no extra syscall) changes when a pid
      is reused, and a process's ppid changes only when its parent dies, which the
      parent's vanished or changed entry shows (once reaped: until then a zombie parent
      still lists its re-parented children, which ProcessTree's own ppid check turns
      away).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        # pid -> (its entry's inode, ppid, the parent's inode when read; None if absent)
        self._known: dict[int, tuple[int, int, int | None]] = {}
        self._children: dict[int, list[int]] = {}
        self._last_pid: int | None = None
        self.listings = 0  # for tests and benchmarks: the paths that cost
        self.stat_reads = 0

    def children(self, *, fresh: bool = False) -> dict[int, list[int]]:
        """ppid -> child pids; ``fresh`` lists /proc even if no process was created."""
        last = last_pid(self.proc)
        if not fresh and last is not None and last == self._last_pid:
            return self._children
        self._last_pid = last
        self.listings += 1
        entries = {int(e.name): e.inode() for e in os.scandir(self.proc) if e.name.isdigit()}
        known = self._known
        current: dict[int, tuple[int, int, int | None]] = {}
        children: dict[int, list[int]] = {}
        for pid, inode in entries.items():
            seen = known.get(pid)
            if seen is None or seen[0] != inode or entries.get(seen[1]) != seen[2]:
                ppid = self._ppid(pid)
                if ppid is None:
                    continue  # exited since the listing
                seen = (inode, ppid, entries.get(ppid))
            current[pid] = seen
            children.setdefault(seen[1], []).append(pid)
        self._known = current
        self._children = children
        return children

    def _ppid(self, pid: int) -> int | None:
        self.stat_reads += 1
        return ppid(pid, self.proc)


def read_once(path: str, size: int = 4096) -> bytes | None:
    """One read of up to ``size`` bytes of a small /proc file, by os.open (a tenth of
    open()'s cost); None where it cannot be opened or read (the process gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def ppid(pid: int, proc: str = "/proc") -> int | None:
    """The parent of process ``pid`` (0: none); None where it has exited."""
    data = read_once(f"{proc}/{pid}/stat")
    if not data:
        return None
    return int(data[data.rindex(b")") + 2 :].split(maxsplit=2)[1])


MAX_ANCESTORS = 64  # deeper chains are cut: a process tree is rarely a dozen deep


def ancestors(pid: int, proc: str = "/proc") -> list[int]:
    """The parent of process ``pid``, its parent's, and so on up to the pid
    namespace's first process (at most MAX_ANCESTORS); empty where it has exited."""
    chain: list[int] = []
    parent = ppid(pid, proc)
    while parent and len(chain) < MAX_ANCESTORS and parent not in chain:
        chain.append(parent)
        parent = ppid(parent, proc)
    return chain


def last_pid(proc: str = "/proc") -> int | None:
    """The pid most recently handed out in this pid namespace (/proc/loadavg)."""
    try:
        with open(f"{proc}/loadavg", "rb") as f:
            return int(f.read().split()[4])
    except (OSError, IndexError, ValueError):
        return None


CAP_SYS_PTRACE = 19


def sees_other_users(proc: str = "/proc") -> bool:
    """Whether this process may read other users' /proc/PID/{io,fd}: root, or the
    CAP_SYS_PTRACE capability (the systemd unit grants it to an unprivileged user)."""
    if os.geteuid() == 0:
        return True
    try:
        with open(f"{proc}/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except OSError:
        pass
    return False


def groups(pid: int, proc: str = "/proc") -> frozenset[int]:
    """The process's supplementary and effective group ids (empty when gone)."""
    found: set[int] = set()
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Groups:"):
                    found.update(int(g) for g in line.split()[1:])
                elif line.startswith("Gid:"):
                    found.add(int(line.split()[2]))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(found)


CAP_SYS_ADMIN = 21


def may_join_namespaces(proc: str = "/proc") -> bool:
    """Whether this process may enter another network namespace (setns needs
    CAP_SYS_ADMIN): to count a container's traffic where it has its own."""
    try:
        with open(f"{proc}/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False


def boot_id(proc: str = "/proc") -> str:
    try:
        with open(f"{proc}/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_time(proc: str = "/proc") -> float:
    """Unix time of boot (btime in /proc/stat), to turn start ticks into timestamps."""
    with open(f"{proc}/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError(f"no btime in {proc}/stat")


def pid_max(proc: str = "/proc") -> int:
    try:
        with open(f"{proc}/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4194304  # the kernel's upper bound (PID_MAX_LIMIT on 64-bit)
