"""The one small interface every power source implements, and what it reports.

A source is discovered once (its ``discover`` raises :class:`NoData` where the
hardware is absent: normal, not an error) and then read by the power reader
(meter.py): a pull source measures when it is read, a push source (tegrastats) prints
on its own and hands over what it printed. Readings carry watts and joules;
milliwatts and microjoules stay inside each source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from edgewatt.core import options as opt
from edgewatt.core.compat import SLOTS
from edgewatt.core.options import Flag, option
from edgewatt.core.text import shown

# The power reader's rate (config ``power_sample_hz``) is by default chosen on the
# device itself (rate.py): the highest of AUTO_RATES_HZ whose cost, as the reader's
# own thread measures it, stays within AUTO_BUDGET of one core (less what windows
# spent lately, allowance.py). On the 2-core VM of docs/performance.md the Python reader
# runs at 20 or 50 Hz, the native one (power/native.py) at 50 or 100 Hz; a Jetson
# Nano core, about a fifth as fast, would get 10 Hz or less. Windows of 150 ms are
# within 1 % at 50 Hz when they hold no step of the power, up to 12 % across a 10 W
# step (1.3 % at 200 Hz): young windows are read at WINDOW_HZ.
AUTO_RATES_HZ = (5.0, 10.0, 20.0, 50.0, 100.0, 200.0)
AUTO_START_HZ = 50.0
AUTO_BUDGET = 0.005  # of one core
# A source that prints on its own runs at one rate for its life (a restart would lose
# lines): under the automatic rate, this one, whatever the reader's thread settles at.
AUTO_PUSH_HZ = 10.0
MAX_SAMPLE_HZ = 1000.0
# The rate young windows (phases, track calls, FL rounds) are read at (allowance.py).
WINDOW_HZ = 200.0


# The sources in discovery order, each the name of its module in this package: the
# registry (SOURCES in power/__init__.py) imports each module's discover by it, and the
# key's parser below the sensors reads it without importing them.
SOURCE_NAMES = ("ina3221", "tegrastats", "tegra_gpu", "pi5", "rapl", "nvml", "powermetrics")


def _power_sources(value: Any) -> tuple[str, ...] | None:
    if value == "auto":
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError("must be 'auto' or a list of source names")
    clean = tuple(str(n).strip() for n in names)
    for name in clean:
        if name not in SOURCE_NAMES:
            raise ValueError(
                f"unknown power source {shown(name)}; known: {', '.join(SOURCE_NAMES)}"
            )
    return clean


@dataclass(frozen=True)
class PowerOptions:
    """The daemon's power keys: discovery's and the reader's (meter.py) settings."""

    sources: tuple[str, ...] | None = option(
        "power_sources",
        None,  # discover automatically
        _power_sources,
        "auto, or the sources to use: a YAML list or comma-separated names of ina3221, "
        "tegrastats, tegra_gpu, pi5 (Raspberry Pi 5), rapl, nvml, powermetrics (macOS)",
    )
    sample_hz: float | None = option(
        "power_sample_hz",
        None,  # chosen on the device (auto)
        opt.optional(opt.ranged(float, 1, MAX_SAMPLE_HZ, "auto or a rate in Hz")),
        "readings of the power monitors per second, apart from the sampling passes (1 to "
        "1000): INA3221/INA238 sysfs read at it, tegrastats and powermetrics run with the "
        "matching interval; energy counters (RAPL, NVML) are read at every edge instead. "
        "Unset or auto: the highest of 5, 10, 20, 50, 100, 200 Hz whose cost, as the "
        "reader measures it on this device, stays within 0.5 % of one core less what "
        "windows spent at power_window_hz in the last 10 s (down to half of it), chosen "
        f"again every 10 s; tegrastats and powermetrics then at {AUTO_PUSH_HZ:g} Hz",
    )
    window_hz: float = option(
        "power_window_hz",
        WINDOW_HZ,  # 0: windows read at sample_hz
        opt.ranged(float, 0, MAX_SAMPLE_HZ, "0 or a rate in Hz"),
        "readings of the INA3221/INA238 monitors per second while a window is young (a "
        "phase, a track call or an FL round, for its first 2 s; and 0.25 s past the "
        "last one's end, for the next), where above "
        "power_sample_hz; 0: none. Within the same budget as the automatic rate: the "
        "windows spend what the steady rate leaves of it (at most 10 s of it at once); a "
        "window opened with that spent is read at power_sample_hz",
    )
    tegrastats_path: str = option(
        "tegrastats",
        "/usr/bin/tegrastats",
        opt.path,
        "the tegrastats executable, run once for the daemon's lifetime",
        flag=Flag("PATH", "tegrastats executable (default /usr/bin/tegrastats)"),
    )
    sysfs_path: str = option(
        "sysfs_path",
        "/sys",
        opt.path,
        "sysfs mount point (INA3221/INA238 monitors, RAPL; the device context: the device "
        "tree's model, cpufreq, devfreq, over-current counters, thermal zones)",
    )
    # Not a daemon key: EDGEWATT_POWERMETRICS is read by in-process sampling on macOS.
    powermetrics_path: str = "/usr/bin/powermetrics"

    @property
    def push_hz(self) -> float:
        """The rate a source that prints on its own is run at."""
        return self.sample_hz if self.sample_hz is not None else AUTO_PUSH_HZ


