"""Per-task exit records from the kernel's taskstats interface (generic netlink).

A socket that registers a CPU mask receives one record per task (thread) that exits
on those CPUs: its whole-life CPU time (the scheduler's runtime, as /proc and
getrusage count it up to that point; the address space is torn down after the
record, so a parent's wait4 sees a few ms more), storage bytes read and written, the
process's peak RSS, pid, thread group id, parent and start time. This is what a
target did between the last sampling pass and its exit, which /proc can no longer
show. Registering needs CAP_NET_ADMIN.

A process's own figures are the sum of its threads' records, so they are complete only
when every one of its threads' records arrived: when the process started after the
listener did (see :meth:`TaskExits.complete`). Records are drained without blocking at
each pass, from a socket buffer sized for bursts; an overflow (ENOBUFS) is counted and
makes every figure of that window incomplete, never silently wrong.

Layout: ``struct taskstats`` (include/uapi/linux/taskstats.h) only ever grows at its
end; the offsets below hold from version 13 (``ac_tgid``), checked against the header
by a test.
"""

from __future__ import annotations

import operator
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from edgewatt.core.channels import CHANNELS, NO_COUNTS
from edgewatt.core.compat import SLOTS
from edgewatt.core.kernel.netlink import NLATTR, NLMSGHDR, align, attributes, drain, messages

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK = 3
TASKSTATS_TYPE_PID = 1
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_PID = 4
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
SOL_NETLINK = 270
MIN_VERSION = 13  # ac_tgid

_GENLHDR = struct.Struct("=BBH")
_U32 = struct.Struct("=I")
# Offsets in struct taskstats (bytes): see the module docstring.
_VERSION = struct.Struct("=H")
_EXIT_CODE = struct.Struct("=I")  # ac_exitcode (a wait status) at 4
_PID_PPID = struct.Struct("=II")  # ac_pid, ac_ppid at 128
_ELAPSED = struct.Struct("=Q")  # ac_etime (us since the task started) at 144
_RUNTIME = struct.Struct("=Q")  # cpu_run_virtual_total (ns) at 72
_CPU = struct.Struct("=QQ")  # ac_utime, ac_stime (us) at 152
_HIWATER = struct.Struct("=Q")  # hiwater_rss (KiB) at 200
_IO = struct.Struct("=QQ")  # read_bytes, write_bytes at 248
_U64 = struct.Struct("=Q")
_COUNTS_AT = tuple(c.taskstats_offset for c in CHANNELS)  # each channel's member, a u64
_BTIME64 = struct.Struct("=Q")  # ac_btime64 (unix s) at 344
_TGID = struct.Struct("=I")  # ac_tgid at 368
_NEEDED = 372
TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # /proc's start times are in these
RECEIVE_BUFFER = 8 << 20  # ~27,000 records: several seconds of 1,000 exits/s


@dataclass(frozen=True, **SLOTS)
class TaskExit:
    """One exited thread, as the kernel counted it over its whole life."""

    pid: int  # the thread's id
    tgid: int  # its process
    ppid: int
    start_time: float  # unix seconds, 1 s resolution
    elapsed_us: int  # from the task's start to its exit
    user_us: int
    system_us: int
    read_bytes: int
    write_bytes: int
    hiwater_rss_bytes: int
    exit_status: int = 0  # the thread's, as wait() gives it (exit code << 8, or signal)
    counts: tuple[int, ...] = NO_COUNTS  # its channels' (core/channels.py)


def _attr(kind: int, payload: bytes) -> bytes:
    return NLATTR.pack(NLATTR.size + len(payload), kind) + payload.ljust(align(len(payload)), b"\0")


def _message(family: int, command: int, attrs: bytes, seq: int) -> bytes:
    body = _GENLHDR.pack(command, 1, 0) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), family, NLM_F_REQUEST, seq, 0) + body


