"""tegrastats: the parser for one output line, and the long-running reader.

Every token is optional and recognised by its shape, never by its position (field
notes): fields come and go with root/non-root, board and engine activity, and a rail
name can collide with other tokens (AGX Xavier prints ``GPU 463/463`` beside
``GPU@30C``). Power values are milliwatts inside this module only: the sample holds
watts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime

from edgewatt.core.power.child import ChildReader, ChildSource, Timed, bounded_lines
from edgewatt.core.power.source import (
    Gpu,
    NoData,
    PowerOptions,
    PowerReading,
    Rail,
    board_total,
    rail_type,
)
from edgewatt.core.text import shown

SENSOR_OFF_C = -256.0

# Bounds on what one line may carry, far above any Jetson's (a dozen rails, a dozen
# thermal zones, lines of a few hundred bytes): a broken or hostile tegrastats cannot
# grow the daemon or its series past them.
MAX_LINE_BYTES = 4096
MAX_RAILS = 32
MAX_TEMPERATURES = 32
MAX_RAIL_MW = 10**7  # 10 kW
MIN_CELSIUS, MAX_CELSIUS = -273.15, 1000.0

# Every number is bounded in digits: a value of thousands of digits is not a
# tegrastats value, and int() or float() of it must not be attempted.
_TIMESTAMP = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\b")
_USED_TOTAL_MB = re.compile(r"^(\d{1,12})/(\d{1,12})MB$")
_MW = r"(\d{1,9})(?:mW)?"
_RAIL_VALUE = re.compile(rf"^{_MW}/{_MW}(?:/{_MW})?$")
_RAIL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_CELSIUS = r"-?\d{1,4}(?:\.\d{1,6})?"
_TEMPERATURE = re.compile(rf"^([A-Za-z]\w{{0,63}})@({_CELSIUS})C(?:/{_CELSIUS}C)?$")
_PERCENT_AT = re.compile(r"^(\d{1,3}(?:\.\d{1,6})?)%(?:@\[?(\d{1,7})(?:,\d{1,7})*\]?)?$")
_CPU_LIST = re.compile(r"^\[([^\]]*)\](?:@(\d{1,7}))?$")


@dataclass(frozen=True)
class TegrastatsSample:
    rails_w: dict[str, float] = field(default_factory=dict)  # instantaneous, NC dropped
    gpu_percent: float | None = None
    gpu_freq_mhz: int | None = None
    emc_percent: float | None = None
    emc_freq_mhz: int | None = None
    cpu_percent: list[float | None] = field(default_factory=list)  # None: core off
    cpu_freq_mhz: list[int | None] = field(default_factory=list)
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    temperatures_c: dict[str, float] = field(default_factory=dict)
    timestamp: datetime | None = None  # device local time, 1 s resolution

    @property
    def total_w(self) -> float | None:
        """The board input rail where printed, else the sum of the rails."""
        return board_total(self.rails_w)


def _cpu_list(token: str) -> tuple[list[float | None], list[int | None]] | None:
    match = _CPU_LIST.match(token)
    if match is None:
        return None
    shared_freq = int(match.group(2)) if match.group(2) else None  # old `[a%,b%]@f`
    percents: list[float | None] = []
    freqs: list[int | None] = []
    for entry in match.group(1).split(","):
        entry = entry.strip()
        if entry == "off":
            percents.append(None)
            freqs.append(None)
            continue
        core = _PERCENT_AT.match(entry)
        if core is None or float(core.group(1)) > 100:
            return None
        percents.append(float(core.group(1)))
        freqs.append(int(core.group(2)) if core.group(2) else shared_freq)
    return percents, freqs


def parse_line(line: str) -> TegrastatsSample:
    """Parse one tegrastats line; ValueError only for a line that is not tegrastats."""
    values: dict = {"rails_w": {}, "temperatures_c": {}}
    recognised = 0
    stamp = _TIMESTAMP.match(line)
    if stamp:
        values["timestamp"] = datetime.strptime(stamp.group(1), "%m-%d-%Y %H:%M:%S")
        line = line[stamp.end() :]
    tokens = line.split()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in ("RAM", "SWAP") and (m := _USED_TOTAL_MB.match(nxt)):
            key = token.lower()
            values[f"{key}_used_mb"], values[f"{key}_total_mb"] = int(m[1]), int(m[2])
        elif token in ("CPU", "cpu") and (cores := _cpu_list(nxt)) is not None:
            values["cpu_percent"], values["cpu_freq_mhz"] = cores
        elif (
            token in ("GR3D_FREQ", "GR3D", "EMC_FREQ", "EMC")
            and (m := _PERCENT_AT.match(nxt))
            and float(m[1]) <= 100
        ):
            key = "gpu" if token.startswith("GR3D") else "emc"
            values[f"{key}_percent"] = float(m[1])
            values[f"{key}_freq_mhz"] = int(m[2]) if m[2] else None
        elif _RAIL_NAME.match(token) and (m := _RAIL_VALUE.match(nxt)) and int(m[1]) <= MAX_RAIL_MW:
            rails = values["rails_w"]
            if token != "NC" and (token in rails or len(rails) < MAX_RAILS):  # NC: unconnected
                rails[token] = int(m[1]) / 1000.0
        elif (m := _TEMPERATURE.match(token)) and MIN_CELSIUS <= float(m[2]) <= MAX_CELSIUS:
            celsius, zones = float(m[2]), values["temperatures_c"]
            if celsius != SENSOR_OFF_C and (m[1] in zones or len(zones) < MAX_TEMPERATURES):
                zones[m[1]] = celsius
            recognised += 1
            i += 1
            continue
        else:
            i += 1  # unknown token: tolerated
            continue
        recognised += 1
        i += 2
    if not recognised:
        raise ValueError(f"not a tegrastats line: {shown(line)}")
    return TegrastatsSample(**values)


def _parse_frame(frame: bytes) -> TegrastatsSample:
    return parse_line(frame.decode("utf-8", "replace"))


class TegrastatsReader(ChildReader[TegrastatsSample]):
    """One long-running ``tegrastats --interval MS`` child, its lines read as they come
    (child.py: restarts, bounds). Lines are read as bytes, at most ``MAX_LINE_BYTES``
    each, and decoded with replacement. ``tegrastats --stop`` is never used: it kills
    every instance on the system, other users' included."""

    def __init__(self, path: str, interval_s: float, *, max_backoff_s: float = 30.0) -> None:
        self.interval_ms = max(1, round(interval_s * 1000))
        super().__init__(
            "tegrastats",
            [path, "--interval", str(self.interval_ms)],
            lambda stream: bounded_lines(stream, MAX_LINE_BYTES),
            _parse_frame,
            max_backoff_s=max_backoff_s,
        )


