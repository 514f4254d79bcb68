"""Targets for the channel tests (test_context_switches.py, test_page_faults.py): a
sampler with the kernel's exit records, a child that waits for a line and then does
its work, and a child whose grandchild departs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from edgewatt.core.kernel.taskstats import TaskExits, TaskstatsSocket
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from edgewatt.core.snapshot import ProcessSample
from tests.conftest import settled, table_with, wait_for


def listener() -> TaskExits:
    """The kernel's exit records (root: CAP_NET_ADMIN): listening before a target's
    members start, their records are known complete."""
    return TaskExits(TaskstatsSocket(), keep_s=30)


def sampler_of(pid: int, exits: TaskExits) -> Sampler:
    trees = ProcessTrees(LinuxPlatform(), exits=exits)
    return Sampler(table_with(pid), interval=0.1, host_name="h", parts=Parts(trees))


def waiting_child(spawn: Any, work: str, **kw: Any) -> subprocess.Popen:
    """A child that waits for a line on its stdin (settled: its counts stand), then
    runs ``work``; ``go`` starts it."""
    child = spawn("import sys\nsys.stdin.readline()\n" + work, stdin=subprocess.PIPE, **kw)
    settled(child.pid)
    return child


def go(child: subprocess.Popen) -> None:
    child.stdin.write(b"go\n")
    child.stdin.flush()


def exit_sample(sampler: Sampler) -> ProcessSample:
    """The target's exit sample, once a pass found every member gone."""
    ended: list[ProcessSample] = []
    assert wait_for(lambda: ended.extend(sampler.sample_once().exits) or ended, timeout=5)
    (end,) = ended
    return end


def departed_grandchild(
    spawn: Any, tmp_path: Path, work: str, then: str
) -> tuple[subprocess.Popen, Sampler, bytes, ProcessSample]:
    """A child starts a grandchild and waits for it, runs ``then`` (its stdout: the
    grandchild's), then waits on its stdin; the grandchild waits for a go file (read
    live meanwhile), then runs ``work``. The child, its sampler, the first line the
    child wrote, and the target's sample once the grandchild is reaped."""
    started, exits = tmp_path / "go", listener()
    waits = f"import os, time\nwhile not os.path.exists({str(started)!r}):\n    time.sleep(0.01)\n"
    child = spawn(
        "import resource, subprocess, sys\n"
        f"out = subprocess.run([sys.executable, '-c', {waits + work!r}],"
        " stdout=subprocess.PIPE).stdout\n" + then + "sys.stdin.read()\n",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    sampler = sampler_of(child.pid, exits)
    assert wait_for(lambda: len(sampler.sample_once().processes[0].members) == 2, timeout=10)
    started.touch()
    line = child.stdout.readline()
    settled(child.pid)  # reaped it, and waits on its stdin
    (sample,) = sampler.sample_once().processes
    assert sample.members == (child.pid,)
    return child, sampler, line, sample
