"""Raspberry Pi 5: the PMIC's rails, read with ``vcgencmd pmic_read_adc``.

The output (real captures in tests/fixtures/pi5/) is one line per ADC channel, the
name right-aligned to 12 columns: ``  VDD_CORE_A current(7)=6.22421000A`` and
``  VDD_CORE_V volt(15)=0.86173300V``. Twelve rails have both; EXT5V (the 5 V input)
and BATT (the RTC battery) a voltage only. A rail's power is its V x I, paired by
name (the channel numbers of a rail's two lines differ); the board's power is their
sum (the PMIC's outputs, not the 5 V input, which has no current channel).

vcgencmd prints once and exits: there is no long-running child to read, so a thread
spawns it once per reading. Each spawn costs CPU (fork and exec, the child's own), so
the rate is chosen from that cost, measured per reading as the thread's CPU plus the
child's (wait4's rusage), within the power reader's budget (rate.py, source.py). The
firmware itself takes about 23 ms per reading whatever calls it (Zeus measured the
mailbox ioctl at 22.6 ms, the spawn at 23.9 ms, on a Pi 5): that is wall time, not
this device's CPU, and it bounds the rate at about 40 Hz.

vcgencmd talks to the firmware through ``/dev/vcio``, ``root:video`` 0660: the
daemon's user needs the video group (``edgewatt doctor`` says so on a Pi 5).
"""

from __future__ import annotations

import logging
import math
import os
import re
import select
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field

from edgewatt.core.power.child import Arrivals, Timed
from edgewatt.core.power.rate import CALIBRATION_S, auto_rate
from edgewatt.core.power.source import (
    AUTO_BUDGET,
    NoData,
    PowerOptions,
    PowerReading,
    Rail,
    rail_type,
)
from edgewatt.core.text import shown

log = logging.getLogger(__name__)

VCIO = "/dev/vcio"
# The board models with this PMIC and vcgencmd's pmic_read_adc, as the device tree
# names them ("Raspberry Pi 5 Model B Rev 1.0", the Compute Module 5, the Pi 500).
_MODEL = re.compile(r"^Raspberry Pi (?:5\b|500\b|Compute Module 5\b)")

# Bounds far above the 26 lines of ~40 bytes a Pi 5 prints: a broken or hostile
# vcgencmd cannot grow the daemon or its series past them.
MAX_OUTPUT_BYTES = 8192
MAX_LINE_CHARS = 128
MAX_RAILS = 64
# Physical ranges: the Pi 5's supply is 5 V (USB PD up to 48 V would be the most any
# input could be) and its largest rail, VDD_CORE, draws a few amperes.
MAX_VOLTS = 60.0
MAX_AMPS = 100.0
# A reading's spawn is given this long: the firmware answers in ~23 ms, and a busy
# machine may delay the child's start by a second or more.
TIMEOUT_S = 5.0

# The rates the reading thread chooses from (Hz): below the stream's AUTO_RATES_HZ,
# since a spawn costs milliseconds where a sysfs read costs microseconds. One a
# second at least, even over the budget: the daemon's passes are a second apart by
# default and a source silent longer than max_gap_s drops out.
RATES_HZ = (1.0, 2.0, 5.0, 10.0, 20.0)

_LINE = re.compile(
    r"^ {0,32}([A-Za-z0-9][A-Za-z0-9_]{0,31})_([AV]) (current|volt)\((\d{1,3})\)"
    r"=(\d{1,4}(?:\.\d{1,12})?)([AV])$"
)
_KIND = {"A": ("current", "A"), "V": ("volt", "V")}


@dataclass(frozen=True)
class PmicSample:
    amps: dict[str, float] = field(default_factory=dict)  # by rail name, without _A
    volts: dict[str, float] = field(default_factory=dict)  # by rail name, without _V

    @property
    def rails_w(self) -> dict[str, float]:
        """V x I of each rail with both, in the order printed."""
        return {name: a * self.volts[name] for name, a in self.amps.items()}

    @property
    def total_w(self) -> float:
        """The board's power: the sum of the rails'."""
        return math.fsum(self.rails_w.values())