class NoData(Exception):
    """This source has nothing on this machine (no such hardware, no permission)."""


class CannotMeasure(NoData):
    """This source loads but cannot measure here (NVML on a Tegra board answers "not
    supported" for power): it steps aside for the next, and says so where looked at."""


@dataclass(frozen=True, **SLOTS)
class Rail:
    id: str  # stable hw.id, "<source>:<name>"
    name: str  # as the hardware names it (VDD_IN, package-0, GPU-...)
    type: str  # OTel hw.type: cpu, gpu, memory, power_supply
    power_w: float | None
    energy_j: float | None = None  # the hardware's own monotonic counter, where it has one


@dataclass(frozen=True, **SLOTS)
class GpuProcess:
    utilization: float | None  # share of the GPU's SMs, 0..1
    memory_bytes: int | None


@dataclass(frozen=True, **SLOTS)
class Gpu:
    id: str
    name: str
    utilization: float | None  # 0..1
    power_w: float | None = None
    energy_j: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: Mapping[int, GpuProcess] = field(default_factory=dict)  # by host pid
    frequency_mhz: int | None = None  # its clock, where the board reports it (tegrastats)


@dataclass(frozen=True, **SLOTS)
class PowerReading:
    source: str
    monotonic: float  # when the values were measured
    rails: tuple[Rail, ...] = ()
    # What this source measures of the whole device: a board input rail, RAPL
    # packages, a GPU. Sources are chosen so that their totals do not overlap.
    total_w: float | None = None
    total_energy_j: float | None = None
    gpus: tuple[Gpu, ...] = ()
    temperatures_c: Mapping[str, float] = field(default_factory=dict)
    # The rails the total is, where not all of them (nor a board's input rail): what
    # an energy figure's provenance names (provenance.py).
    total_of: tuple[str, ...] = ()


class PowerSource(Protocol):
    name: str
    board: bool  # True: its total is the whole device's (a Jetson board input)
    pushed: bool  # True: it prints readings on its own; False: read() measures now
    # How often the hardware's values change, where known (None: unknown): a window
    # shorter than this is not resolved by the sensor.
    period_s: float | None

    def read(self) -> PowerReading | None:
        """The values now (a pull source), or the latest (a push source); None when
        the source has produced none yet."""
        ...

    def read_total(self) -> tuple[float, float] | None:
        """(monotonic, W) of the source's total alone, measured now: what the power
        reader's stream reads at its rate, cheaper than a whole reading (None: the
        source has no cheaper way, read() is used)."""
        ...

    def arrived(self) -> list[PowerReading]:
        """A push source's readings not handed over yet, oldest first (a pull
        source: [])."""
        ...

    def wait_newer(self, after: float, timeout_s: float) -> None:
        """Until a push source has a reading measured later than ``after`` (monotonic),
        or ``timeout_s`` passed (a pull source returns at once)."""
        ...

    def child_pid(self) -> int | None:
        """The process it runs for its readings (tegrastats, powermetrics), if any: not
        one of the monitored command's (edgewatt run waits for those alone)."""
        ...

    def close(self) -> None: ...


# The board input rail, in order of preference (field notes). AGX Xavier and AGX
# Orin have none: their rails are summed. VIN_SYS_5V0 is a sub-rail, never the total.
BOARD_INPUT_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")


def board_total(rails_w: Mapping[str, float]) -> float | None:
    """A Jetson board's input power: its input rail where measured, else the rail sum."""
    for name in BOARD_INPUT_RAILS:
        if name in rails_w:
            return rails_w[name]
    # Rounded to well below the sensors' resolution: 0.1 + 0.2 W must read 0.3 W.
    return round(math.fsum(rails_w.values()), 6) if rails_w else None


# Sources whose rails are a board's power monitors (their GPU rail is the GPU's own).
BOARD_SOURCES = ("ina3221", "tegrastats")
# The board GPU's load, where one of them (or the GPU's load file beside the
# INA3221s) reports it: GR3D.
BOARD_GPU_LOADS = ("tegrastats:GR3D", "tegra_gpu:GPU")


def gpu_only(rail: str) -> bool:
    """A rail that feeds the GPU alone (VDD_GPU, GPU, POM_5V_GPU, VDD_GPU_SOC), not one
    shared with the CPU (Orin Nano's VDD_CPU_GPU_CV)."""
    upper = rail.upper()
    return "GPU" in upper and "CPU" not in upper


def rail_type(name: str) -> str:
    """OTel hw.type of a power rail, from the words in its name."""
    upper = name.upper()
    if "GPU" in upper:
        return "gpu"
    if "CPU" in upper:
        return "cpu"
    if "DDR" in upper or "DRAM" in upper or "VDDQ" in upper or "VDDRQ" in upper:
        return "memory"
    return "power_supply"


class PullSource:
    """What every source measured when it is read has in common."""

    pushed = False
    period_s: float | None = None

    def read_total(self) -> tuple[float, float] | None:
        return None

    def arrived(self) -> list[PowerReading]:
        return []  # nothing arrives on its own: read() measures

    def wait_newer(self, after: float, timeout_s: float) -> None:
        pass

    def child_pid(self) -> int | None:
        return None

    def close(self) -> None:
        pass
