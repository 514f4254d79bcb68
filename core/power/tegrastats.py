"""tegrastats: the parser for one output line, and the long-running reader.

Every token is optional and recognised by its shape, never by its position (field
notes): fields come and go with root/non-root, board and engine activity, and a rail
name can collide with other tokens (AGX Xavier prints ``GPU 463/463`` beside
``GPU@30C``). Power values are milliwatts inside this module only: the sample holds
watts.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from edgewatt.core.power.source import (
    Gpu,
    NoData,
    PowerOptions,
    PowerReading,
    Rail,
    board_total,
    rail_type,
)

log = logging.getLogger(__name__)

SENSOR_OFF_C = -256.0

_TIMESTAMP = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\b")
_USED_TOTAL_MB = re.compile(r"^(\d+)/(\d+)MB$")
_RAIL_VALUE = re.compile(r"^(\d+)(?:mW)?/(\d+)(?:mW)?(?:/(\d+)(?:mW)?)?$")
_RAIL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_TEMPERATURE = re.compile(r"^([A-Za-z][\w]*)@(-?\d+(?:\.\d+)?)C(?:/-?\d+(?:\.\d+)?C)?$")
_PERCENT_AT = re.compile(r"^(\d+(?:\.\d+)?)%(?:@\[?(\d+)(?:,\d+)*\]?)?$")
_CPU_LIST = re.compile(r"^\[([^\]]*)\](?:@(\d+))?$")


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
        if core is None:
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
        elif token in ("GR3D_FREQ", "GR3D", "EMC_FREQ", "EMC") and (m := _PERCENT_AT.match(nxt)):
            key = "gpu" if token.startswith("GR3D") else "emc"
            values[f"{key}_percent"] = float(m[1])
            values[f"{key}_freq_mhz"] = int(m[2]) if m[2] else None
        elif _RAIL_NAME.match(token) and (m := _RAIL_VALUE.match(nxt)):
            if token != "NC":  # unconnected channel
                values["rails_w"][token] = int(m[1]) / 1000.0
        elif m := _TEMPERATURE.match(token):
            celsius = float(m[2])
            if celsius != SENSOR_OFF_C:
                values["temperatures_c"][m[1]] = celsius
            recognised += 1
            i += 1
            continue
        else:
            i += 1  # unknown token: tolerated
            continue
        recognised += 1
        i += 2
    if not recognised:
        raise ValueError(f"not a tegrastats line: {line[:80]!r}")
    return TegrastatsSample(**values)


@dataclass(frozen=True)
class TimedSample:
    monotonic: float  # when the line arrived
    sample: TegrastatsSample


class TegrastatsReader:
    """One long-running ``tegrastats --interval MS`` child, its lines read as they come.

    The child is restarted with exponential backoff when it dies and terminated (this
    child only) on close. ``tegrastats --stop`` is never used: it kills every instance
    on the system, other users' included.
    """

    def __init__(self, path: str, interval_s: float, *, max_backoff_s: float = 30.0) -> None:
        self.path = path
        self.interval_ms = max(1, round(interval_s * 1000))
        self.max_backoff_s = max_backoff_s
        self.latest: TimedSample | None = None
        self.restarts = 0
        self.bad_lines = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="tegrastats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._proc = subprocess.Popen(
                    [self.path, "--interval", str(self.interval_ms)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    bufsize=1,
                )
            except OSError as exc:
                log.warning("cannot start %s: %s", self.path, exc)
            else:
                self._read(self._proc)
                code = self._proc.wait()
                if self._stop.is_set():
                    return
                log.warning("%s exited with status %s; restarting", self.path, code)
            if time.monotonic() - started > 10 * backoff:
                backoff = 0.5  # it ran for a good while: not a crash loop
            self.restarts += 1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                sample = parse_line(line)
            except ValueError:
                self.bad_lines += 1
                if self.bad_lines == 1:
                    log.warning("ignoring output that is not tegrastats: %r", line[:80])
                continue
            self.latest = TimedSample(time.monotonic(), sample)

    def close(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._thread.join(timeout=3)


class TegrastatsSource:
    """Power rails, GPU load and temperatures from a running tegrastats."""

    name = "tegrastats"
    board = True  # measures the whole board: the host total comes from here

    def __init__(self, reader: TegrastatsReader) -> None:
        self._reader = reader

    def read(self) -> PowerReading | None:
        latest = self._reader.latest
        if latest is None:
            return None
        s = latest.sample
        rails = tuple(
            Rail(id=f"tegrastats:{name}", name=name, type=rail_type(name), power_w=watts)
            for name, watts in s.rails_w.items()
        )
        gpus: tuple[Gpu, ...] = ()
        if s.gpu_percent is not None:
            gpus = (Gpu(id="tegrastats:GR3D", name="GR3D", utilization=s.gpu_percent / 100),)
        return PowerReading(
            source=self.name,
            monotonic=latest.monotonic,
            rails=rails,
            total_w=s.total_w,
            gpus=gpus,
            temperatures_c=s.temperatures_c,
        )

    def close(self) -> None:
        self._reader.close()


def discover(options: PowerOptions) -> TegrastatsSource:
    path = options.tegrastats_path
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise NoData(f"no tegrastats executable at {path}")
    reader = TegrastatsReader(path, options.interval_s)
    reader.start()
    return TegrastatsSource(reader)
