"""The board's facts that decide what a joule buys: one function per fact, each
returning the value or None meaning absent (never an exception), read where the fact
lives. No board or JetPack list: what exists is read, on any Linux machine.

Files are read under :class:`Roots` (a container's host /sys, /proc and /etc, or a
test's tree); ``nvpmodel`` and ``vcgencmd`` are found on ``Roots.path`` (the daemon's
PATH by default), so a test puts stand-ins there. Layouts (real captures in
tests/fixtures/context/, sources named in its README):

- ``nvpmodel -q``: ``NV Power Mode: MAXN`` then the mode's id on the next line, maybe
  after warnings (``NVPM WARN: fan mode is not set!``).
- ``/etc/nv_tegra_release`` line 1: ``# R36 (release), REVISION: 4.4, GCID: ...``.
- The device tree's model, NUL-terminated: ``/proc/device-tree/model``, the same file
  as ``/sys/firmware/devicetree/base/model``.
- cpufreq: ``devices/system/cpu/cpuN/cpufreq/scaling_{cur,min,max}_freq`` in kHz;
  devfreq (a Jetson's GPU, EMC where exposed): ``class/devfreq/*/{cur,min,max}_freq``
  in Hz.
- Clocks pinned (what ``jetson_clocks`` does, read as jetson_stats reads it, with no
  root and no process): every online CPU's and devfreq device's minimum at its maximum.
- Over-current events (Tegra's soctherm): ``class/hwmon/hwmonN/ocK_event_cnt``.
- Thermal zones: ``class/thermal/thermal_zoneN/{type,temp}``, millidegrees (Tegra's
  PMIC-Die, a constant 100 C, left out).
- A Raspberry Pi's ``vcgencmd get_throttled``: ``throttled=0x50000``, bits below.

Standard library only: ``edgewatt doctor`` imports it under the system's Python.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

# A spawned tool is given this long: a busy board may delay its start.
TIMEOUT_S = 5.0
MAX_OUTPUT_BYTES = 8192  # far above what nvpmodel -q or get_throttled print
# Zones reading this or lower are switched off (tegrastats prints -256C for them).
SENSOR_OFF_C = -256.0
# vcgencmd get_throttled's bits (Raspberry Pi documentation, get_throttled).
THROTTLED_BITS = {
    0: "under-voltage",
    1: "arm-frequency-capped",
    2: "throttled",
    3: "soft-temperature-limit",
    16: "under-voltage-occurred",
    17: "arm-frequency-capping-occurred",
    18: "throttling-occurred",
    19: "soft-temperature-limit-occurred",
}

_MODE = re.compile(r"^NV Power Mode: *(\S.*?)\s*$")
_RELEASE = re.compile(r"^# R(\d+) \(release\), REVISION: (\d+(?:\.\d+)*)")
_THROTTLED = re.compile(r"^throttled=(0x[0-9a-fA-F]{1,8})$")


@dataclass(frozen=True)
class Roots:
    """Where facts are read: the file trees' mount points and the executables' PATH
    (None: this process's)."""

    sysfs: str = "/sys"
    proc: str = "/proc"
    etc: str = "/etc"
    path: str | None = None


@dataclass(frozen=True)
class PowerMode:
    name: str
    id: int | None  # None: nvpmodel printed no id after the name


@dataclass(frozen=True)
class Clock:
    name: str  # cpuN, or the devfreq device's name (17000000.gpu)
    cur_hz: int | None
    min_hz: int | None
    max_hz: int | None


@dataclass(frozen=True)
class Zone:
    name: str  # the zone's type (cpu-thermal, tj-thermal)
    celsius: float


def _read(path: str, size: int = 256) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:  # absent, unreadable, or a sensor that answers EIO/ENODATA
        return None


def _number(path: str) -> int | None:
    raw = _read(path, 64)
    try:
        return None if raw is None else int(raw.strip())
    except ValueError:
        return None


def run_tool(name: str, args: tuple[str, ...], roots: Roots) -> str | None:
    """``name args`` found on ``roots.path``: its stdout, or None where it is not
    there, fails, or does not end within TIMEOUT_S."""
    found = shutil.which(name, path=roots.path)
    if found is None:
        return None
    try:
        done = subprocess.run(
            [found, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")


def parse_power_mode(text: str) -> PowerMode | None:
    lines = [line.strip() for line in text.splitlines()]
    for number, line in enumerate(lines):
        match = _MODE.match(line)
        if match is None:
            continue
        following = next((rest for rest in lines[number + 1 :] if rest), "")
        return PowerMode(match.group(1), int(following) if following.isdigit() else None)
    return None


def power_mode(roots: Roots) -> PowerMode | None:
    """nvpmodel's mode (one spawn, ~1 ms of CPU for the real binary)."""
    text = run_tool("nvpmodel", ("-q",), roots)
    return None if text is None else parse_power_mode(text)


def l4t_release(roots: Roots) -> str | None:
    """The L4T release, "36.4.4" for ``# R36 (release), REVISION: 4.4``."""
    raw = _read(f"{roots.etc}/nv_tegra_release", 512)
    if raw is None:
        return None
    match = _RELEASE.match(raw.decode("utf-8", "replace"))
    return None if match is None else f"{match.group(1)}.{match.group(2)}"


def board_model(roots: Roots) -> str | None:
    """The device tree's model: /proc's link first, then sysfs's file."""
    for path in (
        f"{roots.proc}/device-tree/model",
        f"{roots.sysfs}/firmware/devicetree/base/model",
    ):
        raw = _read(path)
        if raw is not None:
            model = raw.split(b"\0")[0].decode("utf-8", "replace").strip()
            return model or None
    return None


def _index(path: str) -> int:
    """N of a cpuN or thermal_zoneN directory, for their order (cpu10 after cpu9)."""
    return int(re.sub(r"\D", "", os.path.basename(path)) or -1)


def cpu_clocks(roots: Roots) -> tuple[Clock, ...] | None:
    """Each online CPU's cpufreq clock (Hz); None where cpufreq is absent."""
    clocks = []
    cpus = glob.glob(f"{roots.sysfs}/devices/system/cpu/cpu[0-9]*")
    for cpu in sorted(cpus, key=_index):
        if _number(f"{cpu}/online") == 0:  # cpu0 often has no online file: it is on
            continue
        freq = f"{cpu}/cpufreq"
        if not os.path.isdir(freq):
            continue
        cur, low, high = (_number(f"{freq}/scaling_{k}_freq") for k in ("cur", "min", "max"))
        khz = 1000
        clocks.append(
            Clock(
                os.path.basename(cpu),
                None if cur is None else cur * khz,
                None if low is None else low * khz,
                None if high is None else high * khz,
            )
        )
    return tuple(clocks) or None


def devfreq_clocks(roots: Roots) -> tuple[Clock, ...] | None:
    """Each devfreq device's clock (Hz): a Jetson's GPU (17000000.gpu on Orin), and
    its EMC or other engines where the kernel exposes them; None where there are none."""
    clocks = tuple(
        Clock(
            os.path.basename(device),
            _number(f"{device}/cur_freq"),
            _number(f"{device}/min_freq"),
            _number(f"{device}/max_freq"),
        )
        for device in sorted(glob.glob(f"{roots.sysfs}/class/devfreq/*"))
    )
    return clocks or None


def clocks_pinned(clocks: tuple[Clock, ...]) -> bool | None:
    """Whether every clock's minimum is its maximum (jetson_clocks' state); None
    where no clock has both limits."""
    limited = [c for c in clocks if c.min_hz is not None and c.max_hz is not None]
    if not limited:
        return None
    return all(c.min_hz == c.max_hz for c in limited)


def overcurrent_events(roots: Roots) -> dict[str, int] | None:
    """soctherm's over-current event counters since boot, by alarm (oc1, oc2, ...);
    None where the board has none (or they are unreadable)."""
    found = {}
    for path in sorted(glob.glob(f"{roots.sysfs}/class/hwmon/hwmon*/oc*_event_cnt")):
        count = _number(path)
        if count is not None:
            found[os.path.basename(path)[: -len("_event_cnt")]] = count
    return found or None


def thermal_zones(roots: Roots) -> tuple[Zone, ...] | None:
    """Every thermal zone that reads a temperature, switched-off sensors left out."""
    zones = []
    paths = glob.glob(f"{roots.sysfs}/class/thermal/thermal_zone*")
    for zone in sorted(paths, key=_index):
        milli = _number(f"{zone}/temp")
        kind = _read(f"{zone}/type", 64)
        name = kind.decode("utf-8", "replace").strip() if kind else os.path.basename(zone)
        # Tegra's PMIC-Die zone reads a fixed 100 C, with no sensor behind it (jetson_stats
        # leaves it out too): it would always be the hottest.
        if milli is None or milli / 1000 <= SENSOR_OFF_C or name.startswith("PMIC"):
            continue
        zones.append(Zone(name, milli / 1000))
    return tuple(zones) or None


def hottest(zones: tuple[Zone, ...]) -> Zone:
    return max(zones, key=lambda z: z.celsius)


def parse_throttled(text: str) -> int | None:
    match = _THROTTLED.match(text.strip())
    return None if match is None else int(match.group(1), 16)


def throttled_flags(value: int) -> tuple[str, ...]:
    """The names of the bits set, lowest first (unknown bits as bitN)."""
    return tuple(
        THROTTLED_BITS.get(bit, f"bit{bit}")
        for bit in range(value.bit_length())
        if value >> bit & 1
    )


def pi_throttled(roots: Roots) -> int | None:
    """A Raspberry Pi's throttled bits from ``vcgencmd get_throttled`` (one spawn)."""
    text = run_tool("vcgencmd", ("get_throttled",), roots)
    return None if text is None else parse_throttled(text)
