"""Control groups: where they are mounted, which one a process is in, and a cgroup's
own accounts. One function per fact, as in procfs.py.

A cgroup target is named by its path in the v2 hierarchy ("/libpod_parent/libpod-ID",
"/system.slice/x.service"). On a hybrid host (v1 controllers, v2 mounted beside them
at /sys/fs/cgroup/unified: JetPack 5, Ubuntu 20.04, this CI) the v2 tree has the CPU
figures but not the memory or storage controllers; those are read from the v1
hierarchy at the same path, where runtimes and systemd place every process alike.

The kernel's figures are cumulative over every process that was ever a member, so a
member that comes and goes between two passes is counted whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS, exit_code
from edgewatt.core.facts.cpu_rate import cpu_shares
from edgewatt.core.facts.held_fork import HeldFork
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.facts.procfs import NoSuchProcess, parse_stat
from edgewatt.core.kernel.taskstats import TaskExits, unix_start

log = logging.getLogger(__name__)


class CgroupGone(Exception):
    """The cgroup was removed (its service stopped, its container ended)."""


class InvalidCgroup(ValueError):
    pass


class NotTheirs(Exception):
    """A followed name now names a cgroup its registrant may not have; says why."""


class CgroupEnded(NoSuchProcess):
    """A cgroup target's end; ``reason`` says why, for its summary."""

    def __init__(self, reason: str) -> None:
        super().__init__(0, reason)
        self.reason = reason


@dataclass(frozen=True, **SLOTS)
class Mounts:
    """Where the hierarchies are: the v2 mount (None on a v1-only host) and each v1
    controller's mount."""

    v2: str | None
    v1: dict[str, str]


def mounts(path: str = "/proc/self/mounts") -> Mounts:
    v2, v1 = None, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4:
                continue
            if fields[2] == "cgroup2" and v2 is None:
                v2 = fields[1]
            elif fields[2] == "cgroup":
                for option in fields[3].split(","):
                    v1.setdefault(option, fields[1])
    return Mounts(v2, v1)


# systemd's escape of a byte in a unit or slice name ("system-flower\x2dsupernode.slice")
SYSTEMD_ESCAPE = re.compile(r"\\x[0-9a-f]{2}")


def normalize(path: object) -> str:
    """A cgroup path as the API takes it: absolute, no '.' or '..' parts, no quotes
    (it goes into nftables rules), no backslash but in systemd's escapes (\\xHH, as in
    a templated unit's slice), at most 4096 bytes."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidCgroup(f"a cgroup path starts with '/', got {path!r:.80}")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidCgroup(f"'.' and '..' are not allowed in a cgroup path: {path!r:.80}")
    if any(c in SYSTEMD_ESCAPE.sub("", path) for c in '"\\\n\r\0'):
        raise InvalidCgroup(
            "quotes, control characters and backslashes (but in systemd's \\xHH escapes) "
            f"are refused: {path!r:.80}"
        )
    if len(path.encode()) > 4096:
        raise InvalidCgroup("a cgroup path is at most 4096 bytes")
    return "/" + "/".join(parts)


def cgroup_of(pid: int, proc: str = "/proc") -> str:
    """The process's v2 cgroup ("0::" line of /proc/PID/cgroup); FileNotFoundError
    when the process is gone."""
    fd = os.open(f"{proc}/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)  # a tenth of open()'s
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    for line in b"".join(chunks).decode("utf-8", "surrogateescape").splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    raise InvalidCgroup(f"process {pid} has no cgroup v2 membership (a v1-only host)")


def parse_cpu_stat(text: str) -> tuple[float, float]:
    """(user, system) seconds from a v2 cpu.stat."""
    values = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    try:
        return int(values["user_usec"]) / 1e6, int(values["system_usec"]) / 1e6
    except (KeyError, ValueError):
        raise ValueError(f"no user_usec/system_usec in cpu.stat: {text[:80]!r}") from None


def parse_io_stat(text: str) -> tuple[int, int]:
    """(read, written) bytes summed over devices, from a v2 io.stat."""
    read = written = 0
    for line in text.splitlines():
        for item in line.split()[1:]:
            key, _, value = item.partition("=")
            if key == "rbytes":
                read += int(value)
            elif key == "wbytes":
                written += int(value)
    return read, written


def parse_blkio(text: str) -> tuple[int, int]:
    """(read, written) bytes from v1 blkio.throttle.io_service_bytes_recursive."""
    read = written = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "Read":
            read += int(fields[2])
        elif len(fields) == 3 and fields[1] == "Write":
            written += int(fields[2])
    return read, written


@dataclass(frozen=True, **SLOTS)
class Usage:
    """A cgroup's accounts at one instant, in seconds and bytes."""

    time: float  # unix seconds
    cpu_user_s: float
    cpu_system_s: float
    memory_bytes: int | None  # memory.current (v2) or memory.usage_in_bytes (v1)
    memory_peak_bytes: int | None  # the kernel's high-water mark, where it keeps one
    read_bytes: int | None
    write_bytes: int | None
    pids: tuple[int, ...]  # members, its sub-cgroups' included


