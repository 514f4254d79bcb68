"""Context switches per target, against what the kernel counted: a live member's from
its /proc/PID/status, a departed one's from its exit record (the process's own
getrusage at its end: voluntary switches exact, as nothing it does after blocks)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from edgewatt.core.kernel.taskstats import TaskExits, TaskstatsSocket
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from tests.conftest import settled, table_with, wait_for

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


def _sampler(pid: int, exits: TaskExits) -> Sampler:
    trees = ProcessTrees(LinuxPlatform(), exits=exits)
    return Sampler(table_with(pid), interval=0.1, host_name="h", parts=Parts(trees))


def test_a_target_s_switches_are_the_kernel_s_live_and_its_exit_record_s_at_its_end(
    spawn: Any,
) -> None:
    # Listening before it starts: its exit record is then known complete.
    exits = TaskExits(TaskstatsSocket(), keep_s=30)  # root: CAP_NET_ADMIN
    # It waits for a line first: read live, then it sleeps, counts itself and exits.
    child = spawn(
        "import sys\nsys.stdin.readline()\n" + SLEEPER,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    settled(child.pid)
    sampler = _sampler(child.pid, exits)
    try:
        (live,) = sampler.sample_once().processes
        voluntary, involuntary = _kernel_switches(child.pid)  # it waits: they stand
        assert (live.context_switches_voluntary, live.context_switches_involuntary) == (
            voluntary,
            involuntary,
        )
        child.stdin.write(b"go\n")
        child.stdin.flush()
        own = tuple(int(x) for x in child.stdout.readline().split())
        child.wait()
        exits = []
        assert wait_for(lambda: exits.extend(sampler.sample_once().exits) or exits, timeout=5)
        (end,) = exits
        assert own[0] >= voluntary + SLEEPS
        assert end.context_switches_voluntary == own[0]
        assert end.context_switches_involuntary >= own[1]  # a preemption may come later
    finally:
        sampler.close()


def test_a_departed_member_s_switches_stay_in_its_target_s_exactly(
    spawn: Any, tmp_path: Path
) -> None:
    # A child starts a grandchild, waits for it and then for its stdin; the grandchild
    # waits for the go file (read live meanwhile), then sleeps, counts itself, exits.
    go = tmp_path / "go"
    exits = TaskExits(TaskstatsSocket(), keep_s=30)
    grandchild = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
    child = spawn(
        "import subprocess, sys\n"
        f"out = subprocess.run([sys.executable, '-c', {grandchild + SLEEPER!r}],"
        " stdout=subprocess.PIPE).stdout\n"
        "sys.stdout.buffer.write(out)\nsys.stdout.flush()\nsys.stdin.read()\n",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    sampler = _sampler(child.pid, exits)
    try:
        assert wait_for(lambda: len(sampler.sample_once().processes[0].members) == 2, timeout=10)
        go.touch()
        own = tuple(int(x) for x in child.stdout.readline().split())
        settled(child.pid)  # reaped it, and waits on its stdin
        (sample,) = sampler.sample_once().processes
        voluntary, involuntary = _kernel_switches(child.pid)
        assert sample.members == (child.pid,)
        assert own[0] >= SLEEPS
        assert sample.context_switches_voluntary == voluntary + own[0]
        assert sample.context_switches_involuntary >= involuntary + own[1]
    finally:
        sampler.close()
