"""Apple's powermetrics (macOS): the parsers for one sample, and the long-running reader.

One child for the process's lifetime (child.py), never one per sample:

- Apple silicon: ``powermetrics --samplers cpu_power,gpu_power,ane_power -i MS -f plist``,
  a plist document per sample: CPU, GPU and ANE power and their combined power (mW),
  the GPU's idle ratio.
- Intel Macs: ``powermetrics --samplers cpu_power -i MS -f text``: the package's power
  ("Intel energy model derived package power (CPUs+GT+SA): 8.53W").

Each is the format in which real captures of such Macs show the figures
(tests/fixtures/powermetrics/, sources named there). A sample is the average over its
own elapsed interval (energy from Apple's energy model, not one instantaneous
reading), so the power reader gets a counter: each sample's power times its interval,
added up per rail. The combined power is the SoC's, not the whole Mac's (display,
storage and the rest are outside it).

powermetrics needs root: edgewatt runs it directly as root, or through ``sudo -n``
where the sudoers allow it without a password. Otherwise one warning says how to
allow it, and there are no power figures: none is made up. Milliwatts stay inside
this module.
"""

from __future__ import annotations

import getpass
import logging
import os
import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from edgewatt.core.power.child import ChildReader, ChildSource, Timed, bounded_lines
from edgewatt.core.power.source import Gpu, NoData, PowerOptions, PowerReading, Rail, rail_type
from edgewatt.core.text import shown

log = logging.getLogger(__name__)

# A sample with the power samplers alone is about 56 KB on a 16-core M4 (its clusters'
# frequency tables); text samples are a few KB. Anything longer is not one sample.
MAX_DOCUMENT_BYTES = 1 << 20
MAX_MW = 10**7  # 10 kW: far above any Mac
# powermetrics' own floor for this reader: each sample is the energy over its whole
# interval, so a longer interval loses no joule, only time resolution within it.
MIN_INTERVAL_MS = 100

# Apple silicon's rails, in plist keys (mW; or mJ over the interval) and as named here.
_RAILS = (("CPU", "cpu"), ("GPU", "gpu"), ("ANE", "ane"), ("DRAM", "dram"))
_NUMBER = rb"-?[0-9]{1,15}(?:\.[0-9]{1,15})?(?:[eE][-+]?[0-9]{1,3})?"
# The processor's keys this source reads, and the two elsewhere: matched by name, so the
# scan passes over the clusters' frequency tables (most of a sample) without stopping.
_PROCESSOR_KEYS = (
    *(f"{key}_{kind}" for _, key in _RAILS for kind in ("power", "energy")),
    "combined_power",
    "package_watts",
    "package_joules",
)


def _scalars(*keys: str) -> re.Pattern[bytes]:
    names = b"|".join(key.encode() for key in keys)
    return re.compile(
        rb"<key>(" + names + rb")</key>\s{0,64}<(real|integer)>(" + _NUMBER + rb")</\2>"
    )


_PROCESSOR = _scalars(*_PROCESSOR_KEYS)
_ELAPSED_NS = _scalars("elapsed_ns")
_IDLE_RATIO = _scalars("idle_ratio")
_TEXT_NUMBER = r"([0-9]{1,12}(?:\.[0-9]{1,9})?)"
_TEXT_RAIL = re.compile(rf"^(CPU|GPU|ANE|DRAM) Power: +{_TEXT_NUMBER} ?(mW|W)\s*$", re.M)
_TEXT_TOTAL = re.compile(
    r"^(Combined Power \(CPU \+ GPU \+ ANE\)|Package Power"
    rf"|Intel energy model derived package power \(CPUs\+GT\+SA\)): +{_TEXT_NUMBER} ?(mW|W)\s*$",
    re.M,
)
_TEXT_HEADER = re.compile(rb"^\*\*\* Sampled system activity ")
_TEXT_ELAPSED = re.compile(r"\(([0-9]{1,9}(?:\.[0-9]{1,6})?)ms elapsed\) \*\*\*")


