"""The daemon's malloc arenas are bounded (exporter/heap.py): counted from the
process's own mappings, where glibc places each thread arena's heap at a 64 MiB
boundary."""

from __future__ import annotations

import platform
import subprocess
import sys
from typing import Any

import pytest

# Eight threads each allocating 64 blocks of 64 KiB (above Python's small-object
# allocator, below glibc's mmap threshold: from the thread's arena) at once, held
# while the arenas are counted.
THREADS = """
import re, sys, threading
from edgewatt.exporter.heap import limit_arenas
limited = limit_arenas() if sys.argv[1] == "limit" else None
start, done = threading.Barrier(9), threading.Barrier(9)
def allocate():
    start.wait()
    held = [bytearray(64 << 10) for _ in range(64)]
    done.wait()
    done.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
start.wait()
done.wait()
heaps = 0
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split()
        low = int(fields[0].split("-")[0], 16)
        if len(fields) == 5 and fields[1] == "rw-p" and low % (64 << 20) == 0:
            heaps += 1  # an anonymous mapping at a heap's boundary: a thread arena
done.wait()
print(limited, heaps)
"""


def arenas(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", THREADS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")
def test_the_daemons_threads_share_two_malloc_arenas() -> None:
    assert arenas("limit") == ("True", 1)  # the main arena (brk) and one more
    assert arenas("none")[1] > 1  # without the bound, several: what the test tells apart


def thread_arenas(pid: int) -> int:
    """Anonymous rw mappings of ``pid`` at a 64 MiB boundary: its thread arenas' heaps."""
    with open(f"/proc/{pid}/maps") as f:
        rows = [line.split() for line in f]
    return sum(
        len(r) == 5 and r[1] == "rw-p" and int(r[0].split("-")[0], 16) % (64 << 20) == 0
        for r in rows
    )


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")
def test_the_daemon_bounds_its_arenas(daemon_factory: Any, spawn: Any) -> None:
    daemon = daemon_factory()
    assert daemon.proc is not None
    sleepers = [spawn("import time; time.sleep(60)") for _ in range(8)]
    for n, p in enumerate(sleepers):  # each a pass on demand in a connection's thread
        target = daemon.register(p.pid, labels={"n": str(n)})
        daemon.call("POST", f"/v1/targets/{target['id']}/phase", {"name": "a"})
        daemon.call("GET", "/v1/top")
    assert thread_arenas(daemon.proc.pid) <= 1
