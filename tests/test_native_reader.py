"""The native reader (core/power/_stream.c) on the stand-in INA3221's real sysfs
layout: what it reads, when, and what it does with a file that fails or a ring that
fills; the meter's use of it is in test_power_reader.py, both readers."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from edgewatt.core.power import ina3221, native
from edgewatt.core.power.meter import WINDOW_LINGER_S, PowerMeter
from edgewatt.core.power.source import PowerOptions
from tests.conftest import wait_for
from tests.power_standin import build_tree

pytestmark = pytest.mark.skipif(
    native._stream is None, reason="the native reader was not built (no C compiler?)"
)


@pytest.fixture
def files(tmp_path: Path) -> list[int]:
    build_tree(tmp_path)
    paths = sorted(tmp_path.glob("class/hwmon/hwmon*/in1_input")) + sorted(
        tmp_path.glob("class/hwmon/hwmon*/curr1_input")
    )
    fds = [os.open(p, os.O_RDONLY) for p in paths[:2]]
    yield fds
    for fd in fds:
        os.close(fd)


def test_it_reads_the_files_at_its_rate_on_the_monotonic_clock(files: list[int]) -> None:
    expected = tuple(int(os.pread(fd, 32, 0)) for fd in files)
    before = time.monotonic()
    stream = native._stream.Stream(tuple(files), 100.0)
    time.sleep(1.0)
    stream.close()  # no reading after this
    after = time.monotonic()
    readings = stream.drain()
    assert 50 <= len(readings) <= 103  # a busy machine delays some, never bursts
    assert all(values == expected for _, values in readings)
    times = [t for t, _ in readings]
    assert before <= times[0] and times[-1] <= after and times == sorted(times)
    assert stream.drain() == []  # drained, and closed: nothing more comes
    assert stream.stats()[0] == len(readings) and stream.stats()[1:] == (0, 0)
    assert 0 < stream.cpu_s() < 0.5


def test_a_new_rate_applies_at_once(files: list[int]) -> None:
    stream = native._stream.Stream(tuple(files), 0.5)
    try:
        wait_for(lambda: stream.stats()[0] >= 1)
        assert len(stream.drain()) == 1  # the first reading at the start, the next in 2 s
        asked = time.monotonic()
        stream.set_hz(200.0)
        wait_for(lambda: stream.stats()[0] >= 1 + 20)
        times = [t for t, _ in stream.drain()]
        assert times[0] - asked < 0.05  # read at the change, not 2 s later
        assert len(times) >= 20
    finally:
        stream.close()


def test_each_reading_says_how_late_it_came(files: list[int]) -> None:
    stream = native._stream.Stream(tuple(files), 200.0)
    wait_for(lambda: stream.stats()[0] >= 40)
    stream.close()
    late = stream.lateness()
    # One figure a reading, each its time against when it was due: never early (the
    # time is taken once the files are read, at or after the deadline waited for).
    assert len(late) == stream.stats()[0] == len(stream.drain())
    assert all(x >= 0 for x in late)
    assert stream.lateness() == []  # taken


AHEAD = """
import os, sys
from edgewatt.core.power import _stream
fds = tuple(os.open(p, os.O_RDONLY) for p in sys.argv[1:])
stream = _stream.Stream(fds, 100.0)
while stream.stats()[0] == 0:
    pass
stream.close()
print(stream.ahead())
"""


# What the kernel lets a process's thread take, asked the same way in Python.
ALLOWED = """
import os
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("fifo")
except OSError:
    for nice in range(-10, 0):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            print(f"nice {nice}")
            break
        except OSError:
            pass
    else:
        print("")
