"""The daemon's state directory: registrations persisted atomically, so they survive a
daemon restart, and the instance id where the machine has none.

A file is replaced with write-to-temp, fsync, rename, fsync-directory: a crash at any
point leaves either the old or the new file, never a torn one. A short write (a nearly
full filesystem: eMMC fills) is continued until all is written; one that cannot finish
(ENOSPC, EIO) or an fsync that fails removes the temporary file and raises, so the old
file stays in place.

The daemon often runs as root, so the directory must be its own: one another user
could write would let that user plant a symlink at the temporary file and have root
overwrite what it points to. The directory is refused unless the daemon's user owns it
and nobody else may write to it; every file in it is opened relative to the directory
descriptor held from that check, with O_NOFOLLOW, and the temporary file with O_EXCL.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from edgewatt.core.transport import directory_problem

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
REGISTRATIONS = "targets.json"
INSTANCE_ID = "instance-id"


class StateDirError(OSError):
    """A state directory the daemon must not use; the message says why and the fix."""


def open_own_directory(directory: Path) -> int:
    """A descriptor of ``directory``, created if missing, refused if another user owns
    it or may write to it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    euid = os.geteuid()
    problem = directory_problem(os.fstat(fd), (euid,), f"the daemon's uid {euid}")
    if problem is not None:
        os.close(fd)
        raise StateDirError(
            f"refusing state directory {directory}: {problem}; use a directory of the "
            "daemon's user that only it may write (--state-dir)"
        )
    return fd


class StateFile:
    def __init__(self, directory: Path, boot_id: str) -> None:
        self.path = directory / REGISTRATIONS
        self._boot_id = boot_id
        self._dir_fd = open_own_directory(directory)
        self._lock = threading.Lock()

    def save(self, targets: list[dict[str, Any]]) -> None:
        data = json.dumps(
            {"version": FORMAT_VERSION, "boot_id": self._boot_id, "targets": targets},
            indent=1,
        ).encode()
        self._replace(REGISTRATIONS, data)

    def load(self) -> list[Any]:
        """Saved entries of this boot, unchecked (``registration.parse_saved`` checks
        each); an unreadable file is logged and ignored."""
        try:
            raw = json.loads(self._read(REGISTRATIONS))
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring unreadable state file %s: %s", self.path, str(exc)[:200])
            return []
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
            log.warning("ignoring state file %s: unknown format", self.path)
            return []
        if raw.get("boot_id") != self._boot_id:
            # pids and start ticks restart at boot: old registrations name strangers.
            log.info("state file %s is from an earlier boot; starting empty", self.path)
            return []
        targets = raw.get("targets")
        if not isinstance(targets, list):
            log.warning("ignoring state file %s: 'targets' is not a list", self.path)
            return []
        return targets

    def instance_id(self) -> str:
        """An id kept here for a machine without /etc/machine-id."""
        try:
            value = self._read(INSTANCE_ID).decode("ascii", "replace").strip()
        except OSError:
            value = ""
        if not value:
            value = uuid.uuid4().hex
            self._replace(INSTANCE_ID, (value + "\n").encode())
        return value

    def close(self) -> None:
        with self._lock:
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1

    def _read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir_fd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _replace(self, name: str, data: bytes) -> None:
        tmp = name + ".tmp"
        with self._lock:
            # Whatever is at the temporary name (a crash's leftover, or a planted
            # link) goes; O_EXCL then creates a fresh file or fails.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self._dir_fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=self._dir_fd)
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self._dir_fd)
                raise
            os.replace(tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            os.fsync(self._dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data``, or OSError: os.write may write less than asked (a filesystem
    with a page left writes that page), and the next call then names the cause."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # not seen from a regular file; would loop forever
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
