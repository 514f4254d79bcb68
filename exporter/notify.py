"""systemd's notify protocol with the standard library: one datagram per message to
``$NOTIFY_SOCKET`` (a path, or an abstract socket written ``@name``).

Without ``NOTIFY_SOCKET`` (not started by systemd) every call does nothing. The
watchdog is pinged from the sampling loop at half of ``WATCHDOG_USEC``: a sampler that
stalls stops the pings, and systemd restarts the service.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and watchdog_pid in ("", str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._last_ping = 0.0
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, **fields: str | int) -> None:
        if not self.address:
            return
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self.address)
                s.sendall(message)
        except OSError as exc:  # systemd gone (shutdown): nothing to tell
            log.debug("sd_notify %s failed: %s", message, exc)

    def ready(self, status: str) -> None:
        self._last_status = status
        self.send(ready=1, status=status)

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self.send(status=status)

    def watchdog(self) -> None:
        """Ping if half the watchdog period has passed since the last ping."""
        if self.watchdog_s is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_s / 2:
            self._last_ping = now
            self.send(watchdog=1)

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd >= 253 match the reload to its request.
        self.send(reloading=1, monotonic_usec=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> None:
        self.send(stopping=1, status="stopping")