"""


def thread_priority_allowed() -> str:
    """What a thread of a process started as this one is may take: "fifo", "nice -N",
    or "process"."""
    out = subprocess.run([sys.executable, "-c", ALLOWED], capture_output=True, text=True)
    return out.stdout.strip() or "process"


def _both(*prefix: str, paths: list[str]) -> tuple[str, str]:
    """(what the stream's thread took, what the kernel allows), under ``prefix``."""
    took, allowed = (
        subprocess.run([*prefix, sys.executable, "-c", code, *paths],
                       capture_output=True, text=True, check=True).stdout
        for code in (AHEAD, ALLOWED)
    )  # fmt: skip
    return took, allowed


def test_the_thread_runs_ahead_where_the_process_may(tmp_path: Path) -> None:
    build_tree(tmp_path)
    paths = [str(p) for p in sorted(tmp_path.glob("class/hwmon/hwmon*/in1_input"))[:1]]
    # SCHED_FIFO where the process may (root here: CAP_SYS_NICE; or RLIMIT_RTPRIO), else
    # the lowest nice value from -10 it may take (RLIMIT_NICE), else its own priority.
    took, allowed = _both(paths=paths)
    assert took == allowed  # "fifo" as root here
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    # Without CAP_SYS_NICE, as the systemd unit without LimitRTPRIO ran it (and no
    # rlimits here): the process's own priority, and it reads all the same.
    took, allowed = _both("setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice",
                          paths=paths)  # fmt: skip
    assert took == allowed
    rlimits = (resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE)
    if all(resource.getrlimit(r)[0] == 0 for r in rlimits):
        assert took == "\n"


def test_a_failing_file_is_counted_and_a_full_ring_keeps_the_newest(
    files: list[int], tmp_path: Path
) -> None:
    directory = os.open(tmp_path, os.O_RDONLY)  # pread fails: EISDIR
    try:
        failing = native._stream.Stream((files[0], directory), 200.0)
        wait_for(lambda: failing.stats()[0] >= 5)
        assert failing.drain() == []
        failing.close()
        readings, lost, errors = failing.stats()
        assert readings == errors >= 5 and lost == 0
    finally:
        os.close(directory)
    small = native._stream.Stream((files[0],), 1000.0, capacity=4)
    wait_for(lambda: small.stats()[1] > 0)  # the ring has overflowed
    small.close()
    readings, lost, _ = small.stats()
    kept = small.drain()
    assert len(kept) == 4 and lost == readings - 4 > 0
    assert [t for t, _ in kept] == sorted(t for t, _ in kept)


def test_bad_arguments_say_what_is_wrong(files: list[int]) -> None:
    with pytest.raises(ValueError, match="a stream reads 1 to 8 files, got 0"):
        native._stream.Stream((), 10.0)
    with pytest.raises(ValueError, match=r"hz must be from 0\.1 to 10000"):
        native._stream.Stream(tuple(files), 0.0)
    stream = native._stream.Stream(tuple(files), 10.0)
    try:
        with pytest.raises(ValueError, match=r"hz must be from 0\.1 to 10000"):
            stream.set_hz(-1.0)
    finally:
        stream.close()
    # Set up once: a second __init__ (after its close too) would leak its ring.
    with pytest.raises(RuntimeError, match="a stream is set up once: make a new one"):
        stream.__init__(tuple(files), 10.0)


def test_a_window_rate_ends_by_itself_and_wakes_the_thread_only_to_go_faster(
    files: list[int],
) -> None:
    stream = native._stream.Stream(tuple(files), 0.5)
    times: list[float] = []

    def readings(count: int) -> Callable[[], bool]:
        def come() -> bool:
            times.extend(t for t, _ in stream.drain())
            return len(times) >= count

        return come

    try:
        wait_for(readings(1))  # the first reading at the start, the next 2 s on
        # Slower: taken at its next reading, the thread left asleep until then (a
        # thread woken would read at once).
        asked = time.monotonic()
        stream.set_rate(0.25, 0.0, 0.25)
        wait_for(readings(2), timeout=10)
        assert times[1] - times[0] >= 1.99 and times[1] - asked > 1.0
        # Faster until an instant: read at once, at 200 Hz until then, then at 0.5 Hz
        # without being told (the first reading from then on changes it).
        del times[:]
        asked = time.monotonic()
        until = asked + 0.3
        stream.set_rate(200.0, until, 0.5)
        wait_for(lambda: readings(0)() and sum(t >= until for t in times) >= 2, timeout=10)
    finally:
        stream.close()
    fast = [t for t in times if t < until]
    after = [t for t in times if t >= until]
    assert fast[0] - asked < 0.05
    assert len(fast) >= 0.5 * 200 * 0.3  # a busy machine delays some, never bursts
    assert after[1] - after[0] >= 1.99  # the one that ended it, the next 2 s on


def test_windows_one_after_another_keep_the_window_rate_and_it_ends_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop of tracked calls: an edge opens a window, the next says none is young,
    # the next opens one again. The reader is not slowed at the edge between (a change
    # back to the window rate would wake its thread at the next edge): it reads on at
    # the window rate, and ends it WINDOW_LINGER_S after the last window's end.
    build_tree(tmp_path)
    source = ina3221.discover(PowerOptions(sysfs_path=str(tmp_path)))
    meter = PowerMeter([source], max_gap_s=5.0, sample_hz=10.0, window_hz=200.0).start()
    assert meter.reader == "native"
    stream = meter._reader._streams[0]  # type: ignore[union-attr]
    rates: list[float] = []
    drained: list[float] = []
    set_rate, drain = stream.set_rate, stream.drain
    monkeypatch.setattr(
        stream, "set_rate", lambda hz, *rest: (rates.append(hz), set_rate(hz, *rest))
    )
    monkeypatch.setattr(stream, "drain", lambda: [drained.append(t) or (t, w) for t, w in drain()])
    try:
        meter.read(time.monotonic(), window_until=time.monotonic() + 2.0)
        time.sleep(0.1)
        meter.read(t1 := time.monotonic())  # the call returned: none young
        time.sleep(0.2)
        meter.read(t2 := time.monotonic(), window_until=t2 + 2.0)  # the next call
        between = [t for t in drained if t1 < t <= t2]
        time.sleep(0.05)
        ended = meter.read(t3 := time.monotonic())  # the last call returned
        counted = stream._stream.stats()[0]
        # No edge until 4 readings after the window rate's end: 0.25 s at 200 Hz is 52
        # readings at most (a busy machine delays some, never bursts).
        wait_for(lambda: stream._stream.stats()[0] >= counted + 52 + 4)
        after = meter.read(time.monotonic())
    finally:
        meter.close()
    # Never slowed between two windows, so never woken to go faster again; at the
    # next edge, told the rate it went back to by itself.
    assert rates == [200.0, 200.0, 200.0, 200.0, 10.0]
    late = [t for t in drained if t > t3 + WINDOW_LINGER_S + 0.01]
    assert len(late) >= 2
    assert all(b - a >= 0.05 for a, b in zip(late, late[1:]))  # 10 Hz, no edge asked
    assert len(between) >= 0.5 * 200 * 0.2
    assert ended is not None and ended.period_s == pytest.approx(1 / 200)
    assert after is not None and after.period_s == pytest.approx(1 / 10)
