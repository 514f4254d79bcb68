"""An eBPF cgroup counter, loaded without a toolchain: the alternative to nftables for
cgroup targets' bytes, measured beside it (benchmarks/cgroups.py runs both side by side).

Per cgroup, two ``BPF_PROG_TYPE_CGROUP_SKB`` programs (egress and ingress), each adding
``skb->len`` (IP bytes, as the nftables rules count) to a one-slot array map with an
atomic add, attached with ``BPF_F_ALLOW_MULTI``. The twelve instructions are written
here by hand (no clang, no libbpf: neither is on the devices we target by default)
and loaded through the ``bpf`` syscall; root (CAP_BPF and CAP_NET_ADMIN) only.
x86_64 and aarch64 syscall numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import struct

SYSCALL = {"x86_64": 321, "aarch64": 280}[platform.machine()]
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_PROG_LOAD = 0, 1, 5
BPF_PROG_ATTACH, BPF_PROG_DETACH = 8, 9
BPF_MAP_TYPE_ARRAY, BPF_PROG_TYPE_CGROUP_SKB = 2, 8
INGRESS, EGRESS = 0, 1  # BPF_CGROUP_INET_INGRESS / _EGRESS
BPF_F_ALLOW_MULTI = 2
ATTR_SIZE = 128

_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(command: int, fields: list[tuple[int, str, int]]) -> int:
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    for offset, fmt, value in fields:
        struct.pack_into(fmt, attr, offset, value)
    result = _libc.syscall(SYSCALL, command, attr, ATTR_SIZE)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({command}): {os.strerror(err)}")
    return result


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(map_fd: int) -> bytes:
    """r6 = ctx; key = 0; r0 = lookup(map, &key); if r0: *r0 += skb->len (atomic);
    return 1 (let the packet pass)."""
    return b"".join(
        [
            _insn(0xBF, dst=6, src=1),  # r6 = r1
            _insn(0x62, dst=10, off=-4, imm=0),  # *(u32 *)(r10 - 4) = 0
            _insn(0xBF, dst=2, src=10),  # r2 = r10
            _insn(0x07, dst=2, imm=-4),  # r2 += -4
            _insn(0x18, dst=1, src=1, imm=map_fd),  # r1 = map (ld_imm64, pseudo map fd)
            _insn(0x00),
            _insn(0x85, imm=1),  # call bpf_map_lookup_elem
            _insn(0x15, dst=0, off=2, imm=0),  # if r0 == 0 goto +2
            _insn(0x61, dst=1, src=6, off=0),  # r1 = *(u32 *)(r6 + 0): skb->len
            _insn(0xDB, dst=0, src=1, off=0, imm=0),  # lock *(u64 *)(r0 + 0) += r1
            _insn(0xB7, dst=0, imm=1),  # r0 = 1
            _insn(0x95),  # exit
        ]
    )


class CgroupCounter:
    """IP bytes each way through one cgroup v2 directory's sockets."""

    def __init__(self, cgroup_dir: str) -> None:
        self._cgroup = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
        self._maps: dict[int, int] = {}
        self._progs: dict[int, int] = {}
        license_ = ctypes.create_string_buffer(b"GPL")
        log = ctypes.create_string_buffer(65536)
        try:
            for direction in (EGRESS, INGRESS):
                map_fd = _bpf(
                    BPF_MAP_CREATE,
                    [(0, "<I", BPF_MAP_TYPE_ARRAY), (4, "<I", 4), (8, "<I", 8), (12, "<I", 1)],
                )
                self._maps[direction] = map_fd
                code = ctypes.create_string_buffer(program(map_fd))
                try:
                    prog_fd = _bpf(
                        BPF_PROG_LOAD,
                        [
                            (0, "<I", BPF_PROG_TYPE_CGROUP_SKB),
                            (4, "<I", len(code.raw) // 8),
                            (8, "<Q", ctypes.addressof(code)),
                            (16, "<Q", ctypes.addressof(license_)),
                            (24, "<I", 1),
                            (28, "<I", len(log)),
                            (32, "<Q", ctypes.addressof(log)),
                            (68, "<I", direction),
                        ],
                    )
                except OSError as exc:
                    raise OSError(exc.errno, f"{exc}: {log.value.decode()[-500:]}") from None
                self._progs[direction] = prog_fd
                _bpf(BPF_PROG_ATTACH, [*self._attach(direction), (12, "<I", BPF_F_ALLOW_MULTI)])
        except OSError:
            self.close()
            raise

    def _attach(self, direction: int) -> list[tuple[int, str, int]]:
        return [(0, "<I", self._cgroup), (4, "<I", self._progs[direction]), (8, "<I", direction)]

    def read(self) -> tuple[int, int]:
        """(sent, received) IP bytes since attached."""
        values = []
        for direction in (EGRESS, INGRESS):
            key, value = ctypes.c_uint32(0), ctypes.c_uint64(0)
            _bpf(
                BPF_MAP_LOOKUP_ELEM,
                [
                    (0, "<I", self._maps[direction]),
                    (8, "<Q", ctypes.addressof(key)),
                    (16, "<Q", ctypes.addressof(value)),
                ],
            )
            values.append(value.value)
        return values[0], values[1]

    def close(self) -> None:
        for direction, prog_fd in list(self._progs.items()):
            with contextlib.suppress(OSError):
                _bpf(BPF_PROG_DETACH, self._attach(direction))
            os.close(prog_fd)
        for map_fd in self._maps.values():
            os.close(map_fd)
        self._progs.clear()
        self._maps.clear()
        os.close(self._cgroup)