def _reading(latest: Timed[TegrastatsSample]) -> PowerReading:
    s = latest.sample
    rails = tuple(
        Rail(id=f"tegrastats:{name}", name=name, type=rail_type(name), power_w=watts)
        for name, watts in s.rails_w.items()
    )
    gpus: tuple[Gpu, ...] = ()
    if s.gpu_percent is not None:
        gpus = (
            Gpu(
                id="tegrastats:GR3D",
                name="GR3D",
                utilization=s.gpu_percent / 100,
                frequency_mhz=s.gpu_freq_mhz,
            ),
        )
    return PowerReading(
        source="tegrastats",
        monotonic=latest.monotonic,
        rails=rails,
        total_w=s.total_w,
        gpus=gpus,
        temperatures_c=s.temperatures_c,
    )


def discover(options: PowerOptions) -> TegrastatsSource:
    path = options.tegrastats_path
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise NoData(f"no tegrastats executable at {path}")
    # It prints at the power reader's rate: its lines are the power stream.
    reader = TegrastatsReader(path, 1.0 / options.push_hz)
    reader.start()
    return TegrastatsSource(reader)


class TegrastatsSource(ChildSource[TegrastatsSample]):
    """Power rails, GPU load and temperatures from a running tegrastats."""

    board = True  # measures the whole board: the host total comes from here

    def __init__(self, reader: TegrastatsReader) -> None:
        super().__init__("tegrastats", reader, reader.interval_ms / 1000, _reading)
