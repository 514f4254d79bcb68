"""Fork and exit events from the kernel's process-events connector (NETLINK_CONNECTOR).

A datagram socket bound to the group ``CN_IDX_PROC`` that sent ``PROC_CN_MCAST_LISTEN``
receives one message per fork, exec and exit on the whole host, in the order they
happened: a double fork between two sampling passes is heard whole, which no reading of
/proc can promise. Listening needs CAP_NET_ADMIN (as taskstats does). Events are drained
without blocking at each pass, from a socket buffer sized for bursts; an overflow
(ENOBUFS) is counted, and membership falls back to parent links until the next pass.

Layout (include/uapi/linux/connector.h, cn_proc.h): ``struct cn_msg`` (20 bytes) then
``struct proc_event``: what (u32), cpu (u32), timestamp_ns (u64), then the event's
fields. A thread's creation is a fork event whose child pid is not its tgid: skipped.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.kernel.netlink import NLMSGHDR, drain, messages

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXIT = 0x80000000
RECEIVE_BUFFER = 8 << 20  # ~100,000 events: seconds of a fork storm

_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_HEADER = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_FORK = struct.Struct("=iiii")  # parent pid, parent tgid, child pid, child tgid
_EXIT = struct.Struct("=iiII")  # pid, tgid, exit code, exit signal
_EXIT_PARENT = struct.Struct("=ii")  # parent pid, parent tgid (Linux 4.18 on)


@dataclass(frozen=True, **SLOTS)
class ProcEvent:
    """A process forked (``pid`` the child, ``parent`` its parent) or exited (``parent``
    then the parent at the exit, who will reap it; 0 where unknown)."""

    kind: str  # "fork" or "exit"
    pid: int  # the process (thread group id)
    parent: int


def parse(data: bytes) -> list[ProcEvent]:
    """Every fork and exit of a process in one datagram, in order; other events (exec,
    threads, other connector messages) are skipped."""
    events = []
    for _, start, end in messages(data):
        end = min(end, len(data))  # a message cut short is read no further
        at = start + _CN_MSG.size
        if at + _HEADER.size > end:
            continue
        idx, val, _, _, length, _ = _CN_MSG.unpack_from(data, start)
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC):
            continue
        what, _, _ = _HEADER.unpack_from(data, at)
        body, limit = at + _HEADER.size, min(end, at + length)
        if what == PROC_EVENT_FORK and body + _FORK.size <= limit:
            _, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(data, body)
            if child_pid == child_tgid:  # a process, not a thread
                events.append(ProcEvent("fork", child_tgid, parent_tgid))
        elif what == PROC_EVENT_EXIT and body + _EXIT.size <= limit:
            pid, tgid, _, _ = _EXIT.unpack_from(data, body)
            if pid != tgid:
                continue  # a thread; its process goes on
            parent = 0
            if body + _EXIT.size + _EXIT_PARENT.size <= limit:
                _, parent = _EXIT_PARENT.unpack_from(data, body + _EXIT.size)
            events.append(ProcEvent("exit", tgid, parent))
    return events


def listen_message(seq: int = 1) -> bytes:
    """The request that starts the multicast: nlmsghdr, cn_msg, the operation."""
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
    body = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, seq, 0, len(op), 0) + op
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), NLMSG_DONE, 0, seq, 0) + body


class ProcEvents:
    """The listening socket; :meth:`drain` returns what came since, in order."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            try:  # root may exceed rmem_max; others get what the sysctl allows
                self._sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            self._sock.bind((0, CN_IDX_PROC))  # EPERM without CAP_NET_ADMIN
            self._sock.send(listen_message())
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self.overflows = 0

    def drain(self, decode: bool = True) -> tuple[list[ProcEvent], bool]:
        """(events waiting, whether the buffer overflowed since the last drain); with
        ``decode`` false the socket is only read dry."""
        datagrams, overflowed = drain(self._sock)
        if overflowed:
            self.overflows += 1
        if not decode:
            return [], overflowed
        return [e for d in datagrams for e in parse(d)], overflowed

    def close(self) -> None:
        self._sock.close()
