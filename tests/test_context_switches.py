"""Context switches per target, against what the kernel counted: a live member's from
its /proc/PID/status, a departed one's from its exit record (the process's own
getrusage at its end: voluntary switches exact, as nothing it does after blocks)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.departing import (
    departed_grandchild,
    exit_sample,
    go,
    listener,
    sampler_of,
    waiting_child,
)

SLEEPS = 50
# N sleeps of 1 ms (each a voluntary switch), then its own counts and its exit: a
# write to a pipe with room and _exit block nowhere, so its record says the same.
SLEEPER = f"""
import os, resource, sys, time
for _ in range({SLEEPS}):
    time.sleep(0.001)
usage = resource.getrusage(resource.RUSAGE_SELF)
os.write(1, f"{{usage.ru_nvcsw}} {{usage.ru_nivcsw}}\\n".encode())
os._exit(0)
"""


def _kernel_switches(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        lines = f.read().splitlines()
    return int(lines[-2].split()[1]), int(lines[-1].split()[1])


def test_a_target_s_switches_are_the_kernel_s_live_and_its_exit_record_s_at_its_end(
    spawn: Any,
) -> None:
    # It waits for a line first: read live, then it sleeps, counts itself and exits.
    exits = listener()
    child = waiting_child(spawn, SLEEPER, stdout=subprocess.PIPE)
    sampler = sampler_of(child.pid, exits)
    try:
        (live,) = sampler.sample_once().processes
        voluntary, involuntary = _kernel_switches(child.pid)  # it waits: they stand
        assert (live.context_switches_voluntary, live.context_switches_involuntary) == (
            voluntary,
            involuntary,
        )
        go(child)
        own = tuple(int(x) for x in child.stdout.readline().split())
        child.wait()
        end = exit_sample(sampler)
        assert own[0] >= voluntary + SLEEPS
        assert end.context_switches_voluntary == own[0]
        assert end.context_switches_involuntary >= own[1]  # a preemption may come later
    finally:
        sampler.close()


def test_a_departed_member_s_switches_stay_in_its_target_s_exactly(
    spawn: Any, tmp_path: Path
) -> None:
    # The grandchild sleeps and counts itself; the child passes its line on.
    then = "sys.stdout.buffer.write(out)\nsys.stdout.flush()\n"
    child, sampler, line, sample = departed_grandchild(spawn, tmp_path, SLEEPER, then)
    try:
        own = tuple(int(x) for x in line.split())
        voluntary, involuntary = _kernel_switches(child.pid)
        assert own[0] >= SLEEPS
        assert sample.context_switches_voluntary == voluntary + own[0]
        assert sample.context_switches_involuntary >= involuntary + own[1]
    finally:
        sampler.close()
