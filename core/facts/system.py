"""Host-wide figures: CPU time by mode, memory by state, bytes per network interface."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.procfs import CLOCK_TICKS

# /proc/stat "cpu" columns mapped to OTel semconv cpu.mode values; guest time is
# already included in user and nice, so it is not counted twice.
_CPU_COLUMNS = (
    ("user", (0,)),
    ("nice", (1,)),
    ("system", (2,)),
    ("idle", (3,)),
    ("iowait", (4,)),
    ("interrupt", (5, 6)),
    ("steal", (7,)),
)


@dataclass(frozen=True, **SLOTS)
class HostCpu:
    seconds_by_mode: dict[str, float]  # summed over all logical CPUs
    logical_cpus: int
    # Each online logical CPU's (busy, total) seconds by its number (cpuN): /proc/stat
    # lists online CPUs only, so a line's position is not its number (empty: unknown).
    per_cpu: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def busy_seconds(self) -> float:
        return sum(v for k, v in self.seconds_by_mode.items() if k not in ("idle", "iowait"))

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds_by_mode.values())


@dataclass(frozen=True, **SLOTS)
class HostMemory:
    total_bytes: int
    bytes_by_state: dict[str, int]  # used, free, buffers, cached: they add up to total


@dataclass(frozen=True, **SLOTS)
class InterfaceBytes:
    receive: int
    transmit: int


def parse_cpu(text: bytes) -> HostCpu:
    """/proc/stat's aggregate line, and each cpuN line by N."""
    text = text.lstrip()
    head = text[: text.index(b"\n")] if b"\n" in text else text
    if not head.startswith(b"cpu "):
        raise ValueError("no aggregate cpu line in /proc/stat")
    ticks = [int(x) for x in head.split()[1:]]
    ticks += [0] * (8 - len(ticks))  # old kernels print fewer columns
    seconds = {mode: sum(ticks[i] for i in cols) / CLOCK_TICKS for mode, cols in _CPU_COLUMNS}
    cpus = text.count(b"\ncpu")  # the per-CPU lines follow the aggregate one
    per_cpu: dict[int, tuple[float, float]] = {}
    for line in text.split(b"\n")[1 : cpus + 1]:
        name, _, columns = line.partition(b" ")
        if not name[3:].isdigit():
            continue
        values = [int(x) for x in columns.split()[:8]]
        values += [0] * (8 - len(values))
        idle = values[3] + values[4]  # idle and iowait, as busy_seconds leaves them out
        total = sum(values)
        per_cpu[int(name[3:])] = ((total - idle) / CLOCK_TICKS, total / CLOCK_TICKS)
    return HostCpu(seconds_by_mode=seconds, logical_cpus=max(cpus, 1), per_cpu=per_cpu)


# The five /proc/meminfo keys used, found in one scan rather than a split of each line.
_MEMINFO = re.compile(rb"^(MemTotal|MemFree|Buffers|Cached|SReclaimable):\s+(\d+)", re.M)


def parse_memory(text: bytes) -> HostMemory:
    kib = {key: int(value) for key, value in _MEMINFO.findall(text)}
    if b"MemTotal" not in kib or b"MemFree" not in kib:
        raise KeyError("MemTotal or MemFree missing from /proc/meminfo")
    total = kib[b"MemTotal"] * 1024
    free = kib[b"MemFree"] * 1024
    buffers = kib.get(b"Buffers", 0) * 1024
    # Reclaimable slab is cache in all but name: `free` and psutil count it there too.
    cached = (kib.get(b"Cached", 0) + kib.get(b"SReclaimable", 0)) * 1024
    used = max(total - free - buffers - cached, 0)
    return HostMemory(
        total_bytes=total,
        bytes_by_state={"used": used, "free": free, "buffers": buffers, "cached": cached},
    )


def net_dev_rows(text: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """(interface, its counters) of each line of a /proc/net/dev: receive bytes and
    packets first, transmit bytes and packets from the ninth on."""
    for line in text.splitlines()[2:]:  # two header lines
        name, _, data = line.partition(b":")
        cols = data.split()
        if len(cols) >= 10:
            yield name.strip().decode(errors="replace"), cols


def parse_network(text: bytes) -> dict[str, InterfaceBytes]:
    """Bytes per interface of /proc/net/dev (its namespace's), loopback included."""
    return {
        name: InterfaceBytes(receive=int(cols[0]), transmit=int(cols[8]))
        for name, cols in net_dev_rows(text)
    }


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_cpu(proc: str = "/proc") -> HostCpu:
    return parse_cpu(_read(f"{proc}/stat"))


def read_memory(proc: str = "/proc") -> HostMemory:
    return parse_memory(_read(f"{proc}/meminfo"))


def read_network(proc: str = "/proc") -> dict[str, InterfaceBytes]:
    """Bytes per interface of the daemon's network namespace, loopback included."""
    return parse_network(_read(f"{proc}/net/dev"))


class HostFiles:
    """The three host files held open and read with pread at every pass: no path walk
    and no open or close per pass (each a GIL release, which costs a thread switch in
    a busy process sampling itself). The kernel writes each anew at offset 0."""

    SIZE = 1 << 16  # /proc/stat of a 256-CPU host is ~40 KB

    def __init__(self, proc: str = "/proc") -> None:
        self._fds: list[int] = []
        try:
            for name in ("stat", "meminfo", "net/dev"):
                self._fds.append(os.open(f"{proc}/{name}", os.O_RDONLY))
        except BaseException:
            self.close()
            raise

    def read(self) -> tuple[HostCpu, HostMemory, dict[str, InterfaceBytes]]:
        stat, meminfo, netdev = (self._whole(fd) for fd in self._fds)
        return parse_cpu(stat), parse_memory(meminfo), parse_network(netdev)

    def read_cpu(self) -> HostCpu:
        """/proc/stat alone."""
        return parse_cpu(self._whole(self._fds[0]))

    def _whole(self, fd: int) -> bytes:
        data = os.pread(fd, self.SIZE, 0)
        while len(data) % self.SIZE == 0 and data:  # a host of many interfaces: read on
            more = os.pread(fd, self.SIZE, len(data))
            if not more:
                break
            data += more
        return data

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