@dataclass(frozen=True)
class PowermetricsSample:
    # CPU, GPU, ANE, DRAM (Apple silicon); package (Intel): each the interval's average
    rails_w: dict[str, float] = field(default_factory=dict)
    total_w: float | None = None  # combined (Apple silicon) or package (Intel) power
    elapsed_s: float | None = None  # the interval the sample covers
    gpu_busy: float | None = None  # 0..1: 1 - the GPU's idle ratio (Apple silicon's plist)


def _watts(mw: float, what: str) -> float:
    if not 0 <= mw <= MAX_MW:
        raise ValueError(f"{what} of {mw:g} mW is not a power")
    return mw / 1000.0


def _first_scalars(
    pattern: re.Pattern[bytes], document: bytes, start: int, end: int
) -> dict[str, float]:
    """Each of ``pattern``'s keys' first number in ``document[start:end]``: a targeted
    scan, not a plist parse (benchmarks/powermetrics_parse.py: 0.13 ms per sample on
    this VM, a fiftieth of plistlib's)."""
    found: dict[str, float] = {}
    for match in pattern.finditer(document, start, end):
        key = match.group(1).decode()
        if key not in found:
            found[key] = float(match.group(3))
    return found


def parse_plist(document: bytes) -> PowermetricsSample:
    """One plist document of ``powermetrics -f plist``; ValueError for anything else.

    Read: ``elapsed_ns``; in ``processor``, ``{cpu,gpu,ane,dram}_power`` (mW) or else
    ``..._energy`` (mJ over the interval), ``combined_power`` (mW), and on Intel
    ``package_watts`` (W) or ``package_joules`` (J over the interval); in ``gpu``,
    ``idle_ratio``. The processor's keys are read between ``<key>processor</key>`` and
    ``<key>gpu</key>`` (the gpu dictionary repeats ``gpu_energy``).
    """
    body = document.strip(b"\0\r\n\t ")
    if not body.startswith((b"<?xml", b"<plist")) or not body.endswith(b"</plist>"):
        raise ValueError(f"not a plist document: {shown(body[:60].decode('utf-8', 'replace'))}")
    processor = body.find(b"<key>processor</key>")
    if processor < 0:
        raise ValueError("a plist without a processor dictionary: no cpu_power sampler")
    gpu = body.find(b"<key>gpu</key>", processor)
    values = _first_scalars(_PROCESSOR, body, processor, gpu if gpu >= 0 else len(body))
    elapsed_ns = _first_scalars(_ELAPSED_NS, body, 0, processor).get("elapsed_ns")
    elapsed = elapsed_ns / 1e9 if elapsed_ns is not None and 0 < elapsed_ns < 1e13 else None
    rails: dict[str, float] = {}
    for rail, key in _RAILS:
        mw = values.get(f"{key}_power")
        if mw is None and elapsed is not None and f"{key}_energy" in values:
            mw = values[f"{key}_energy"] / elapsed  # mJ per s
        if mw is not None:
            rails[rail] = _watts(mw, f"{rail} power")
    total = None
    if "combined_power" in values:
        total = _watts(values["combined_power"], "combined power")
    elif "package_watts" in values or ("package_joules" in values and elapsed is not None):
        watts = values.get("package_watts")
        if watts is None:
            watts = values["package_joules"] / elapsed  # type: ignore[operator]
        total = rails["package"] = _watts(watts * 1000, "package power")
    if not rails and total is None:
        raise ValueError("a plist without power figures")
    busy = None
    if gpu >= 0:
        idle = _first_scalars(_IDLE_RATIO, body, gpu, len(body)).get("idle_ratio")
        if idle is not None and 0 <= idle <= 1:
            busy = 1.0 - idle
    return PowermetricsSample(rails, total, elapsed, busy)


