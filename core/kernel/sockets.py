"""TCP byte counts per socket from the kernel's sock_diag netlink interface.

A small struct-based client rather than pyroute2: edgewatt needs two kinds of request
and two fields of one attribute, and the hot path must stay cheap. A full dump of a
host with 10,000 connections is parsed by reading the 4-byte inode of each entry at a
fixed offset and skipping the entry unless it belongs to a target; known sockets are
then looked up one by one ("exact" requests carrying the socket's 4-tuple and kernel
cookie, so a reused 4-tuple can never be mistaken for the old socket). pyroute2
decodes every attribute of every socket into Python objects, which is what this
module must not pay for on every interval; it would also be one more dependency.

Layouts (include/uapi/linux/inet_diag.h, tcp.h): an ``inet_diag_msg`` is 72 bytes with
the socket id (48 bytes) at offset 4, ``idiag_uid`` at 64 and ``idiag_inode`` at 68;
the ``INET_DIAG_INFO`` attribute holds ``struct tcp_info``, whose ``tcpi_bytes_acked``
and ``tcpi_bytes_received`` are the u64 at offsets 120 and 128 (Linux >= 4.1 and 4.2).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.kernel.netlink import NLMSGHDR, attributes, drain, messages

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_INFO = 2
TCP_TIME_WAIT = 6
TCP_LISTEN = 10
# Every state but LISTEN (no bytes) and TIME_WAIT (no tcp_info, no inode).
STATES = 0xFFF & ~(1 << TCP_LISTEN) & ~(1 << TCP_TIME_WAIT)

_REQ = struct.Struct("=BBBxI")
# struct unix_diag_req: family, protocol, pad, states, inode, show, cookie[2]
_UNIX_REQ = struct.Struct("=BBxxIIIII")
_U32 = struct.Struct("=I")
_U64X2 = struct.Struct("=QQ")
_MSG_LEN = 72
_ID_OFFSET = 4
_ID_LEN = 48
_UID_OFFSET = 64
_INODE_OFFSET = 68
_BYTES_ACKED_OFFSET = 120
_NEEDED_INFO = 136


@dataclass(frozen=True, **SLOTS)
class TcpSocket:
    inode: int
    family: int
    sockid: bytes  # the raw inet_diag_sockid: 4-tuple, interface, cookie
    bytes_acked: int  # sent and acknowledged by the peer
    bytes_received: int


def _request(family: int, flags: int, sockid: bytes = bytes(_ID_LEN), seq: int = 1) -> bytes:
    body = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), STATES) + sockid
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, flags, seq, 0) + body


def parse(data: bytes, wanted: set[int] | None) -> tuple[list[TcpSocket], bool, int]:
    """(sockets, done, error) from one netlink datagram; entries whose inode is not in
    ``wanted`` are skipped without decoding (None: keep all)."""
    found: list[TcpSocket] = []
    for kind, body, end in messages(data):
        if kind == NLMSG_DONE:
            return found, True, 0
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, body)
            return found, True, -code
        if kind == SOCK_DIAG_BY_FAMILY and end - body >= _MSG_LEN:
            (inode,) = _U32.unpack_from(data, body + _INODE_OFFSET)
            if wanted is None or inode in wanted:
                counts = _tcp_bytes(data, body + _MSG_LEN, end)
                if counts is not None:
                    found.append(
                        TcpSocket(
                            inode=inode,
                            family=data[body],
                            sockid=bytes(data[body + _ID_OFFSET : body + _ID_OFFSET + _ID_LEN]),
                            bytes_acked=counts[0],
                            bytes_received=counts[1],
                        )
                    )
    return found, False, 0


def _tcp_bytes(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    for kind, payload, payload_end in attributes(data, start, end):
        if kind == INET_DIAG_INFO and payload_end - payload >= _NEEDED_INFO:
            acked, received = _U64X2.unpack_from(data, payload + _BYTES_ACKED_OFFSET)
            return acked, received
    return None


class SockDiag:
    """One netlink socket to the kernel's sock_diag, reused for every request."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        self._sock.bind((0, 0))
        self._seq = 0

    def _exchange(
        self, message: bytes, wanted: set[int] | None, *, dump: bool
    ) -> tuple[list[TcpSocket], int]:
        self._sock.send(message)
        found: list[TcpSocket] = []
        while True:
            data = self._sock.recv(1 << 16)
            sockets, done, error = parse(data, wanted)
            found.extend(sockets)
            # An exact request gets one message back: the socket, or an error.
            if done or not data or not dump:
                return found, error

    def dump(self, wanted: set[int] | None = None) -> list[TcpSocket]:
        """Every TCP socket of the host (IPv4 and IPv6) whose inode is wanted."""
        found: list[TcpSocket] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            self._seq += 1
            sockets, _ = self._exchange(
                _request(family, NLM_F_REQUEST | NLM_F_DUMP, seq=self._seq), wanted, dump=True
            )
            found.extend(sockets)
        return found

    def is_unix(self, inode: int) -> bool:
        """Whether ``inode`` is a Unix socket: one exact unix_diag request, far cheaper
        than a TCP dump of the host. A client talking to the daemon over its socket
        holds a new one at every request, which would otherwise cost a dump each pass."""
        self._seq += 1
        body = _UNIX_REQ.pack(socket.AF_UNIX, 0, 0xFFFFFFFF, inode, 0, 0xFFFFFFFF, 0xFFFFFFFF)
        header = NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST,
                                self._seq, 0)  # fmt: skip
        self._sock.send(header + body)
        data = self._sock.recv(1 << 16)
        return any(kind == SOCK_DIAG_BY_FAMILY for kind, _, _ in messages(data))

    def lookup(self, known: TcpSocket) -> TcpSocket | None:
        """The socket again, by its 4-tuple and cookie; None once it is closed."""
        self._seq += 1
        sockets, error = self._exchange(
            _request(known.family, NLM_F_REQUEST, known.sockid, seq=self._seq), None, dump=False
        )
        if error and error not in (errno.ENOENT, errno.ESTALE):
            raise OSError(error, os.strerror(error))
        return next((s for s in sockets if s.inode == known.inode), None)

    def other_end(self, sock: TcpSocket) -> TcpSocket | None:
        """The other end of a connection on this host (``on_this_host``), by the
        reversed 4-tuple; None once it is closed. Its inode is 0 while it waits in a
        listener's accept queue: no process holds it yet."""
        local, remote = endpoints(sock.sockid)
        family = socket.AF_INET if len(local) == 6 else socket.AF_INET6
        width = 4 if family == socket.AF_INET else 16
        sockid = (
            remote[-2:] + local[-2:]  # its source port is this one's destination
            + remote[:-2].ljust(16, b"\0") + local[:-2].ljust(16, b"\0")
            + bytes(4) + b"\xff" * 8  # any interface; no cookie: INET_DIAG_NOCOOKIE
        )  # fmt: skip
        assert len(remote) == len(local) == width + 2
        self._seq += 1
        sockets, error = self._exchange(
            _request(family, NLM_F_REQUEST, sockid, seq=self._seq), None, dump=False
        )
        if error and error not in (errno.ENOENT, errno.ESTALE):
            raise OSError(error, os.strerror(error))
        return sockets[0] if sockets else None

    def peer_uid(self, local: tuple[Any, ...], remote: tuple[Any, ...]) -> int | None:
        """The uid of the socket at the other end of a TCP connection this host accepted
        (``local`` and ``remote``: its (address, port), as getsockname and accept give
        them), by the reversed 4-tuple; None where that end is not on this host (not
        in this network namespace) or is gone."""
        family, source = _packed(remote[0])
        local_family, destination = _packed(local[0])
        if family != local_family:
            return None
        sockid = (
            struct.pack("!HH", remote[1], local[1])
            + source.ljust(16, b"\0") + destination.ljust(16, b"\0")
            + bytes(4) + b"\xff" * 8  # any interface; no cookie: INET_DIAG_NOCOOKIE
        )  # fmt: skip
        self._seq += 1
        self._sock.send(_request(family, NLM_F_REQUEST, sockid, seq=self._seq))
        data = self._sock.recv(1 << 16)
        for kind, body, end in messages(data):
            if kind == SOCK_DIAG_BY_FAMILY and end - body >= _MSG_LEN:
                return int(_U32.unpack_from(data, body + _UID_OFFSET)[0])
        return None

    def close(self) -> None:
        self._sock.close()