def parse_output(text: str) -> PmicSample:
    """One run's output; ValueError, naming the line, for anything that is not
    ``pmic_read_adc``'s (a firmware error such as ``error=2 error_msg=...`` included), a
    value outside its physical range, a rail printed twice, or a current without its
    voltage (its power would be missing from the board's: no figure rather than a low
    one)."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line:
            continue
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"line {number}: over {MAX_LINE_CHARS} characters")
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"line {number}: not a pmic_read_adc line: {shown(line.strip())}")
        name, suffix, kind, _, value, unit = match.groups()
        if (kind, unit) != _KIND[suffix]:
            raise ValueError(f"line {number}: {name}_{suffix} with a {kind} in {unit}")
        figure, limit = float(value), MAX_AMPS if suffix == "A" else MAX_VOLTS
        if figure > limit:
            raise ValueError(f"line {number}: {name} {figure:g} {unit} is over {limit:g} {unit}")
        found = amps if suffix == "A" else volts
        if name in found:
            raise ValueError(f"line {number}: {name}_{suffix} printed twice")
        if len(found) >= MAX_RAILS:
            raise ValueError(f"over {MAX_RAILS} rails")
        found[name] = figure
    if not amps:
        raise ValueError("no rail with a current: not pmic_read_adc's output")
    unpaired = [name for name in amps if name not in volts]
    if unpaired:
        raise ValueError(f"a current without its voltage: {', '.join(unpaired)}")
    return PmicSample(amps, volts)


def board_model(sysfs_path: str) -> str | None:
    """The device tree's model (NUL-terminated there), where it is a Pi with this PMIC."""
    try:
        with open(f"{sysfs_path}/firmware/devicetree/base/model", "rb") as f:
            model = f.read(256).split(b"\0")[0].decode("utf-8", "replace").strip()
    except OSError:
        return None
    return model if _MODEL.match(model) else None


def vcio_problem() -> str | None:
    """Why this process cannot use the firmware's mailbox, or None where it can."""
    if not os.path.exists(VCIO):
        return f"there is no {VCIO} (in a container, pass the device: --device {VCIO})"
    if not os.access(VCIO, os.R_OK | os.W_OK):
        return f"uid {os.getuid()} cannot open {VCIO} (root:video 0660)"
    return None


@dataclass(frozen=True)
class Run:
    """One spawn's output and what it cost: the reading thread's CPU and the child's."""

    output: bytes
    status: int  # the exit code; -N: killed by signal N
    cpu_s: float


class _Stopped(Exception):
    pass


def _run_once(path: str, stop: threading.Event, running: list[int]) -> Run:
    """``path pmic_read_adc``, its stdout and stderr read together (vcgencmd's error
    goes to the message) up to MAX_OUTPUT_BYTES, within TIMEOUT_S. The child is killed
    and reaped by this thread alone, so no other thread can signal a reused pid;
    ``running`` holds its pid meanwhile (edgewatt run tells it from the command's)."""
    started, cpu = time.monotonic(), time.thread_time()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.posix_spawn(
            path,
            [path, "pmic_read_adc"],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write_fd, 1),
                (os.POSIX_SPAWN_DUP2, write_fd, 2),
            ],
        )
    except OSError:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    running.append(pid)
    chunks: list[bytes] = []
    size, problem = 0, ""
    try:
        while True:
            left = started + TIMEOUT_S - time.monotonic()
            if stop.is_set():
                problem = "stopped"
                break
            if left <= 0:
                problem = f"no output end within {TIMEOUT_S:g} s"
                break
            # In slices: a close() is seen within 0.1 s.
            if not select.select([read_fd], [], [], min(left, 0.1))[0]:
                continue
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_OUTPUT_BYTES:
                problem = f"output over {MAX_OUTPUT_BYTES} bytes"
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if problem:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        running.remove(pid)
    if problem == "stopped":
        raise _Stopped
    if problem:
        raise ValueError(problem)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    cost = time.thread_time() - cpu + usage.ru_utime + usage.ru_stime
    return Run(b"".join(chunks), code, cost)


def read_once(
    path: str, stop: threading.Event | None = None, running: list[int] | None = None
) -> tuple[PmicSample, float]:
    """One reading and its CPU cost (s); ValueError or OSError with the reason."""
    run = _run_once(path, stop or threading.Event(), [] if running is None else running)
    text = run.output.decode("utf-8", "replace")
    if run.status != 0:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        raise ValueError(f"{path} pmic_read_adc exited with status {run.status}: {shown(first)}")
    return parse_output(text), run.cpu_s