class Cgroup:
    """One cgroup, read where each figure lives (v2 first, v1 at the same path)."""

    def __init__(self, path: str, where: Mounts) -> None:
        self.path = normalize(path)
        self._where = where
        if where.v2 is None:
            raise CgroupGone("this host has no cgroup v2 mount (cgroup targets need one)")
        self.v2_dir = where.v2 + self.path.rstrip("/")
        if not os.path.isdir(self.v2_dir):
            raise CgroupGone(f"no cgroup {self.path} (looked for {self.v2_dir})")
        # Its inode names this cgroup: one made again under the same path is another.
        self.inode = os.stat(self.v2_dir).st_ino

    @property
    def level(self) -> int:
        """Its depth in the v2 tree, as nftables' `socket cgroupv2 level` counts it."""
        return self.path.count("/") if self.path != "/" else 0

    def owner(self) -> int:
        return os.stat(self.v2_dir).st_uid

    def run_is_gone(self, proc: str = "/proc") -> bool:
        """Whether this is the cgroup of an `edgewatt run --cgroup` (named ``run-PID``
        by OwnCgroup) whose run has gone: killed before it could remove it."""
        name = self.path.rsplit("/", 1)[-1]
        return _RUN_NAME.fullmatch(name) is not None and not os.path.exists(f"{proc}/{name[4:]}")

    def remove(self) -> bool:
        """rmdir it; whether it went (the kernel refuses while it has members)."""
        try:
            os.rmdir(self.v2_dir)
        except OSError:
            return False
        return True

    def _v1(self, controller: str, name: str) -> str | None:
        root = self._where.v1.get(controller)
        if root is None:
            return None
        return _read(f"{root}{self.path.rstrip('/')}/{name}")

    def read(self) -> Usage:
        now = time.time()
        base = self.v2_dir
        try:
            made_again = os.stat(base).st_ino != self.inode
        except FileNotFoundError:
            made_again = False
        cpu_text = None if made_again else _read(f"{base}/cpu.stat")
        if cpu_text is None:
            again = " and made again" if made_again else ""
            raise CgroupGone(f"cgroup {self.path} was removed{again}")
        user, system = parse_cpu_stat(cpu_text)
        memory = _int(_read(f"{base}/memory.current"))
        peak = _int(_read(f"{base}/memory.peak"))
        if memory is None:  # hybrid host: the memory controller is v1's
            memory = _int(self._v1("memory", "memory.usage_in_bytes"))
            peak = _int(self._v1("memory", "memory.max_usage_in_bytes"))
        io_text = _read(f"{base}/io.stat")
        io = parse_io_stat(io_text) if io_text is not None else None
        if io is None:
            blkio = self._v1("blkio", "blkio.throttle.io_service_bytes_recursive")
            io = parse_blkio(blkio) if blkio is not None else None
        return Usage(
            time=now,
            cpu_user_s=user,
            cpu_system_s=system,
            memory_bytes=memory,
            memory_peak_bytes=peak,
            read_bytes=None if io is None else io[0],
            write_bytes=None if io is None else io[1],
            pids=members(base),
        )