def _packed(address: str) -> tuple[int, bytes]:
    """(family, packed address) of a numeric address; a v4-mapped IPv6 one as IPv4, as
    the kernel files the other end of such a connection when that end is IPv4."""
    if ":" not in address:
        return socket.AF_INET, socket.inet_pton(socket.AF_INET, address)
    packed = socket.inet_pton(socket.AF_INET6, address.split("%", 1)[0])
    if packed[:12] == _V4_MAPPED:
        return socket.AF_INET, packed[12:]
    return socket.AF_INET6, packed


SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NETLINK_DROP_MEMBERSHIP = 2
# sock_diag multicast groups: every TCP socket the host destroys, IPv4 and IPv6.
SKNLGRP_INET_TCP_DESTROY = 1
SKNLGRP_INET6_TCP_DESTROY = 3
_COOKIE = slice(_ID_LEN - 8, _ID_LEN)  # idiag_cookie: the last 8 bytes of the socket id
DESTROY_BUFFER = 8 << 20  # ~28,000 notifications: seconds of 2,000 closes/s


def cookie(sock: TcpSocket) -> bytes:
    """The kernel's cookie of a socket: unique while the host runs, never reused."""
    return sock.sockid[_COOKIE]


_V4_MAPPED = bytes(10) + b"\xff\xff"


