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
from collections.abc import Sequence
from dataclasses import dataclass

from edgewatt.core.power.source import (
    BOARD_INPUT_RAILS,
    NoData,
    PowerOptions,
    PowerReading,
    PullSource,
    Rail,
    board_total,
    rail_type,
)


class Attribute:
    """One sysfs value file, held open: a read is one pread at offset 0 (sysfs shows the
    value anew at each read from the start), no path walk, no open and close. At the
    reader's rate this is most of what a reading costs (benchmarks/power_reader.py)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    @property
    def fd(self) -> int:
        return self._fd

    def value(self) -> int:
        return int(os.pread(self._fd, 32, 0))

    def close(self) -> None:
        os.close(self._fd)


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class Channel:
    name: str
    files: tuple[Attribute, ...]  # multiplied together, then divided
    per_watt: int  # units of the product in one watt

    def watts(self) -> float:
        return self.watts_of([attribute.value() for attribute in self.files])

    def watts_of(self, values: Sequence[int]) -> float:
        product = 1
        for value in values:
            product *= value
        return product / self.per_watt

    def close(self) -> None:
        for attribute in self.files:
            attribute.close()


def iio_channels(sysfs: str) -> list[Channel]:
    channels = []
    pattern = f"{sysfs}/bus/i2c/drivers/ina3221x/*/iio:device*"
    for device in sorted(glob.glob(pattern)):
        for k in range(3):
            name = _read_text(f"{device}/rail_name_{k}")
            power = f"{device}/in_power{k}_input"
            if not name or name == "NC" or not os.path.exists(power):
                continue
            channels.append(Channel(name, (Attribute(power),), 1000))  # mW
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
                files = (Attribute(volts), Attribute(amps))
                channels.append(Channel(label, files, 1_000_000))  # mV x mA
        elif chip == "ina238" and os.path.exists(f"{device}/power1_input"):
            label = _read_text(f"{device}/power1_label") or _read_text(f"{device}/label") or "VIN"
            path = f"{device}/power1_input"
            channels.append(Channel(label, (Attribute(path),), 1_000_000))  # uW
    return channels


def update_period_s(sysfs: str) -> float | None:
    """How often the monitors convert anew: the longest hwmon ``update_interval``
    (ms; the INA3221's conversion time x averaging x channels), where the driver shows it."""
    periods = []
    for device in glob.glob(f"{sysfs}/class/hwmon/hwmon*"):
        if _read_text(f"{device}/name") in ("ina3221", "ina238"):
            text = _read_text(f"{device}/update_interval")
            if text is not None and text.isdigit() and int(text) > 0:
                periods.append(int(text) / 1000)
    return max(periods) if periods else None


class Ina3221Source(PullSource):
    """Rails of every INA3221/INA238 channel; the board total as tegrastats computes it."""

    name = "ina3221"
    board = True  # measures the whole board: the host total comes from here

    def __init__(self, channels: list[Channel], period_s: float | None = None) -> None:
        self.channels = channels
        self.period_s = period_s
        self._ids = {c.name: f"ina3221:{c.name}" for c in channels}
        self._types = {c.name: rail_type(c.name) for c in channels}
        # The channels the board total is made of: its input rail where measured, else
        # all (AGX Xavier, AGX Orin). The stream reads these alone.
        names = [c.name for c in channels]
        board = next((n for n in BOARD_INPUT_RAILS if n in names), None)
        self._total = [c for c in channels if board is None or c.name == board]

    def read(self) -> PowerReading:
        watts = {c.name: c.watts() for c in self.channels}
        return PowerReading(
            source=self.name,
            monotonic=time.monotonic(),
            rails=tuple(
                Rail(id=self._ids[name], name=name, type=self._types[name], power_w=w)
                for name, w in watts.items()
            ),
            total_w=board_total(watts),
        )

    def read_total(self) -> tuple[float, float] | None:
        """(monotonic, W) of the board total alone: the stream's reading, a few preads."""
        t = time.monotonic()
        watts = self.total_from(tuple(a.value() for c in self._total for a in c.files))
        return None if watts is None else (t, watts)

    def stream_fds(self) -> tuple[int, ...]:
        """The board total's files, for the native reader (power/native.py)."""
        return tuple(a.fd for c in self._total for a in c.files)

    def total_from(self, values: tuple[int, ...]) -> float | None:
        """The board total from the raw values of stream_fds, in their order."""
        watts, at = {}, 0
        for channel in self._total:
            n = len(channel.files)
            watts[channel.name] = channel.watts_of(values[at : at + n])
            at += n
        return board_total(watts)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def discover(options: PowerOptions) -> Ina3221Source:
    try:
        channels = iio_channels(options.sysfs_path) + hwmon_channels(options.sysfs_path)
    except OSError as exc:
        raise NoData(f"INA3221 monitors found but unreadable: {exc}") from exc
    if not channels:
        raise NoData(f"no INA3221/INA238 power monitor under {options.sysfs_path}")
    source = Ina3221Source(channels, update_period_s(options.sysfs_path))
    try:
        source.read()
    except (OSError, ValueError) as exc:
        source.close()
        raise NoData(f"INA3221 monitors found but unreadable: {exc}") from exc
    return source