def members(directory: str) -> tuple[int, ...]:
    """Pids in the cgroup and every cgroup below it."""
    pids: list[int] = []
    for dirpath, _dirs, _files in os.walk(directory):
        text = _read(f"{dirpath}/cgroup.procs")
        if text:
            pids.extend(int(p) for p in text.split())
    return tuple(pids)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class CgroupTree:
    """A cgroup target read once per pass, as the sampler reads a process tree
    (platforms.Tree). ``resolve`` names the cgroup anew when it is gone: a container
    restarted under a new cgroup goes on, its counters added to those before; it
    raises NotTheirs when the name now names a cgroup the registrant may not have, and
    the target ends. Without ``resolve`` (a plain cgroup path) the target ends with its
    cgroup. Each end is a CgroupEnded saying why. ``exits``: the kernel's exit records,
    for the exit status of a cgroup that began as one held fork (`edgewatt run`'s)."""

    lost_members = False  # membership is the kernel's: there is never a list to redo

    def __init__(
        self,
        cgroup: Cgroup,
        logical_cpus: int,
        resolve: Callable[[], Cgroup | None] | None = None,
        proc: str = "/proc",
        restart_grace_s: float = 0.0,
        lookup_every_s: float = 0.0,
        exits: TaskExits | None = None,
    ) -> None:
        self.cgroup = cgroup
        self._cpus = logical_cpus
        self._resolve = resolve
        self._proc = proc
        # How long a gone cgroup may stay unresolved before its target ends: a
        # restarting container or service has none for a moment.
        self._grace = restart_grace_s
        # A lookup runs a runtime's CLI or walks the whole tree: at most one this often.
        self._lookup_every = lookup_every_s
        self._next_lookup = 0.0
        self._gone_since: float | None = None
        self._base = (0.0, 0.0, 0, 0)  # what earlier incarnations counted
        self.last: TreeReading | None = None
        self.usage: Usage | None = None
        # Its one process at the first reading, watched for its exec (`edgewatt run
        # --cgroup` moves its held fork in before the exec): see held_fork.py.
        self._held: HeldFork | None = None
        self._exits = exits
        # Its root's exit code (-N: signal N), where it has one: its first process was
        # a held fork (`edgewatt run`'s command), and the kernel's exit record of it came.
        # A container or unit has no such root: None.
        self.exit_status: int | None = None
        self.root_peak_bytes: int | None = None  # that root's peak RSS, from the same record

    @property
    def root_execs(self) -> int:
        return 0 if self._held is None else self._held.execs

    def sample(self, children_of: Callable[[int], list[int]]) -> TreeReading:
        del children_of  # members come from the cgroup, not from parent links
        self._root_exit()  # first: the pass that finds the cgroup gone raises
        try:
            usage = self.cgroup.read()
        except CgroupGone:
            usage = self._next_incarnation()
            if usage is None:  # restarting: nothing runs, nothing more is counted
                assert self.last is not None
                return dataclasses.replace(
                    self.last, cpu_utilization=None, cpu_mode_utilization=None, pids=()
                )
        user_base, system_base, read_base, write_base = self._base
        user, system = user_base + usage.cpu_user_s, system_base + usage.cpu_system_s
        rss = vms = threads = 0
        for pid in usage.pids:
            try:
                with open(f"{self._proc}/{pid}/stat", encoding="utf-8") as f:
                    stat = parse_stat(f.read())
            except (OSError, ValueError):
                continue  # gone since cgroup.procs was read
            rss += stat.rss_pages * _PAGE_SIZE
            vms += stat.vsize
            threads += stat.num_threads
        if self.last is None and len(usage.pids) == 1:
            self._held = HeldFork(usage.pids[0], self._proc)
        if self._held is not None:
            self._held.note()
        by_mode = None
        if self.last is not None and usage.time > self.last.time:
            used = (user - self.last.cpu_user_s, system - self.last.cpu_system_s)
            by_mode = cpu_shares(used, usage.time - self.last.time, self._cpus)
        reading = TreeReading(
            time=usage.time,
            cpu_user_s=user,
            cpu_system_s=system,
            cpu_utilization=None if by_mode is None else by_mode[0] + by_mode[1],
            cpu_mode_utilization=by_mode,
            rss_bytes=rss,
            vms_bytes=vms,
            read_bytes=None if usage.read_bytes is None else read_base + usage.read_bytes,
            write_bytes=None if usage.write_bytes is None else write_base + usage.write_bytes,
            threads=threads,
            open_fds=None,
            pids=usage.pids,
            root_execs=self.root_execs,
        )
        self.last, self.usage = reading, usage
        return reading

    def _root_exit(self) -> None:
        """Take the root's exit status from its exit record once one came (kept from
        then on: the record is dropped a while after, and the cgroup may outlive its
        root by hours, orphans running on)."""
        held = self._held
        if self._exits is None or held is None or held.held_start is None:
            return
        if self.exit_status is not None:
            return
        record = self._exits.exited(held.pid, unix_start(held.held_start))
        if record is not None and record.exit_status is not None:
            self.exit_status = exit_code(record.exit_status)
            self.root_peak_bytes = record.hiwater_rss_bytes

    def _next_incarnation(self) -> Usage | None:
        """The cgroup went: its next one (a restarted container), None while it may
        still come within the grace, or the end (CgroupEnded)."""
        if self._resolve is None:
            raise CgroupEnded(f"its cgroup {self.cgroup.path} was removed")
        now = time.monotonic()
        self._gone_since = self._gone_since or now
        if now >= self._next_lookup:
            self._next_lookup = now + self._lookup_every
            try:
                fresh = self._resolve()
            except NotTheirs as refused:
                raise CgroupEnded(
                    f"its cgroup {self.cgroup.path} was removed, and its name now names "
                    f"a cgroup that is not the registrant's: {refused}"
                ) from None
            usage = self._adopt(fresh) if fresh is not None else None
            if usage is not None:
                return usage
        if self.last is not None and now - self._gone_since < self._grace:
            return None
        raise CgroupEnded(
            f"its cgroup {self.cgroup.path} was removed and none came back within {self._grace:g} s"
        )

    def _adopt(self, fresh: Cgroup) -> Usage | None:
        """``fresh``'s first reading, its counts added to those before; None when it is
        the same cgroup, or already gone again (removed and made again while followed:
        the next lookup tries again)."""
        if fresh.inode == self.cgroup.inode:
            return None
        try:
            usage = fresh.read()
        except CgroupGone:
            return None
        self._gone_since = None
        last = self.last
        if last is not None:
            self._base = (
                last.cpu_user_s,
                last.cpu_system_s,
                last.read_bytes or 0,
                last.write_bytes or 0,
            )
        log.info("cgroup %s is gone; followed to %s (restarted)", self.cgroup.path, fresh.path)
        self.cgroup = fresh
        return usage

    def exit_figures(self) -> None:
        return None  # a removed cgroup's counters go with it: the last pass is the end

    def close(self) -> None:
        pass


