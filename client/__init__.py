"""edgewatt client: register the calling process with the local edgewatt daemon.

    from edgewatt import client
    with client.register(labels={"run": "resnet-42"}) as reg:
        with reg.phase("epoch-1"):
            train_one_epoch()
        print(reg.summary())

Importing this package costs only the standard library. With a daemon answering,
the daemon is the only sampler and no thread is started here. With none (or when it
disappears), the process samples itself with the daemon's own code: same figures,
same keys, one warning. The heflwr-style monitors read through the same
:class:`Registration`, so there is one rule for both (see Registration). Monitoring
never raises into the caller; only wrong arguments do (TypeError/ValueError),
because those are the caller's bug.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from edgewatt.client._track import Measurement, track
from edgewatt.core import transport
from edgewatt.core.transport import DaemonError, default_socket, find_daemon

__all__ = [
    "DaemonError",
    "Measurement",
    "Registration",
    "default_socket",
    "find_daemon",
    "register",
    "track",
]

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

    ``mode`` is "daemon" (the daemon samples it), "local" (this process samples it)
    or "inactive" (nothing samples it: no daemon and fallback="never").

    The one rule for losing the daemon: when its socket stops answering, or it no
    longer knows the target (404), the registration switches to in-process sampling
    once (fallback="auto"; with "never" it goes inactive), with one warning, and stays
    there: the summary then covers the time since the switch. A new registration
    looks for the daemon again.
    """

    def __init__(
        self,
        socket_path: str,
        pid: int,
        labels: dict[str, str],
        children: bool,
        fallback: str,
        info: dict[str, Any] | None,
        *,
        interval: float = 1.0,
        power: bool = True,
        sample_on_read: bool = False,
        network: bool = False,
    ) -> None:
        self.socket = socket_path
        self.pid = pid
        self.labels = labels
        self.children = children
        self.fallback = fallback
        self.info = info or {}
        self.interval = interval
        self.power = power
        # In-process: a sampling thread at ``interval`` (register()), or one pass per
        # reading() (a monitor, whose own loop keeps the cadence).
        self.sample_on_read = sample_on_read
        self.network = network  # in-process: count the process's own TCP bytes too
        self._local: Any = None
        self._lock = threading.Lock()
        # One connection kept open for this registration's requests (transport.py).
        self._connection = transport.Connection(socket_path)
        self._failing: set[str] = set()  # calls whose failure was already logged
        # When the daemon was lost (unix s), why, and what samples since ("in-process"
        # or "nothing"); None while it answers.
        self.lost: tuple[float, str, str] | None = None

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

    def helper_pids(self) -> set[int]:
        """The processes in-process sampling runs for its power readings (none with a
        daemon): children of this process that are not the monitored work's."""
        local = self._local
        return local.helper_pids() if local is not None else set()

    def stats(self) -> dict[str, Any]:
        """The latest sample of this process (units: README, "Registration API")."""
        described = self._call(
            "stats", lambda: self._daemon("GET", ""), lambda local: {"latest": local.stats()}
        )
        return (described or {}).get("latest") or {}

    def summary(self) -> dict[str, Any]:
        """What the process consumed while registered, and per phase, to now (a
        sample is taken at the call)."""
        return (
            self._call("summary", lambda: self._daemon("GET", "/summary?fresh=1"), _summary) or {}
        )

    def reading(self) -> Any:
        """The latest raw reading (a monitor's input), or None when there is none yet."""
        from edgewatt.client._readings import (
            reading_after_exit,
            reading_from_api,
            reading_from_snapshot,
        )

        def daemon() -> Any:
            target = self._daemon("GET", "?fresh=1")  # sampled now, at the caller's cadence
            host = self._connection.call_ok("GET", "/v1/host")
            return reading_from_api(target, host)

        def local(sampler: Any) -> Any:
            snapshot = sampler.sample() if self.sample_on_read else sampler.snapshot()
            reading = reading_from_snapshot(snapshot)
            if reading is None and sampler.exited():
                reading = reading_after_exit(snapshot, sampler.stats())
            return reading

        return self._call("reading", daemon, local)

    def phase(self, name: str) -> _Phase:
        """Start a named phase (an epoch, a round); it ends when the next one starts, or
        at the end of a ``with`` block."""
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ValueError("phase name must be a string of 1 to 128 characters")
        self._call(
            "phase",
            lambda: self._daemon("POST", "/phase", {"name": name}),
            lambda local: local.phase(name),
        )
        return _Phase(self, name)

    def _end_phase(self) -> dict[str, Any] | None:
        """End the running phase; its figures (the summary's phase item), or None."""
        ended = self._call(
            "phase",
            lambda: self._daemon("DELETE", "/phase").get("phase"),
            lambda local: local.end_phase(),
        )
        return ended if isinstance(ended, dict) else None

    def close(self) -> None:
        """Unregister (with a daemon) or stop the local sampler."""
        with self._lock:
            local, self._local = self._local, None
        if local is not None:
            local.stop()
        elif self.info.get("id"):
            try:
                self._daemon("DELETE", "")
            except (OSError, DaemonError) as exc:
                log.warning("edgewatt: unregistering %s failed: %s", self.info["id"], exc)
        self._connection.close()
        self.info = {}

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------

    def _call(self, what: str, daemon: Callable[[], Any], local: Callable[[Any], Any]) -> Any:
        """``daemon()`` while the daemon samples, ``local(sampler)`` once this process
        does; the switch between them is the one rule in the class docstring."""
        try:
            if self._local is None and self.info.get("id"):
                try:
                    result = daemon()
                except OSError as exc:
                    self._lost_daemon(f"stopped answering ({exc})")
                except DaemonError as exc:
                    if exc.status != 404:
                        raise
                    self._lost_daemon("no longer knows the target")
                else:
                    self._failing.discard(what)
                    return result
            sampler = self._local
            result = local(sampler) if sampler is not None else None
            self._failing.discard(what)
            return result
        except Exception as exc:  # monitoring must never break the caller
            if what not in self._failing:  # once per run of failures
                self._failing.add(what)
                log.warning("edgewatt: %s failed: %s", what, exc)
            return None

    def _daemon(self, method: str, sub: str, body: Any = None) -> Any:
        path = f"/v1/targets/{self.info['id']}{sub}"
        return self._connection.call_ok(method, path, body)

    def _lost_daemon(self, why: str) -> None:
        self.info = {}
        at = time.time()
        if self.fallback == "auto":
            self._start_local(f"the daemon at {self.socket} {why}")
        else:
            log.warning("edgewatt: the daemon at %s %s; pid %d is no longer monitored",
                        self.socket, why, self.pid)  # fmt: skip
        self.lost = (at, why, "in-process" if self._local is not None else "nothing")

    def _start_local(self, why: str | None = None) -> None:
        """Sample in-process; ``why`` (no daemon, or which) goes into the one warning."""
        with self._lock:
            if self._local is not None:
                return
            from edgewatt.client._local import LocalSampler

            try:
                local = LocalSampler(
                    self.pid,
                    labels=self.labels,
                    children=self.children,
                    interval=self.interval,
                    power=self.power,
                    network=self.network,
                )
                self._local = local.start(thread=not self.sample_on_read)
            except Exception as exc:  # e.g. the pid has exited: stay inactive
                log.warning(
                    "edgewatt: %sin-process monitoring unavailable: %s",
                    f"{why}; " if why else "",
                    exc,
                )
                return
        if why is not None:  # None: fallback="always" asked for this, nothing to warn about
            log.warning("edgewatt: %s; monitoring pid %d in-process", why, self.pid)


