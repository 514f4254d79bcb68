"""edgewatt client: register the calling process with the local edgewatt daemon.

    from edgewatt import client
    with client.register(labels={"run": "resnet-42"}) as reg:
        with reg.phase("epoch-1"):
            train_one_epoch()
        print(reg.summary())

Importing this package costs only the standard library. With a daemon answering,
the daemon is the only sampler and no thread is started here. With none (or when it
disappears), the process samples itself with the daemon's own code: same figures,
same keys, one warning. Monitoring never raises into the caller; only wrong
arguments do (TypeError/ValueError), because those are the caller's bug.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from edgewatt.client._track import Measurement, track
from edgewatt.core import transport
from edgewatt.core.transport import DaemonError, current_uid, default_socket

__all__ = ["DaemonError", "Measurement", "Registration", "default_socket", "register", "track"]

log = logging.getLogger(__name__)

FALLBACKS = ("auto", "never", "always")


class _Phase:
    """Returned by Registration.phase(): the phase already runs; ``with`` ends it."""

    def __init__(self, registration: Registration, name: str) -> None:
        self.registration = registration
        self.name = name

    def __enter__(self) -> _Phase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.registration._end_phase()


class Registration:
    """One registered process. Use as a context manager, or call close() when done.

    ``mode`` is "daemon" (the daemon samples it), "local" (this process samples it
    in a thread) or "inactive" (nothing samples it: no daemon and fallback="never").
    """

    def __init__(
        self,
        socket_path: str,
        pid: int,
        labels: dict[str, str],
        children: bool,
        fallback: str,
        info: dict[str, Any] | None,
    ) -> None:
        self.socket = socket_path
        self.pid = pid
        self.labels = labels
        self.children = children
        self.fallback = fallback
        self.info = info or {}
        self._local: Any = None
        self._lock = threading.Lock()
        self._warned = False

    @property
    def mode(self) -> str:
        if self._local is not None:
            return "local"
        return "daemon" if self.info.get("id") else "inactive"

    @property
    def id(self) -> str | None:
        if self._local is not None:
            return self._local.id
        return self.info.get("id")

    @property
    def active(self) -> bool:
        return self.mode != "inactive"

    def stats(self) -> dict[str, Any]:
        """The latest sample of this process (units: README, "Registration API")."""
        described = self._call("GET", "", lambda local: {"latest": local.stats()})
        return (described or {}).get("latest") or {}

    def summary(self) -> dict[str, Any]:
        """What the process consumed while registered, and per phase."""
        return self._call("GET", "/summary", lambda local: local.summary()) or {}

    def phase(self, name: str) -> _Phase:
        """Start a named phase (an epoch, a round); it ends when the next one starts, or
        at the end of a ``with`` block."""
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ValueError("phase name must be a string of 1 to 128 characters")
        self._call("POST", "/phase", lambda local: local.phase(name), {"name": name})
        return _Phase(self, name)

    def _end_phase(self) -> None:
        self._call("DELETE", "/phase", lambda local: local.table.end_phase(local.id, current_uid()))

    def close(self) -> None:
        """Unregister (with a daemon) or stop the local sampler."""
        with self._lock:
            local, self._local = self._local, None
        if local is not None:
            local.stop()
        elif self.info.get("id"):
            self._daemon("DELETE", "")
        self.info = {}

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------

    def _call(self, method: str, sub: str, local_call: Any, body: Any = None) -> Any:
        try:
            if self._local is None and self.info.get("id"):
                try:
                    return self._daemon(method, sub, body, raise_unreachable=True)
                except OSError as exc:
                    self._lost_daemon(exc)
            local = self._local
            return local_call(local) if local is not None else None
        except Exception as exc:  # monitoring must never break the caller
            log.warning("edgewatt: %s failed: %s", method + " " + (sub or "/"), exc)
            return None

    def _daemon(
        self, method: str, sub: str, body: Any = None, *, raise_unreachable: bool = False
    ) -> Any:
        path = f"/v1/targets/{self.info['id']}{sub}"
        try:
            return transport.call_ok(self.socket, method, path, body)
        except DaemonError as exc:
            log.warning("edgewatt: %s %s refused: %s", method, path, exc)
        except OSError as exc:
            if raise_unreachable:
                raise
            log.warning("edgewatt: %s %s failed: %s", method, path, exc)
        return None

    def _lost_daemon(self, exc: OSError) -> None:
        log.warning("edgewatt: the daemon at %s stopped answering (%s)", self.socket, exc)
        self.info = {}
        if self.fallback == "auto":
            self._start_local()

    def _start_local(self) -> None:
        with self._lock:
            if self._local is not None:
                return
            from edgewatt.client._local import LocalSampler

            try:
                self._local = LocalSampler(
                    self.pid, labels=self.labels, children=self.children
                ).start()
            except Exception as exc:  # e.g. the pid has exited: stay inactive
                log.warning("edgewatt: in-process monitoring unavailable: %s", exc)
                return
        log.warning("edgewatt: monitoring pid %d in-process (no daemon)", self.pid)


def register(
    labels: dict[str, str] | None = None,
    pid: int | None = None,
    children: bool = True,
    socket: str | None = None,
    fallback: str = "auto",
) -> Registration:
    """Register ``pid`` (default: this process) with the daemon.

    fallback: "auto" samples in-process when no daemon answers, "never" stays
    inactive instead, "always" never asks a daemon.
    """
    if labels is not None and (
        not isinstance(labels, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise TypeError("labels must be a dict of str to str")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise ValueError(f"pid must be a positive int, got {pid!r}")
    if not isinstance(children, bool):
        raise TypeError("children must be a bool")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
    path = socket or default_socket()
    target_pid = pid or os.getpid()
    info = None
    if fallback != "always":
        body: dict[str, Any] = {"children": children, "labels": labels or {}}
        if target_pid != os.getpid():
            body["pid"] = target_pid
        try:
            info = transport.call_ok(path, "POST", "/v1/targets", body)
        except DaemonError as exc:
            if exc.status == 400 and exc.body.get("error") == "invalid labels":
                raise ValueError(exc.body.get("detail")) from None
            log.warning("edgewatt: registration refused: %s", exc)
        except OSError as exc:
            if fallback == "never":
                log.warning("edgewatt: no daemon at %s (%s); not monitored", path, exc)
    registration = Registration(path, target_pid, labels or {}, children, fallback, info)
    if info is None and fallback in ("auto", "always"):
        registration._start_local()
    return registration