class VcgencmdReader(Arrivals[PmicSample]):
    """One thread running ``vcgencmd pmic_read_adc`` at the rate its own measured cost
    allows (``fixed_hz``: at that rate instead), keeping the readings for the power
    reader's takes. A failing run is logged once, retried with backoff, and the
    recovery logged."""

    def __init__(self, path: str, fixed_hz: float | None, first_cost_s: float) -> None:
        self.path = path
        self.fixed_hz = fixed_hz
        self.hz = fixed_hz or auto_rate(first_cost_s, AUTO_BUDGET, RATES_HZ)
        self.cost_s = first_cost_s  # CPU per reading, the mean of the last window
        super().__init__()
        self.running: list[int] = []  # the child now, while a reading runs
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgewatt-pi5", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        due = time.monotonic()
        window_cpu, window_n, window_start = 0.0, 0, due
        while not self._stop.is_set():
            try:
                sample, cost = read_once(self.path, self._stop, self.running)
            except _Stopped:
                return
            except (OSError, ValueError) as exc:
                self.failures += 1
                if self.failures == 1:
                    log.warning("power source pi5: %s; retrying", exc)
                self._stop.wait(min(30.0, 2.0 ** min(self.failures, 5)))
                due = time.monotonic()
                continue
            if self.failures:
                log.info("power source pi5 is back after %d failed readings", self.failures)
                self.failures = 0
            timed = self.arrive(sample)
            window_cpu, window_n = window_cpu + cost, window_n + 1
            if timed.monotonic - window_start >= CALIBRATION_S:
                self._calibrate(window_cpu / window_n)
                window_cpu, window_n, window_start = 0.0, 0, timed.monotonic
            period = 1.0 / self.hz
            due += period
            late = time.monotonic() - due
            if late > period:  # a busy machine: missed readings are skipped, not burst
                due += late // period * period
            self._stop.wait(max(0.0, due - time.monotonic()))

    def _calibrate(self, cost_s: float) -> None:
        self.cost_s = cost_s
        if self.fixed_hz is not None:
            return
        hz = auto_rate(cost_s, AUTO_BUDGET, RATES_HZ)
        if hz != self.hz:
            log.info("power source pi5: %s", rate_line(hz, cost_s))
            self.hz = hz

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=TIMEOUT_S + 1)


def rate_line(hz: float, cost_s: float) -> str:
    return (
        f"{hz:g} Hz ({cost_s * 1e3:.1f} ms of CPU a reading, spawn included: "
        f"{hz * cost_s * 100:.2f} % of one core; the budget is {AUTO_BUDGET * 100:g} %)"
    )


def _reading(timed: Timed[PmicSample]) -> PowerReading:
    rails = timed.sample.rails_w
    return PowerReading(
        source="pi5",
        monotonic=timed.monotonic,
        rails=tuple(
            Rail(id=f"pi5:{name}", name=name, type=rail_type(name), power_w=watts)
            for name, watts in rails.items()
        ),
        total_w=timed.sample.total_w,
    )


class Pi5Source:
    """The PMIC's rails and the board's power, pushed by the reading thread."""

    name = "pi5"
    board = True  # the board's power: the host total comes from here
    pushed = True

    def __init__(self, reader: VcgencmdReader) -> None:
        self._reader = reader

    @property
    def period_s(self) -> float:
        return 1.0 / self._reader.hz

    def read(self) -> PowerReading | None:
        latest = self._reader.latest
        return None if latest is None else _reading(latest)

    def read_total(self) -> tuple[float, float] | None:
        return None  # it reads on its own

    def arrived(self) -> list[PowerReading]:
        return [_reading(timed) for timed in self._reader.take()]

    def wait_newer(self, after: float, timeout_s: float) -> None:
        self._reader.wait_newer(after, timeout_s)

    def child_pid(self) -> int | None:
        return (self._reader.running[:1] or [None])[0]  # one slice: the thread may clear it

    def close(self) -> None:
        self._reader.close()


def discover(options: PowerOptions) -> Pi5Source:
    path = shutil.which("vcgencmd")
    if path is None:
        raise NoData("no vcgencmd on PATH")
    try:
        _, cost = read_once(path)  # the first reading's cost sets the first rate
    except (OSError, ValueError) as exc:
        raise NoData(f"vcgencmd pmic_read_adc gives no PMIC rails: {exc}") from exc
    reader = VcgencmdReader(path, options.sample_hz, cost)
    log.info("power source pi5: %s", rate_line(reader.hz, cost))
    reader.start()
    return Pi5Source(reader)
