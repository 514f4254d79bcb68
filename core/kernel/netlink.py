"""What the netlink clients share: reading a listening socket dry without blocking,
and walking the messages of one datagram and the attributes of one message."""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
NLATTR = struct.Struct("=HH")  # length, type: struct nlattr, and rtattr alike


def align(n: int) -> int:
    """Netlink's 4-byte alignment of messages and attributes."""
    return (n + 3) & ~3


def drain(sock: socket.socket) -> tuple[list[bytes], bool]:
    """(the datagrams waiting on a non-blocking socket, whether the kernel dropped
    any since the last drain: ENOBUFS, a full receive buffer; reading goes on)."""
    datagrams: list[bytes] = []
    overflowed = False
    while True:
        try:
            datagrams.append(sock.recv(1 << 16))
        except BlockingIOError:
            return datagrams, overflowed
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            overflowed = True


def messages(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, start of the body, end) of each message in one datagram."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size:
            return
        yield kind, offset + NLMSGHDR.size, offset + length
        offset += align(length)


def attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each attribute between start and end;
    stops at a malformed length."""
    offset = start
    while offset + NLATTR.size <= end:
        length, kind = NLATTR.unpack_from(data, offset)
        if length < NLATTR.size:
            return
        yield kind, offset + NLATTR.size, offset + length
        offset += align(length)
