"""libnftables through ctypes: one context per network namespace, commands as text,
answers as JSON. No `nft` process per pass: a pass's listing costs one netlink round
trip (docs/performance.md).

A context's netlink socket belongs to the namespace it was opened in, so a context
for a container's namespace is opened by a short-lived thread that joins that
namespace first (setns affects only the calling thread).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import threading
from typing import Any

CLONE_NEWNET = 0x40000000
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON


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

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None
                _trim()


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
