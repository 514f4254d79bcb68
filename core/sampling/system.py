"""Host-wide figures: CPU time by mode, memory by state, bytes per network interface."""

from __future__ import annotations

from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.sampling.procfs import CLOCK_TICKS

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


def read_cpu(proc: str = "/proc") -> HostCpu:
    with open(f"{proc}/stat") as f:
        text = f.read()
    cpus = 0
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("cpu "):
            ticks = [int(x) for x in line.split()[1:]]
            ticks += [0] * (8 - len(ticks))  # old kernels print fewer columns
            seconds = {
                mode: sum(ticks[i] for i in cols) / CLOCK_TICKS for mode, cols in _CPU_COLUMNS
            }
        elif line.startswith("cpu"):
            cpus += 1
    if not seconds:
        raise ValueError(f"no aggregate cpu line in {proc}/stat")
    return HostCpu(seconds_by_mode=seconds, logical_cpus=max(cpus, 1))


def read_memory(proc: str = "/proc") -> HostMemory:
    kib: dict[str, int] = {}
    with open(f"{proc}/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            kib[key] = int(rest.split()[0])
    total = kib["MemTotal"] * 1024
    free = kib["MemFree"] * 1024
    buffers = kib.get("Buffers", 0) * 1024
    # Reclaimable slab is cache in all but name: `free` and psutil count it there too.
    cached = (kib.get("Cached", 0) + kib.get("SReclaimable", 0)) * 1024
    used = max(total - free - buffers - cached, 0)
    return HostMemory(
        total_bytes=total,
        bytes_by_state={"used": used, "free": free, "buffers": buffers, "cached": cached},
    )


def read_network(proc: str = "/proc") -> dict[str, InterfaceBytes]:
    """Bytes per interface of the daemon's network namespace, loopback included."""
    result: dict[str, InterfaceBytes] = {}
    with open(f"{proc}/net/dev") as f:
        lines = f.readlines()[2:]  # two header lines
    for line in lines:
        name, _, data = line.partition(":")
        cols = data.split()
        result[name.strip()] = InterfaceBytes(receive=int(cols[0]), transmit=int(cols[8]))
    return result