def _attrs(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attribute type (flag bits masked) -> (payload start, payload end)."""
    return {kind & 0x3FFF: (a, b) for kind, a, b in attributes(data, start, end)}


# The usual datagram: one message whose AGGR_PID attribute holds the PID attribute,
# then the STATS one: struct taskstats at a fixed offset. Checked, else parsed fully.
_FAST = struct.Struct("=2xH2xH6xH")  # the three attribute types at 20, 24 and 32
_FAST_STATS = 36


def parse(data: bytes) -> list[TaskExit]:
    """The exit records in one netlink datagram (per-thread AGGR_PID records; the
    TGID aggregate carries only delay accounting and is skipped)."""
    if len(data) >= _FAST_STATS + _NEEDED and _FAST.unpack_from(data, 20) == (
        TASKSTATS_TYPE_AGGR_PID,
        TASKSTATS_TYPE_PID,
        TASKSTATS_TYPE_STATS,
    ):
        (length,) = _U32.unpack_from(data, 0)
        if length == len(data) and _VERSION.unpack_from(data, _FAST_STATS)[0] >= MIN_VERSION:
            return [_record(data, _FAST_STATS)]
    records = []
    for kind, body, end in messages(data):
        if kind == NLMSG_ERROR:
            continue
        aggregate = _attrs(data, body + _GENLHDR.size, end).get(TASKSTATS_TYPE_AGGR_PID)
        if aggregate is not None:
            stats = _attrs(data, *aggregate).get(TASKSTATS_TYPE_STATS)
            if stats is not None and stats[1] - stats[0] >= _NEEDED:
                (version,) = _VERSION.unpack_from(data, stats[0])
                if version >= MIN_VERSION:
                    records.append(_record(data, stats[0]))
    return records


def _record(data: bytes, at: int) -> TaskExit:
    pid, ppid = _PID_PPID.unpack_from(data, at + 128)
    # ac_utime/ac_stime are tick samples; /proc/PID/stat and getrusage scale them to
    # the scheduler's exact runtime (cputime_adjust). Do the same: the total is
    # cpu_run_virtual_total (sum_exec_runtime, ns), split in the ticks' proportion.
    ticks_user, ticks_system = _CPU.unpack_from(data, at + 152)
    (runtime_ns,) = _RUNTIME.unpack_from(data, at + 72)
    total_us = runtime_ns // 1000
    ticks = ticks_user + ticks_system
    user = total_us * ticks_user // ticks if ticks else total_us
    system = total_us - user
    (hiwater_kib,) = _HIWATER.unpack_from(data, at + 200)
    read, write = _IO.unpack_from(data, at + 248)
    (btime,) = _BTIME64.unpack_from(data, at + 344)
    (tgid,) = _TGID.unpack_from(data, at + 368)
    (elapsed,) = _ELAPSED.unpack_from(data, at + 144)
    (status,) = _EXIT_CODE.unpack_from(data, at + 4)
    counts = tuple([_U64.unpack_from(data, at + offset)[0] for offset in _COUNTS_AT])
    return TaskExit(
        pid, tgid, ppid, float(btime), elapsed, user, system, read, write, hiwater_kib * 1024,
        status, counts,
    )  # fmt: skip


def unix_start(start_ticks: int) -> float:
    """Unix time of a process's start (its /proc start ticks), to 10 ms, through the
    boot clock (not /proc/stat's whole-second btime)."""
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + start_ticks * TICK_S


class TaskstatsSocket:
    """The listening socket: registered for every CPU, drained without blocking."""

    def __init__(self, cpus: int | None = None) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        try:
            self._sock.bind((0, 0))
            family = self._family_id()
            try:  # root may exceed rmem_max; others get what the sysctl allows
                self._sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            mask = f"0-{(cpus or os.cpu_count() or 1) - 1}".encode() + b"\0"
            self.registered_at = time.time()  # every exit from here on is heard
            self._exchange(
                _message(
                    family, TASKSTATS_CMD_GET, _attr(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, mask), 2
                )
            )
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def _exchange(self, message: bytes) -> None:
        """Send with an acknowledgement asked for, and wait for it (exit records may
        come first: they are dropped, the listener is not started yet); OSError with
        the kernel's errno."""
        (seq,) = struct.unpack_from("=I", message, 8)
        flags = NLM_F_REQUEST | NLM_F_ACK
        self._sock.send(message[:6] + struct.pack("=H", flags) + message[8:])
        self._sock.settimeout(5.0)
        while True:
            reply = self._sock.recv(1 << 16)
            _, kind, _, reply_seq, _ = NLMSGHDR.unpack_from(reply, 0)
            if kind == NLMSG_ERROR and reply_seq == seq:
                (code,) = struct.unpack_from("=i", reply, NLMSGHDR.size)
                if code:
                    raise OSError(-code, os.strerror(-code))
                return

    def _family_id(self) -> int:
        name = _attr(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
        self._sock.settimeout(5.0)
        self._sock.send(_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, name, 1))
        reply = self._sock.recv(1 << 16)
        length, kind, _, _, _ = NLMSGHDR.unpack_from(reply, 0)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", reply, NLMSGHDR.size)
            raise OSError(-code, os.strerror(-code))
        attrs = _attrs(reply, NLMSGHDR.size + _GENLHDR.size, length)
        start, _ = attrs[CTRL_ATTR_FAMILY_ID]
        return struct.unpack_from("=H", reply, start)[0]

    def drain(self) -> tuple[list[TaskExit], bool]:
        """(records waiting, whether the buffer overflowed since the last drain)."""
        datagrams, overflowed = drain(self._sock)
        return [r for d in datagrams for r in parse(d)], overflowed

    def close(self) -> None:
        self._sock.close()


@dataclass(**SLOTS)
class ExitedProcess:
    """A process's exited threads, summed; complete once its leader has exited."""

    ppid: int
    start_time: float
    user_s: float = 0.0
    system_s: float = 0.0
    read_bytes: int = 0
    write_bytes: int = 0
    hiwater_rss_bytes: int = 0
    counts: tuple[int, ...] = NO_COUNTS  # its channels' (core/channels.py), every thread's
    elapsed_s: float = 0.0  # the leader's life: start to exit
    leader_exited: bool = False
    exit_status: int | None = None  # the leader's wait status, once it exited
    arrived: float = field(default_factory=time.monotonic)


# Entries of processes still running (threads that exited) are kept this long: the
# process's own figures need them at its exit.
RUNNING_KEEP_S = 86_400.0


class TaskExits:
    """Exit records by process. A process whose leader exited is kept ``keep_s``
    after its last record (its target's exit is found within a pass or two)."""

    def __init__(self, source: TaskstatsSocket, *, keep_s: float) -> None:
        self.source = source
        self.keep_s = keep_s
        self.started = source.registered_at
        self.overflows = 0  # updates that found the buffer had overflowed
        self._incomplete_until = 0.0  # monotonic: records before this may be missing
        self._processes: dict[int, ExitedProcess] = {}

    def update(self) -> None:
        """Take what arrived; forget what is old."""
        records, overflowed = self.source.drain()
        now = time.monotonic()
        if overflowed:
            self.overflows += 1
            self._incomplete_until = now + RUNNING_KEEP_S
        for r in records:
            p = self._processes.get(r.tgid)
            # A new process; or its tgid reused, which a second leader shows (threads
            # of a process may exit after its leader: they still count to it).
            if p is None or (p.leader_exited and r.pid == r.tgid):
                p = self._processes[r.tgid] = ExitedProcess(r.ppid, r.start_time)
            p.user_s += r.user_us / 1e6
            p.system_s += r.system_us / 1e6
            p.read_bytes += r.read_bytes
            p.write_bytes += r.write_bytes
            p.counts = tuple(map(operator.add, p.counts, r.counts))
            p.hiwater_rss_bytes = max(p.hiwater_rss_bytes, r.hiwater_rss_bytes)
            if r.pid == r.tgid:
                p.leader_exited = True
                p.ppid, p.start_time = r.ppid, r.start_time
                p.elapsed_s = r.elapsed_us / 1e6
                p.exit_status = r.exit_status
            p.arrived = now
        for tgid in [
            tgid
            for tgid, p in self._processes.items()
            if now - p.arrived > (self.keep_s if p.leader_exited else RUNNING_KEEP_S)
        ]:
            del self._processes[tgid]

    def complete(self, start_time: float) -> bool:
        """Whether every thread record of a process started at ``start_time`` (unix s,
        floored: to /proc's 10 ms ticks, or to the second of a record's btime) arrived:
        it started after the listener (one tick's allowance for the flooring), and no
        overflow may have dropped any."""
        started_after = start_time + TICK_S >= self.started
        return started_after and time.monotonic() >= self._incomplete_until

    def exited(self, pid: int, start_time: float) -> ExitedProcess | None:
        """The exited process ``pid`` started at ``start_time`` (to 1 s), or None."""
        p = self._processes.get(pid)
        if p is None or not p.leader_exited or abs(p.start_time - start_time) > 1.5:
            return None
        return p

    def exited_pid(self, pid: int) -> ExitedProcess | None:
        """The last process ``pid`` whose leader exited (the caller checks its start)."""
        p = self._processes.get(pid)
        return p if p is not None and p.leader_exited else None

    def close(self) -> None:
        self.source.close()
