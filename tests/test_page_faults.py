"""Minor page faults per target (a channel: core/channels.py), against what the kernel
counted: a live member's from its /proc/PID/stat, a departed one's from its exit
record, which is what its parent's wait4 reads of it (both are taken after its
address space is gone: nothing faults after them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests import departing

PAGES = 2000
# Maps and touches PAGES fresh anonymous pages (a minor fault each), then exits.
TOUCHER = f"""
import mmap, os
area = mmap.mmap(-1, {PAGES} * mmap.PAGESIZE)
for at in range(0, {PAGES} * mmap.PAGESIZE, mmap.PAGESIZE):
    area[at] = 1
os._exit(0)
"""


def _minflt(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2 :].split()[7])  # field 10


def test_a_target_s_minor_faults_are_the_kernel_s_live_and_its_exit_record_s_at_its_end(
    spawn: Any,
) -> None:
    exits = departing.listener()
    child = departing.waiting_child(spawn, TOUCHER)
    sampler = departing.sampler_of(child.pid, exits)
    try:
        (live,) = sampler.sample_once().processes
        before = _minflt(child.pid)  # it waits: its count stands
        assert live.page_faults_minor == before
        departing.go(child)
        _, _, usage = os.wait4(child.pid, 0)  # the kernel's count of it, whole
        child.returncode = 0
        end = departing.exit_sample(sampler)
        assert usage.ru_minflt >= before + PAGES
        assert end.page_faults_minor == usage.ru_minflt
    finally:
        sampler.close()


def test_a_departed_member_s_minor_faults_stay_in_its_target_s_exactly(
    spawn: Any, tmp_path: Path
) -> None:
    # The child says what its reaped children faulted: the grandchild's whole count.
    then = "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt, flush=True)\n"
    child, sampler, line, sample = departing.departed_grandchild(spawn, tmp_path, TOUCHER, then)
    try:
        departed = int(line)
        assert departed >= PAGES
        assert sample.page_faults_minor == _minflt(child.pid) + departed
    finally:
        sampler.close()