def _summary(local: Any) -> dict[str, Any]:
    return local.summary()


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
    return _register(labels, pid, children, socket, fallback)


def _register(
    labels: dict[str, str] | None,
    pid: int | None,
    children: bool,
    socket: str | None,
    fallback: str,
    **local_options: Any,
) -> Registration:
    """register(), with the in-process options a monitor sets (interval, power,
    sample_on_read, network) and ``cgroup``: the daemon measures that cgroup (`edgewatt run
    --cgroup` put the command in it); in-process, the pid's tree is sampled as ever."""
    cgroup = local_options.pop("cgroup", None)
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
    target_pid = pid or os.getpid()
    info = None
    why = None  # why no daemon samples it; None where fallback="always" asked for that
    found = None if fallback == "always" else transport.find_daemon(socket)
    path = found.path if found and found.path else transport.candidates(socket)[0][0]
    if found is not None and found.path is None:
        why = f"no daemon answering at {found.looked}"
    elif found is not None:
        body: dict[str, Any] = {"labels": labels or {}}
        if cgroup is not None:  # a cgroup is counted whole: no children flag
            body["cgroup"] = cgroup
        else:
            body["children"] = children
            if target_pid != os.getpid():
                body["pid"] = target_pid
        try:
            info = transport.call_ok(path, "POST", "/v1/targets", body)
        except DaemonError as exc:
            if exc.status == 400 and exc.body.get("error") == "invalid labels":
                raise ValueError(exc.body.get("detail")) from None
            why = f"the daemon at {path} refused the registration: {exc}"
        except OSError as exc:
            why = f"the daemon at {path} stopped answering ({exc})"
    registration = Registration(
        path, target_pid, labels or {}, children, fallback, info, **local_options
    )
    if info is None:
        if fallback == "never":
            log.warning("edgewatt: %s; pid %d is not monitored", why, target_pid)
        else:
            registration._start_local(why)
    return registration
