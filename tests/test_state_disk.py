"""The state directory on a filesystem that fills (an edge board's eMMC): the real
daemon over its real socket, the state on a real tmpfs of a few pages."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from pathlib import Path
from typing import Any

from edgewatt.exporter.statefile import StateFile
from edgewatt.exporter.write_budget import WriteBudget
from tests.conftest import wait_for

PAGE = os.sysconf("SC_PAGE_SIZE")


def fill_but_one_page(directory: Path) -> Path:
    """Fill the filesystem, then free one page: the next file written gets one page."""
    filler = directory / "filler"
    chunk = b"\0" * PAGE
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                if os.write(fd, chunk) < PAGE:
                    break
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        size = os.fstat(fd).st_size
        os.ftruncate(fd, size - size % PAGE - PAGE)
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 1
    return filler


def test_a_full_state_filesystem_keeps_every_saved_registration(
    daemon_factory: Any, spawn: Any, small_tmpfs: Path
) -> None:
    first = daemon_factory(state_dir=small_tmpfs)
    labels = {f"l{n}": "v" * 200 for n in range(4)}  # ~1 KiB a record: 7 need two pages
    fat = {f"f{n}": "w" * 1000 for n in range(16)}  # 16 KiB: more than a page left
    sleepers = [spawn("import time; time.sleep(120)") for _ in range(8)]
    saved_ids = [first.register(p.pid, labels=labels)["id"] for p in sleepers[:7]]
    journal = small_tmpfs / "targets.journal"
    good = (small_tmpfs / "targets.json").read_bytes(), journal.read_bytes()
    assert len(good[1]) > PAGE
    assert first.call("GET", "/healthz")[1]["state_error"] is None

    fill_but_one_page(small_tmpfs)
    status, body = first.call("POST", "/v1/targets", {"pid": sleepers[7].pid, "labels": fat})
    # Accepted and monitored; the record the disk cut short is taken back, the failure
    # shown and logged, the files as they were.
    assert status == 201, body
    health = first.call("GET", "/healthz")[1]
    assert health["status"] == "degraded"
    assert "No space left on device" in health["state_error"]
    assert ((small_tmpfs / "targets.json").read_bytes(), journal.read_bytes()) == good
    wait_for(lambda: "cannot persist registrations" in first.log())

    first.stop(signal.SIGKILL)
    # Started on the full disk: its snapshot cannot be written, the files are read.
    second = daemon_factory(state_dir=small_tmpfs)
    listing = second.call("GET", "/v1/targets")[1]["targets"]
    assert sorted(t["id"] for t in listing) == sorted(saved_ids)
    assert all(t["labels"] == labels for t in listing)
    # Logged once serving: the API may answer just before the line is written.
    wait_for(lambda: "7 registration(s) restored" in second.log())
    assert second.call("GET", "/healthz")[1]["status"] == "degraded"
    assert ((small_tmpfs / "targets.json").read_bytes(), journal.read_bytes()) == good

    # Space again: the next save works, and health says so.
    (small_tmpfs / "filler").unlink()
    second.register(sleepers[7].pid, labels=fat)
    health = second.call("GET", "/healthz")[1]
    assert (health["status"], health["state_error"]) == ("ok", None)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert len(StateFile(small_tmpfs, boot_id, WriteBudget(1 << 20)).load()) == 8
    assert not list(small_tmpfs.glob("*.tmp"))
    with contextlib.suppress(Exception):
        second.stop()