def parse_text(block: str) -> PowermetricsSample:
    """One sample of ``powermetrics -f text``, from its ``*** Sampled system activity``
    header on; ValueError for anything else. Read: the elapsed time in the header,
    ``CPU/GPU/ANE/DRAM Power: N mW`` (the first of each: the GPU section repeats the GPU's), and
    the total: ``Combined Power (CPU + GPU + ANE)``, ``Package Power`` (M1 on macOS 12)
    or Intel's ``Intel energy model derived package power (CPUs+GT+SA): N W``."""
    elapsed = None
    if header := _TEXT_ELAPSED.search(block[:300]):
        elapsed = float(header.group(1)) / 1000 or None
    rails: dict[str, float] = {}
    for match in _TEXT_RAIL.finditer(block):
        name, value, unit = match.groups()
        if name not in rails:
            rails[name] = _watts(float(value) * (1000 if unit == "W" else 1), f"{name} power")
    total = None
    if match := _TEXT_TOTAL.search(block):
        name, value, unit = match.groups()
        total = _watts(float(value) * (1000 if unit == "W" else 1), "total power")
        if name.startswith("Intel"):
            rails["package"] = total
    if total is None:
        raise ValueError(f"not a powermetrics power sample: {shown(block[:80])}")
    return PowermetricsSample(rails, total, elapsed)


def plist_documents(stream: BinaryIO, limit: int = MAX_DOCUMENT_BYTES) -> Iterator[bytes | None]:
    """The plist documents of ``stream``, each as soon as its ``</plist>`` arrives
    (the NUL between two documents may come before or after it); None for one longer
    than ``limit``, skipped to its end."""
    parts: list[bytes] = []
    size = 0
    oversized = False
    for line in bounded_lines(stream, limit):
        if line is None or size + len(line) > limit:
            parts, size, oversized = [], 0, True
            continue
        if not oversized:
            parts.append(line)
            size += len(line)
        if b"</plist>" in line:
            yield None if oversized else b"".join(parts)
            parts, size, oversized = [], 0, False


def text_samples(stream: BinaryIO, limit: int = MAX_DOCUMENT_BYTES) -> Iterator[bytes | None]:
    """The samples of ``powermetrics -f text``: each from its header to its total's
    line (the last power figure it prints), handed over at that line, not at the next
    header an interval later. The preamble (machine model, boot time) and the lines
    after a total are not samples."""
    parts: list[bytes] | None = None
    size = 0
    for line in bounded_lines(stream, limit):
        if line is not None and _TEXT_HEADER.match(line):
            parts, size = [line], len(line)
        elif parts is None:
            continue
        elif line is None or size + len(line) > limit:
            parts = None
            yield None
        else:
            parts.append(line)
            size += len(line)
            if _TEXT_TOTAL.match(line.decode("utf-8", "replace")):
                yield b"".join(parts)
                parts = None


@dataclass(frozen=True)
class Counted:
    """A sample and the energy counters up to it: each sample's power times its own
    interval, added up since the reader started (J)."""

    sample: PowermetricsSample
    rails_j: dict[str, float]
    total_j: float | None


def _parse_text_frame(frame: bytes) -> PowermetricsSample:
    return parse_text(frame.decode("utf-8", "replace"))


