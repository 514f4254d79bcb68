"""Intel/AMD RAPL energy counters from the powercap sysfs tree.

Each zone (``class/powercap/intel-rapl:N`` for a package, ``intel-rapl:N:M`` for
core, uncore or dram inside it, ``psys`` for the whole platform where the firmware
offers it) has a microjoule counter that wraps at ``max_energy_range_uj``. The
counters are turned into monotonic joules here, and power is their rate.

The host total is ``psys`` where present, else the packages plus their dram zones
(DRAM is outside the package domain). Since Linux 5.10 ``energy_uj`` is readable by
root only (CVE-2020-8694): without it the source reports nothing, quietly.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass

from edgewatt.core.power.source import NoData, PowerOptions, PowerReading, PullSource, Rail


@dataclass
class Zone:
    path: str
    name: str  # package-0, core, uncore, dram, psys
    max_uj: int
    top_level: bool
    last_uj: int = -1
    energy_j: float = 0.0  # monotonic, wraps undone
    power_w: float | None = None
    last_time: float = 0.0

    @property
    def rail_name(self) -> str:
        return self.name if self.top_level else f"{os.path.basename(self.path)} {self.name}"

    def update(self, now: float) -> None:
        with open(f"{self.path}/energy_uj") as f:
            uj = int(f.read())
        if self.last_uj >= 0:
            delta = uj - self.last_uj
            if delta < 0:  # wrapped at max_energy_range_uj
                delta += self.max_uj + 1
            self.energy_j += delta / 1e6
            if now > self.last_time:
                self.power_w = delta / 1e6 / (now - self.last_time)
        self.last_uj, self.last_time = uj, now


def _zone_type(name: str) -> str:
    if name == "dram":
        return "memory"
    if name == "psys":
        return "power_supply"
    return "cpu"


class RaplSource(PullSource):
    name = "rapl"
    board = False
    period_s = 0.001  # the counters update about every millisecond (Intel SDM)

    def __init__(self, zones: list[Zone]) -> None:
        self.zones = zones

    def read(self) -> PowerReading:
        now = time.monotonic()
        for zone in self.zones:
            zone.update(now)
        psys = [z for z in self.zones if z.name == "psys"]
        counted = psys or [
            z for z in self.zones if (z.top_level and z.name != "psys") or z.name == "dram"
        ]
        powers = [z.power_w for z in counted]
        return PowerReading(
            source=self.name,
            monotonic=now,
            rails=tuple(
                Rail(
                    id=f"rapl:{os.path.basename(z.path)}",
                    name=z.rail_name,
                    type=_zone_type(z.name),
                    power_w=z.power_w,
                    energy_j=z.energy_j,
                )
                for z in self.zones
            ),
            total_w=None if None in powers else sum(p for p in powers if p is not None),
            total_energy_j=sum(z.energy_j for z in counted),
            total_of=tuple(z.rail_name for z in counted),
        )


def discover(options: PowerOptions) -> RaplSource:
    zones = []
    for path in sorted(glob.glob(f"{options.sysfs_path}/class/powercap/intel-rapl:*")):
        try:
            with open(f"{path}/name") as f:
                name = f.read().strip()
            with open(f"{path}/max_energy_range_uj") as f:
                max_uj = int(f.read())
            with open(f"{path}/energy_uj") as f:
                int(f.read())
        except PermissionError as exc:
            raise NoData(f"RAPL counters need root ({exc.filename})") from exc
        except (OSError, ValueError):
            continue
        top_level = os.path.basename(path).count(":") == 1
        zones.append(Zone(path=path, name=name, max_uj=max_uj, top_level=top_level))
    if not zones:
        raise NoData(f"no RAPL zones under {options.sysfs_path}/class/powercap")
    source = RaplSource(zones)
    source.read()  # sets the counters' starting points
    return source
