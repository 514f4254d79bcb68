"""libnftables through ctypes: one context per network namespace, commands as text,
answers as JSON. No `nft` process per pass.

Counters are read by a netlink dump of their own (Nft.counters: the table's counter
objects and nothing else, one round trip), not through libnftables: any listing there
first fills its cache with every set element of the table, and the cgroup rules' flow
sets hold thousands (20,000 elements: 110-130 ms a listing, against 0.2 ms).

A context's netlink socket belongs to the namespace it was opened in, so a context
for a container's namespace is opened by a short-lived thread that joins that
namespace first (setns affects only the calling thread).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

CLONE_NEWNET = 0x40000000
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON
# linux/netlink.h, linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h
_NETLINK_NETFILTER = 12
_GETOBJ = (10 << 8) | 19  # NFNL_SUBSYS_NFTABLES, NFT_MSG_GETOBJ
_REQUEST_DUMP = 0x1 | 0x300  # NLM_F_REQUEST | NLM_F_DUMP
_DONE, _ERROR = 3, 2
_OBJ_TABLE, _OBJ_NAME, _OBJ_TYPE, _OBJ_DATA = 1, 2, 3, 4
_OBJECT_COUNTER = 1
_COUNTER_BYTES, _COUNTER_PACKETS = 1, 2
FAMILIES = {"inet": 1, "ip": 2, "ip6": 10}


class NftError(OSError):
    pass


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise NftError(f"libnftables is not installed ({exc}); apt-get install nftables") from None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_char_p
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    return lib


class Nft:
    """One libnftables context, in the namespace of ``netns`` (a path such as
    /proc/PID/ns/net; None: the caller's)."""

    def __init__(self, netns: str | None = None) -> None:
        self._lib = _library()
        self._ctx: int | None = None
        if netns is None:
            self._ctx = self._new()
        else:
            self._open_in(netns)
        self._lock = threading.Lock()  # a context is not safe across threads

    def _new(self) -> int:
        ctx = self._lib.nft_ctx_new(0)
        if not ctx:
            raise NftError("nft_ctx_new failed")
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)
        self._lib.nft_ctx_output_set_flags(ctx, _OUTPUT_JSON)
        # Made here: a netlink socket belongs to the namespace of its maker's thread.
        self._netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
        self._seq = 0
        return ctx

    def _open_in(self, netns: str) -> None:
        failure: list[BaseException] = []

        def join() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            try:
                fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        errno = ctypes.get_errno()
                        raise NftError(errno, f"setns({netns}): {os.strerror(errno)}")
                finally:
                    os.close(fd)
                self._ctx = self._new()
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=join, name="edgewatt-netns")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    def run(self, command: str) -> Any:
        """Run one command (or several, newline-separated); its JSON answer, or None
        when it prints nothing. NftError with nft's own message when refused."""
        with self._lock:
            if self._ctx is None:
                raise NftError("the nftables context is closed")
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, command.encode())
            out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
            err = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        if rc != 0:
            raise NftError(err.decode(errors="replace").strip() or f"nft failed: {command}")
        text = out.decode(errors="replace").strip()
        return json.loads(text) if text else None

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        """The table's named counters: name -> (bytes, packets). NftError when the
        kernel refuses (no such table, no CAP_NET_ADMIN)."""
        with self._lock:
            if self._ctx is None:
                raise NftError("the nftables context is closed")
            self._seq += 1
            request = _attr(_OBJ_TABLE, table.encode() + b"\0") + _attr(
                _OBJ_TYPE, struct.pack(">I", _OBJECT_COUNTER)
            )
            header = struct.pack(
                "=IHHII", 16 + 4 + len(request), _GETOBJ, _REQUEST_DUMP, self._seq, 0
            )
            self._netlink.sendall(header + struct.pack("=BBH", FAMILIES[family], 0, 0) + request)
            found: dict[str, tuple[int, int]] = {}
            while True:
                data = self._netlink.recv(1 << 16)
                for kind, body in _messages(data):
                    if kind == _DONE:
                        return found
                    if kind == _ERROR:
                        code = -struct.unpack_from("=i", body)[0]
                        if code == 0:
                            continue
                        raise NftError(code, f"listing counters of {table}: {os.strerror(code)}")
                    attrs = dict(_attrs(body[4:]))  # after the nfgenmsg header
                    counter = dict(_attrs(attrs.get(_OBJ_DATA, b"")))
                    name = attrs.get(_OBJ_NAME, b"").rstrip(b"\0").decode(errors="replace")
                    found[name] = (
                        struct.unpack(">Q", counter.get(_COUNTER_BYTES, bytes(8)))[0],
                        struct.unpack(">Q", counter.get(_COUNTER_PACKETS, bytes(8)))[0],
                    )

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None
                self._netlink.close()
                _trim()


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes(-length % 4)


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Netlink attributes: (type, payload), the nested and byte-order flags off."""
    return ((kind & 0x3FFF, payload) for kind, payload in _records(data, "=HH", 4))


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Netlink messages in one datagram: (type, body)."""
    return _records(data, "=IH", 16)


def _records(data: bytes, header: str, size: int) -> Iterator[tuple[int, bytes]]:
    """Length-prefixed netlink records (messages or attributes, whose ``header`` of
    ``size`` bytes starts with the length and the type), each aligned to 4 bytes."""
    offset = 0
    while offset + size <= len(data):
        length, kind = struct.unpack_from(header, data, offset)
        if length < size:
            return
        yield kind, data[offset + size : offset + length]
        offset += (length + 3) & ~3


def _trim() -> None:
    """Give freed heap back to the system: a context's caches are about 0.7 MiB, and
    glibc keeps what was freed in its arenas otherwise (the RSS never went down)."""
    libc = ctypes.CDLL(None)
    trim = getattr(libc, "malloc_trim", None)  # glibc's; musl has none
    if trim is not None:
        trim(0)


def available() -> str | None:
    """None when this process can use nftables, else why not."""
    try:
        nft = Nft()
    except NftError as exc:
        return str(exc)
    try:
        nft.run("list tables")
    except NftError as exc:
        return f"nftables refused (CAP_NET_ADMIN is needed): {exc}"
    finally:
        nft.close()
    return None
