"""edgewatt client: register the calling process with the local edgewatt daemon.

    import client
    with client.register(labels={"run": "resnet-42"}) as reg:
        train()
        print(reg.summary())

Importing this package costs only the standard library. Monitoring never raises
into the caller: when no daemon answers, the registration is inactive, one warning
is logged, and stats()/summary() return empty dicts. Only wrong arguments raise
(TypeError/ValueError), because those are the caller's bug.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from client import _transport
from client._transport import DaemonError, default_socket

__all__ = ["DaemonError", "Registration", "default_socket", "register"]

log = logging.getLogger("edgewatt.client")


class Registration:
    """One registered process. Use as a context manager, or call close() when done."""

    def __init__(self, socket_path: str, info: dict[str, Any] | None) -> None:
        self.socket = socket_path
        self.info = info or {}

    @property
    def id(self) -> str | None:
        return self.info.get("id")

    @property
    def active(self) -> bool:
        return self.id is not None

    def stats(self) -> dict[str, Any]:
        """The latest sample the daemon took of this target (units in the README)."""
        described = self._get(f"/v1/targets/{self.id}")
        return (described or {}).get("latest") or {}

    def summary(self) -> dict[str, Any]:
        return self._get(f"/v1/targets/{self.id}/summary") or {}

    def phase(self, name: str) -> None:
        """Start a named phase (an epoch, a round); it ends when the next one starts."""
        if not isinstance(name, str) or not name:
            raise ValueError("phase name must be a non-empty string")
        if self.active:
            self._quietly("POST", f"/v1/targets/{self.id}/phase", {"name": name})

    def close(self) -> None:
        if self.active:
            self._quietly("DELETE", f"/v1/targets/{self.id}")
            self.info = {}

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str) -> Any:
        return self._quietly("GET", path) if self.active else None

    def _quietly(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return _transport.call_ok(self.socket, method, path, body)
        except (OSError, DaemonError) as exc:
            log.warning("edgewatt: %s %s failed: %s", method, path, exc)
            return None


def register(
    labels: dict[str, str] | None = None,
    pid: int | None = None,
    children: bool = True,
    socket: str | None = None,
) -> Registration:
    """Register ``pid`` (default: this process) with the daemon."""
    if labels is not None and (
        not isinstance(labels, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise TypeError("labels must be a dict of str to str")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise ValueError(f"pid must be a positive int, got {pid!r}")
    if not isinstance(children, bool):
        raise TypeError("children must be a bool")
    path = socket or default_socket()
    body: dict[str, Any] = {"children": children, "labels": labels or {}}
    if pid is not None and pid != os.getpid():
        body["pid"] = pid
    try:
        info = _transport.call_ok(path, "POST", "/v1/targets", body)
    except DaemonError as exc:
        if exc.status == 400 and exc.body.get("error") == "invalid labels":
            raise ValueError(exc.body.get("detail")) from None
        log.warning("edgewatt: registration refused: %s", exc)
        info = None
    except OSError as exc:
        log.warning("edgewatt: no daemon at %s (%s); this process is not monitored", path, exc)
        info = None
    return Registration(path, info)
