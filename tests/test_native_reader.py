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

import pytest

from edgewatt.core.power import native
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
