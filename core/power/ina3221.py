"""INA3221 / INA238 power monitors read straight from sysfs (no tegrastats, no root).

Layouts (field notes):
- JetPack 4, IIO: ``bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:deviceN/`` with
  0-based ``rail_name_K`` and ``in_powerK_input`` in mW.
- JetPack 5+, hwmon: a ``class/hwmon/hwmonN`` whose ``name`` is ``ina3221``, 1-based
  ``inN_label``, ``inN_input`` (bus mV) and ``currN_input`` (mA); power = mV x mA.
  ``in7`` is the shunt-voltage sum and ``NC`` labels are unconnected: both skipped.
  hwmonN numbers change between boots, so devices are found by ``name`` only.
- Thor adds an INA238 (``name`` ``ina238``) whose ``power1_input`` is in uW; it
  measures the module input, which tegrastats prints as ``VIN``.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.power.source import (
    NoData,
    PowerOptions,
    PowerReading,
    Rail,
    board_total,
    rail_type,
)


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class Channel:
    name: str
    watts: Callable[[], float]


def iio_channels(sysfs: str) -> list[Channel]:
    channels = []
    pattern = f"{sysfs}/bus/i2c/drivers/ina3221x/*/iio:device*"
    for device in sorted(glob.glob(pattern)):
        for k in range(3):
            name = _read_text(f"{device}/rail_name_{k}")
            power = f"{device}/in_power{k}_input"
            if not name or name == "NC" or not os.path.exists(power):
                continue
            channels.append(Channel(name, lambda p=power: _read_int(p) / 1000.0))
    return channels


def hwmon_channels(sysfs: str) -> list[Channel]:
    channels = []
    for device in sorted(glob.glob(f"{sysfs}/class/hwmon/hwmon*")):
        chip = _read_text(f"{device}/name")
        if chip == "ina3221":
            for n in range(1, 7):  # in7 is the shunt sum: never a rail
                label = _read_text(f"{device}/in{n}_label")
                volts, amps = f"{device}/in{n}_input", f"{device}/curr{n}_input"
                if not label or label == "NC" or not os.path.exists(amps):
                    continue
                channels.append(
                    Channel(
                        label,
                        lambda v=volts, a=amps: _read_int(v) * _read_int(a) / 1_000_000.0,
                    )
                )
        elif chip == "ina238" and os.path.exists(f"{device}/power1_input"):
            label = _read_text(f"{device}/power1_label") or _read_text(f"{device}/label") or "VIN"
            path = f"{device}/power1_input"
            channels.append(Channel(label, lambda p=path: _read_int(p) / 1_000_000.0))
    return channels


class Ina3221Source:
    """Rails of every INA3221/INA238 channel; the board total as tegrastats computes it."""

    name = "ina3221"
    board = True  # measures the whole board: the host total comes from here

    def __init__(self, channels: list[Channel]) -> None:
        self.channels = channels

    def read(self) -> PowerReading:
        watts = {c.name: c.watts() for c in self.channels}
        return PowerReading(
            source=self.name,
            monotonic=time.monotonic(),
            rails=tuple(
                Rail(id=f"ina3221:{name}", name=name, type=rail_type(name), power_w=w)
                for name, w in watts.items()
            ),
            total_w=board_total(watts),
        )

    def close(self) -> None:
        pass


def discover(options: PowerOptions) -> Ina3221Source:
    channels = iio_channels(options.sysfs_path) + hwmon_channels(options.sysfs_path)
    if not channels:
        raise NoData(f"no INA3221/INA238 power monitor under {options.sysfs_path}")
    source = Ina3221Source(channels)
    try:
        source.read()
    except (OSError, ValueError) as exc:
        raise NoData(f"INA3221 monitors found but unreadable: {exc}") from exc
    return source
