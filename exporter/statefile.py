"""Registrations persisted atomically, so they survive a daemon restart.

The file is replaced with write-to-temp, fsync, rename, fsync-directory: a crash at
any point leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class StateFile:
    def __init__(self, directory: Path, boot_id: str) -> None:
        self.path = directory / "targets.json"
        self._boot_id = boot_id
        self._lock = threading.Lock()

    def save(self, targets: list[dict[str, Any]]) -> None:
        data = json.dumps(
            {"version": FORMAT_VERSION, "boot_id": self._boot_id, "targets": targets},
            indent=1,
        ).encode()
        with self._lock:
            tmp = self.path.with_suffix(".json.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def load(self) -> list[dict[str, Any]]:
        """Saved registrations of this boot; an unreadable file is logged and ignored."""
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable state file %s: %s", self.path, exc)
            return []
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
            log.warning("ignoring state file %s: unknown format", self.path)
            return []
        if raw.get("boot_id") != self._boot_id:
            # pids and start ticks restart at boot: old registrations name strangers.
            log.info("state file %s is from an earlier boot; starting empty", self.path)
            return []
        targets = raw.get("targets")
        return targets if isinstance(targets, list) else []