_RUN_NAME = re.compile(r"run-[1-9][0-9]*")  # OwnCgroup's
RUN_PARENT = "/edgewatt"  # root's cgroups for `edgewatt run`, one per run


class OwnCgroup:
    """A cgroup made for one command (`edgewatt run`): under /edgewatt for root (in the
    run's cgroup for a run inside another), else under the caller's own cgroup where
    it was delegated to them (systemd-run --user --scope). PermissionError says why it
    cannot be made."""

    def __init__(self, where: Mounts, proc: str = "/proc") -> None:
        if where.v2 is None:
            raise PermissionError("this host has no cgroup v2 mount")
        uid = os.geteuid()
        if uid == 0:
            parent = _run_of(proc) or RUN_PARENT
        else:
            parent = cgroup_of(os.getpid(), proc)
            owner = os.stat(where.v2 + parent.rstrip("/")).st_uid
            if owner != uid:
                raise PermissionError(
                    f"your cgroup {parent} is not delegated to you (owned by uid {owner})"
                )
        parent_dir = where.v2 + parent.rstrip("/")
        os.makedirs(parent_dir, exist_ok=True)
        _remove_stale(parent_dir, proc)
        name = f"run-{os.getpid()}"
        self.path = normalize(f"{parent}/{name}")
        self.directory = f"{parent_dir}/{name}"
        os.mkdir(self.directory)

    def add(self, pid: int) -> None:
        with open(f"{self.directory}/cgroup.procs", "w", encoding="ascii") as f:
            f.write(str(pid))

    def remove(self) -> str | None:
        """Remove it once empty; why not, or None."""
        try:
            os.rmdir(self.directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            left = len(members(self.directory))
            return f"cgroup {self.path} left in place ({left} processes still in it): {exc}"
        return None


def _run_of(proc: str) -> str | None:
    """This process's cgroup where it is an `edgewatt run`'s (root's ``/edgewatt/run-PID``,
    or one inside it): a run inside a run makes its cgroup there, so the outer run's
    target keeps counting what the inner one's command does."""
    try:
        own = cgroup_of(os.getpid(), proc)
    except (OSError, InvalidCgroup):
        return None
    parts = own.split("/")
    inside = own.startswith(RUN_PARENT + "/") and _RUN_NAME.fullmatch(parts[2]) is not None
    return own if inside else None


def _remove_stale(parent_dir: str, proc: str) -> None:
    """Empty run cgroups of runs that are gone (killed before they could remove them):
    rmdir refuses a cgroup that still has members, so only empty ones go."""
    for entry in os.listdir(parent_dir):
        if not _RUN_NAME.fullmatch(entry):
            continue
        if os.path.exists(f"{proc}/{entry[4:]}"):
            continue  # that run is still alive
        with contextlib.suppress(OSError):
            os.rmdir(f"{parent_dir}/{entry}")