def endpoints(sockid: bytes) -> tuple[bytes, bytes]:
    """(local, remote) of a socket id: address and port each, an IPv4 address whether
    the socket is IPv4 or IPv6 with a v4-mapped address (the two ends of one loopback
    connection can be of either family)."""

    def end(address: bytes, port: bytes) -> bytes:
        if address[4:] == bytes(12):  # AF_INET: 4 bytes, zero-padded
            return address[:4] + port
        if address[:12] == _V4_MAPPED:
            return address[12:] + port
        return address + port

    # struct inet_diag_sockid: sport, dport (big endian), src[16], dst[16], if, cookie
    return end(sockid[4:20], sockid[0:2]), end(sockid[20:36], sockid[2:4])


_LOOPBACK_V6 = bytes(15) + b"\x01"


def on_this_host(sockid: bytes) -> bool:
    """Whether the socket's peer is on this host (a loopback address, or the socket's
    own): its other end may be held by a process here."""
    local, remote = endpoints(sockid)
    address = remote[:-2]
    return (address[:1] == b"\x7f" and len(address) == 4) or address in (_LOOPBACK_V6, local[:-2])


def parse_destroyed(data: bytes, cookies: set[bytes]) -> list[TcpSocket]:
    """The destroyed sockets in one datagram whose cookie is wanted (others skipped
    without decoding): their final counts."""
    found = []
    for kind, body, end in messages(data):
        if kind == SOCK_DIAG_BY_FAMILY and end - body >= _MSG_LEN:
            sockid = bytes(data[body + _ID_OFFSET : body + _ID_OFFSET + _ID_LEN])
            if sockid[_COOKIE] in cookies:
                counts = _tcp_bytes(data, body + _MSG_LEN, end)
                if counts is not None:
                    (inode,) = _U32.unpack_from(data, body + _INODE_OFFSET)
                    found.append(TcpSocket(inode, data[body], sockid, counts[0], counts[1]))
    return found