class _Counter:
    """Each sample's power times its interval, added up. The interval is the one the
    sample reports, but never more than the real time since the previous sample came
    (plus two intervals for a late or early arrival): one malformed ``elapsed_ns`` must
    not add days of energy. ``clock`` is a seam for the tests."""

    def __init__(
        self,
        parse: Callable[[bytes], PowermetricsSample],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._parse = parse
        self._interval_s = interval_s
        self._clock = clock
        self._last: float | None = None  # when the previous sample came (monotonic)
        self._rails_j: dict[str, float] = {}
        self._total_j = 0.0

    def __call__(self, frame: bytes) -> Counted:
        sample = self._parse(frame)
        now = self._clock()
        since = 0.0 if self._last is None else now - self._last
        self._last = now
        elapsed = min(sample.elapsed_s or self._interval_s, since + 2 * self._interval_s)
        for name, watts in sample.rails_w.items():
            self._rails_j[name] = self._rails_j.get(name, 0.0) + watts * elapsed
        total = None
        if sample.total_w is not None:
            self._total_j += sample.total_w * elapsed
            total = self._total_j
        return Counted(sample, dict(self._rails_j), total)


def apple_silicon() -> bool:
    """An arm64 Mac, also where this Python runs under Rosetta (its kernel is ARM64)."""
    return platform.machine() == "arm64" or "ARM64" in os.uname().version


def command(path: str, interval_ms: int, plist: bool, sudo: list[str]) -> list[str]:
    samplers = "cpu_power,gpu_power,ane_power" if plist else "cpu_power"
    fmt = "plist" if plist else "text"
    # -b 1: line-buffered, so a sample arrives when it is printed, not a buffer later.
    return [*sudo, path, "--samplers", samplers, "-i", str(interval_ms), "-f", fmt, "-b", "1"]


class PowermetricsReader(ChildReader[Counted]):
    def __init__(
        self,
        path: str,
        interval_s: float,
        *,
        plist: bool,
        sudo: list[str] | None = None,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.interval_ms = max(MIN_INTERVAL_MS, round(interval_s * 1000))
        super().__init__(
            "powermetrics",
            command(path, self.interval_ms, plist, sudo or []),
            plist_documents if plist else text_samples,
            _Counter(parse_plist if plist else _parse_text_frame, self.interval_ms / 1000),
            max_backoff_s=max_backoff_s,
        )


def _reading(timed: Timed[Counted]) -> PowerReading:
    counted = timed.sample
    sample = counted.sample
    rails = tuple(
        Rail(
            id=f"powermetrics:{name}",
            name=name,
            type="cpu" if name == "package" else rail_type(name),
            power_w=watts,
            energy_j=counted.rails_j[name],
        )
        for name, watts in sample.rails_w.items()
    )
    gpus: tuple[Gpu, ...] = ()
    if sample.gpu_busy is not None:
        gpus = (
            Gpu(
                id="powermetrics:GPU",
                name="GPU",
                utilization=sample.gpu_busy,
                power_w=sample.rails_w.get("GPU"),
            ),
        )
    return PowerReading(
        source="powermetrics",
        monotonic=timed.monotonic,
        rails=rails,
        total_w=sample.total_w,
        total_energy_j=counted.total_j,
        gpus=gpus,
    )


class PowermetricsSource(ChildSource[Counted]):
    """The SoC's power rails and GPU load from a running powermetrics."""

    def __init__(self, reader: PowermetricsReader) -> None:
        super().__init__("powermetrics", reader, reader.interval_ms / 1000, _reading)


ALLOW_HINT = (
    "powermetrics needs root, so this run has no power figures: run as root, or let "
    "{user} run it without a password: echo '{user} ALL=(root) NOPASSWD: {path}' "
    "| sudo tee /etc/sudoers.d/edgewatt-powermetrics"
)


def sudo_prefix(path: str) -> list[str]:
    """What runs ``path`` as root: nothing as root, ``sudo -n`` where the sudoers allow
    it without a password; NoData (and the one warning saying how) otherwise."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    allowed = False
    if sudo is not None:
        try:
            check = subprocess.run(
                [sudo, "-n", "-l", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
            allowed = check.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            allowed = False
    if not allowed:
        log.warning("edgewatt: " + ALLOW_HINT.format(user=getpass.getuser(), path=path))
        raise NoData("powermetrics needs root and sudo -n does not allow it")
    return [sudo, "-n"]  # type: ignore[list-item]


def discover(options: PowerOptions) -> PowermetricsSource:
    path = options.powermetrics_path
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise NoData(f"no powermetrics executable at {path}")
    reader = PowermetricsReader(
        path, 1.0 / options.push_hz, plist=apple_silicon(), sudo=sudo_prefix(path)
    )
    reader.start()
    return PowermetricsSource(reader)
