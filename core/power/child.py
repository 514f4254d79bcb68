"""A long-running child that prints readings on its own (tegrastats, powermetrics).

One child per source, started once and read as it prints: never one process per
sample. It is restarted with exponential backoff when it dies, or when its output
breaks the reader in any way (it is killed first), and terminated (this child only)
on close. Its output is cut into frames of bounded size (a line, a plist document): a
longer frame is read to its end in pieces and counted as bad, never held. A frame the
parser refuses is counted and skipped, with one log line for the first; a child that
prints nothing else for MAX_BAD_RUN frames in a row is restarted (a wedged child).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Callable, Generic, Iterator, Optional, TypeVar

from edgewatt.core.power.source import PowerReading

log = logging.getLogger(__name__)

T = TypeVar("T")

# Bad frames in a row after which the child is restarted: its output has gone wrong.
MAX_BAD_RUN = 20
# Frames kept for the power reader between two of its takes (every pass takes them):
# a minute at 100 Hz; older ones are dropped, and their time integrated as one.
MAX_PENDING = 6000

# Cuts a child's stdout into frames (None: a frame over the size bound, skipped).
# typing's generics: the alias is evaluated at run time, on Python 3.8 too.
Frames = Callable[[BinaryIO], Iterator[Optional[bytes]]]


@dataclass(frozen=True)
class Timed(Generic[T]):
    monotonic: float  # when the frame arrived
    sample: T


class Arrivals(Generic[T]):
    """What a reader's thread has read and the power reader not taken yet: the newest
    sample, and those not taken (at most MAX_PENDING, the oldest dropped), with a wait
    for one newer than an instant."""

    def __init__(self) -> None:
        self.latest: Timed[T] | None = None
        self._pending: deque[Timed[T]] = deque(maxlen=MAX_PENDING)
        self._arrived = threading.Condition()

    def arrive(self, sample: T) -> Timed[T]:
        """``sample`` read now: kept, and any waiter woken."""
        timed = Timed(time.monotonic(), sample)
        with self._arrived:
            self.latest = timed
            self._pending.append(timed)
            self._arrived.notify_all()
        return timed

    def take(self) -> list[Timed[T]]:
        """The samples not taken yet, oldest first."""
        with self._arrived:
            taken = list(self._pending)
            self._pending.clear()
        return taken

    def wait_newer(self, after: float, timeout_s: float) -> None:
        """Until a sample arrived later than ``after``, or ``timeout_s`` passed."""
        with self._arrived:
            self._arrived.wait_for(
                lambda: self.latest is not None and self.latest.monotonic > after, timeout_s
            )


def bounded_lines(stream: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """The lines of ``stream``, none held longer than ``limit`` bytes: a longer line
    is read to its end in pieces and given as None."""
    while line := stream.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


class ChildReader(Arrivals[T]):
    """``command`` run and read frame by frame; ``parse`` turns a frame into a sample
    (ValueError: not a sample)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        frames: Frames,
        parse: Callable[[bytes], T],
        *,
        max_backoff_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.name = name
        self.command = command
        self.max_backoff_s = max_backoff_s
        self.restarts = 0
        self.bad_frames = 0
        self._frames = frames
        self._parse = parse
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pid(self) -> int | None:
        """The child running now, if any."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._proc = subprocess.Popen(
                    self.command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                )
            except OSError as exc:
                log.warning("cannot start %s: %s", self.command[0], exc)
            else:
                try:
                    self._read(self._proc)
                except Exception:  # whatever the output did: restart, never stop
                    log.exception("reading %s failed; restarting it", self.name)
                    self._proc.kill()
                code = self._proc.wait()
                if self._stop.is_set():
                    return
                log.warning("%s exited with status %s; restarting", self.name, code)
            if time.monotonic() - started > 10 * backoff:
                backoff = 0.5  # it ran for a good while: not a crash loop
            self.restarts += 1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        bad_run = 0
        for frame in self._frames(proc.stdout):
            try:
                if frame is None:
                    raise ValueError("output over the size bound")
                sample = self._parse(frame)
            except ValueError as exc:
                self.bad_frames += 1
                bad_run += 1
                if self.bad_frames == 1:
                    log.warning("ignoring output that is not %s: %s", self.name, exc)
                if bad_run >= MAX_BAD_RUN:
                    raise RuntimeError(f"{bad_run} frames in a row were not {self.name}") from exc
                continue
            bad_run = 0
            self.arrive(sample)

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


class ChildSource(Generic[T]):
    """A power source fed by a :class:`ChildReader`: every sample it printed is
    integrated (it prints at the power reader's rate)."""

    board = False
    pushed = True

    def __init__(
        self,
        name: str,
        reader: ChildReader[T],
        period_s: float,
        reading: Callable[[Timed[T]], PowerReading],
    ) -> None:
        self.name = name
        self.period_s = period_s
        self._reader = reader
        self._reading = reading

    def read(self) -> PowerReading | None:
        latest = self._reader.latest
        return None if latest is None else self._reading(latest)

    def read_total(self) -> tuple[float, float] | None:
        return None  # it prints on its own

    def arrived(self) -> list[PowerReading]:
        return [self._reading(timed) for timed in self._reader.take()]

    def wait_newer(self, after: float, timeout_s: float) -> None:
        self._reader.wait_newer(after, timeout_s)

    def child_pid(self) -> int | None:
        return self._reader.pid

    def close(self) -> None:
        self._reader.close()