SO_ATTACH_FILTER = 26
MAX_FILTERED = 800  # five BPF instructions each, under the kernel's 4,096
_BPF = struct.Struct("=HBBI")  # struct sock_filter: code, jt, jf, k
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# A destroy notification: nlmsghdr (16), inet_diag_msg's socket id at 4 in it, whose
# cookie is its last 8 bytes: two words at 60 and 64 (BPF loads them big-endian).
_COOKIE_WORDS = (16 + _ID_OFFSET + _ID_LEN - 8, 16 + _ID_OFFSET + _ID_LEN - 4)


def _cookie_filter(cookies: frozenset[bytes] | None) -> ctypes.Array:
    """A classic BPF program that keeps the notifications of these cookies (all when
    None: too many to list) and drops the rest, as the kernel's sock_filter array."""
    code: list[tuple[int, int, int, int]] = []
    if cookies is None:
        code.append((_RET_K, 0, 0, 0xFFFFFFFF))
    else:
        for c in sorted(cookies):
            low, high = int.from_bytes(c[:4], "big"), int.from_bytes(c[4:], "big")
            code += [
                (_LD_W_ABS, 0, 0, _COOKIE_WORDS[0]),
                (_JEQ_K, 0, 3, low),
                (_LD_W_ABS, 0, 0, _COOKIE_WORDS[1]),
                (_JEQ_K, 0, 1, high),
                (_RET_K, 0, 0, 0xFFFFFFFF),
            ]
        code.append((_RET_K, 0, 0, 0))
    program = (ctypes.c_uint64 * len(code))()
    ctypes.memmove(program, b"".join(_BPF.pack(*i) for i in code), 8 * len(code))
    return program


class DestroyListener:
    """Every TCP socket the host destroys, with its final counts (sock_diag's destroy
    multicast groups): the last bytes of a connection that closed right after its
    last transfer, which no later lookup can find. Older kernels let only
    CAP_NET_ADMIN join (6.x lets any socket). Drained without blocking; an overflow
    (ENOBUFS) is counted, never silent."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self.listening = False
        self._filtered: frozenset[bytes] | None = None
        self._program: ctypes.Array = _cookie_filter(None)
        try:
            self._sock.bind((0, 0))
            self.listen({b"\0" * 8})  # refused here, at start, where it can be said
            self.listen(set())
            try:  # root may exceed rmem_max
                self._sock.setsockopt(socket.SOL_SOCKET, 33, DESTROY_BUFFER)  # SO_RCVBUFFORCE
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, DESTROY_BUFFER)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def listen(self, cookies: set[bytes]) -> None:
        """Listen for these sockets only. Every TCP close on the host is a notification:
        with none wanted the listener leaves the groups; otherwise a socket filter in
        the kernel drops every other socket's (a socket is only followed after a pass
        has seen it, and the filter is set before that pass ends)."""
        on = bool(cookies)
        if on != self.listening:
            option = NETLINK_ADD_MEMBERSHIP if on else NETLINK_DROP_MEMBERSHIP
            for group in (SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY):
                self._sock.setsockopt(SOL_NETLINK, option, group)
            self.listening = on
        wanted = frozenset(cookies) if len(cookies) <= MAX_FILTERED else None
        if on and wanted != self._filtered:
            self._program = _cookie_filter(wanted)
            address = ctypes.addressof(self._program)
            fprog = struct.pack("HxxxxxxQ", len(self._program), address)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            self._filtered = wanted

    def drain(self, cookies: set[bytes]) -> tuple[list[TcpSocket], bool]:
        """(the wanted sockets destroyed since the last drain, whether any
        notification was lost to an overflow)."""
        datagrams, overflowed = drain(self._sock)
        found = [s for d in datagrams for s in parse_destroyed(d, cookies)] if cookies else []
        return found, overflowed

    def close(self) -> None:
        self._sock.close()


def socket_inodes(fd_dir: int) -> set[int]:
    """Inodes of the sockets held open by the process whose /proc/PID/fd directory is
    open as ``fd_dir``. Raises OSError (ENOENT) once that process has exited."""
    inodes = set()
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(name, dir_fd=fd_dir)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes
