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
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

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

if TYPE_CHECKING:
    from edgewatt.client._samples import Reading

log = logging.getLogger(__name__)
T = TypeVar("T")

FALLBACKS = ("auto", "never", "always")


class Options:
    """The process a registration is for, and how in-process sampling measures it.
    (A plain class: a NamedTuple would cost the import 0.3 ms, a dataclass ~6 ms.)"""

    __slots__ = ("children", "interval", "labels", "network", "pid", "power", "sample_on_read")

    def __init__(
        self,
        pid: int,
        labels: dict[str, str],
        children: bool = True,
        interval: float = 1.0,
        power: bool = True,
        sample_on_read: bool = False,
        network: bool = False,
    ) -> None:
        self.pid = pid
        self.labels = labels
        self.children = children
        self.interval = interval  # seconds between in-process passes
        self.power = power
        # One pass per reading() (a monitor, whose own loop keeps the cadence) instead
        # of a sampling thread at ``interval``.
        self.sample_on_read = sample_on_read
        self.network = network  # count the process's own TCP bytes too


class Backend(Protocol):
    """What samples a registered process: the daemon (:class:`DaemonBackend`) or this
    process (``client._local.LocalSampler``). Its calls may raise; :class:`Registration`
    keeps that from the caller and applies the one rule for losing the daemon."""

    mode: str  # "daemon" or "local"

    @property
    def id(self) -> str: ...

    @property
    def info(self) -> dict[str, Any]: ...  # the daemon's registration answer; {} in-process

    def stats(self) -> dict[str, Any]: ...  # the latest sample; {} before the first

    # To now: a sample is taken at the call; ``final_wait_s``: wait at most that long
    # for the figures to be final (their power readings come after the edges).
    def summary(self, final_wait_s: float = 0.0) -> dict[str, Any]: ...

    def reading(self) -> Reading | None: ...  # a monitor's input, sampled now

    # Starts it at ``depth`` (None: inside every running phase); the depth it took.
    def start_phase(self, name: str, depth: int | None = 0) -> int: ...

    # Ends the running phases at ``depth`` and deeper (None: the innermost); the one at
    # ``depth``'s figures, None if none ran.
    def end_phase(
        self, depth: int | None = None, final_wait_s: float = 0.0
    ) -> dict[str, Any] | None: ...

    def helper_pids(self) -> set[int]: ...  # processes the sampling itself runs

    def close(self) -> None: ...  # unregister, or stop sampling


class DaemonBackend:
    """A target the daemon samples, over one connection kept open (transport.py)."""

    mode = "daemon"

    def __init__(
        self,
        socket_path: str,
        info: dict[str, Any],
        connection: transport.Connection | None = None,
    ) -> None:
        """``connection``: the one the registration went on, kept for what follows."""
        self.socket = socket_path
        self.info = info  # the daemon's answer to POST /v1/targets (or the target's own)
        self._connection = connection or transport.Connection(socket_path)

    @property
    def id(self) -> str:
        return self.info["id"]

    def stats(self) -> dict[str, Any]:
        return self._target("GET", "").get("latest") or {}

    def summary(self, final_wait_s: float = 0.0) -> dict[str, Any]:
        if not final_wait_s:
            return self._target("GET", "/summary?fresh=1")
        path = f"/v1/targets/{self.id}/summary?fresh=1&final={final_wait_s:g}"
        return self._connection.call_ok("GET", path, timeout=_waited(final_wait_s))

    def reading(self) -> Reading | None:
        from edgewatt.client._readings import reading_from_api

        target = self._target("GET", "?fresh=1")  # sampled now, at the caller's cadence
        return reading_from_api(target, self._connection.call_ok("GET", "/v1/host"))

    def start_phase(self, name: str, depth: int | None = 0) -> int:
        body: dict[str, Any] = {"name": name}
        if depth is None:
            body["inside"] = True
        elif depth:
            body["depth"] = depth
        started = self._target("POST", "/phase", body)
        return int(started.get("depth") or 0)

    def end_phase(
        self, depth: int | None = None, final_wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        query = [f"depth={depth}"] if depth is not None else []
        if final_wait_s:
            query.append(f"final={final_wait_s:g}")
        path = f"/v1/targets/{self.id}/phase" + ("?" + "&".join(query) if query else "")
        answer = self._connection.call_ok("DELETE", path, timeout=_waited(final_wait_s))
        ended = answer.get("phase")
        return ended if isinstance(ended, dict) else None

    def helper_pids(self) -> set[int]:
        return set()  # the daemon runs them, outside this process

    def close(self) -> None:
        """Unregister; OSError or DaemonError when the daemon does not confirm it."""
        try:
            self._target("DELETE", "")
        finally:
            self.disconnect()

    def disconnect(self) -> None:
        self._connection.close()

    def _target(self, method: str, sub: str, body: Any = None) -> Any:
        return self._connection.call_ok(method, f"/v1/targets/{self.id}{sub}", body)


def _waited(final_wait_s: float) -> float | None:
    """A request's timeout where the daemon waits up to ``final_wait_s`` for final
    figures (None: the connection's own)."""
    return final_wait_s + transport.REQUEST_TIMEOUT_S if final_wait_s else None


class _Phase:
    """Returned by Registration.phase(): the phase already runs; ``with`` ends it, and
    phases (and tracked calls) started inside the block run inside it."""

    def __init__(self, registration: Registration, name: str, depth: int) -> None:
        self.registration = registration
        self.name = name
        self.depth = depth

    def __enter__(self) -> _Phase:
        self.registration._enter(self.depth)
        return self

    def __exit__(self, *exc: object) -> None:
        self.registration._leave(self.depth)
        self.registration.end_phase(self.depth)


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
        self, socket_path: str, options: Options, fallback: str, backend: Backend | None = None
    ) -> None:
        self.socket = socket_path
        self.options = options
        self.fallback = fallback
        self._backend = backend  # None: inactive
        self._lock = threading.Lock()
        self._failing: set[str] = set()  # calls whose failure was already logged
        # The depths of the phases whose ``with`` blocks run now, outermost first: a
        # phase started inside one runs inside it (docs/reference.md).
        self._blocks: list[int] = []
        # When the daemon was lost (unix s), why, and what samples since ("in-process"
        # or "nothing"); None while it answers.
        self.lost: tuple[float, str, str] | None = None
        self.registered_at = time.time()
        self.no_daemon_at: str | None = None  # where no daemon answered at registration

    @property
    def pid(self) -> int:
        return self.options.pid

    @property
    def backend(self) -> Backend | None:
        """What samples the process now (None: nothing does)."""
        return self._backend

    @property
    def mode(self) -> str:
        backend = self._backend
        return backend.mode if backend is not None else "inactive"

    @property
    def id(self) -> str | None:
        backend = self._backend
        return backend.id if backend is not None else None

    @property
    def info(self) -> dict[str, Any]:
        """The daemon's answer to the registration ({} when it does not sample)."""
        backend = self._backend
        return backend.info if backend is not None else {}

    @property
    def active(self) -> bool:
        return self.mode != "inactive"

    def helper_pids(self) -> set[int]:
        """The processes in-process sampling runs for its power readings (none with a
        daemon): children of this process that are not the monitored work's."""
        return self._call("helper_pids", lambda backend: backend.helper_pids()) or set()

    def stats(self) -> dict[str, Any]:
        """The latest sample of this process (units: README, "Registration API")."""
        return self._call("stats", lambda backend: backend.stats()) or {}

    def summary(self, final_wait_s: float = 0.0) -> dict[str, Any]:
        """What the process consumed while registered, and per phase, to now (a
        sample is taken at the call). Its "final" is false while a window's device
        energy awaits the power reading after its edge (no edge waits for one): with
        ``final_wait_s``, the call waits at most that long for it (the end of a run)."""
        wait = final_wait_s
        found = self._call("summary", lambda backend: backend.summary(wait)) or {}
        if found and self.lost is not None:
            found["covers"] = covers_since_lost(self.lost, self.registered_at)
        elif found:
            found.setdefault("covers", {"whole": True})  # in-process from the start
        return found

    def reading(self) -> Reading | None:
        """The latest raw reading (a monitor's input), or None when there is none yet."""
        return self._call("reading", lambda backend: backend.reading())

    def phase(self, name: str) -> _Phase:
        """Start a named phase (an epoch, a round); it ends when the next one starts at
        its depth, at the end of its ``with`` block, or at :meth:`end_phase`. Inside
        another phase's ``with`` block it runs inside that one, which goes on."""
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ValueError("phase name must be a string of 1 to 128 characters")
        depth = self._blocks[-1] + 1 if self._blocks else 0
        self._call("phase", lambda backend: backend.start_phase(name, depth))
        return _Phase(self, name, depth)

    def end_phase(
        self, depth: int | None = None, final_wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        """End the running phase (the innermost, or those at ``depth`` and deeper); its
        figures (the summary's phase item, "final" as in :meth:`summary`), or None."""
        wait = final_wait_s
        return self._call("phase", lambda backend: backend.end_phase(depth, wait))

    def window(self, name: str) -> int | None:
        """Start phase ``name`` inside every running one (a tracked call, an FL round:
        they never end the phase they run in); its depth, for :meth:`end_phase`."""
        return self._call("phase", lambda backend: backend.start_phase(name, None))

    def _enter(self, depth: int) -> None:
        with self._lock:
            self._blocks.append(depth)

    def _leave(self, depth: int) -> None:
        with self._lock:
            if depth in self._blocks:
                del self._blocks[self._blocks.index(depth) :]

    def close(self) -> None:
        """Unregister (with a daemon) or stop the local sampler."""
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is None:
            return
        try:
            backend.close()
        except (OSError, DaemonError) as exc:
            log.warning("edgewatt: unregistering %s failed: %s", backend.id, exc)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one rule ---------------------------------------------------------------

    def _call(self, what: str, action: Callable[[Backend], T]) -> T | None:
        """``action`` on the backend that samples now; the switch from the daemon to
        in-process is the one rule in the class docstring."""
        try:
            backend = self._backend
            if isinstance(backend, DaemonBackend):
                try:
                    result = action(backend)
                except OSError as exc:
                    self._lost_daemon(backend, f"stopped answering ({exc})")
                except DaemonError as exc:
                    if exc.status != 404:
                        raise
                    self._lost_daemon(backend, "no longer knows the target")
                else:
                    self._failing.discard(what)
                    return result
                backend = self._backend  # in-process now, or none
            result = action(backend) if backend is not None else None
            self._failing.discard(what)
            return result
        except Exception as exc:  # monitoring must never break the caller
            if what not in self._failing:  # once per run of failures
                self._failing.add(what)
                log.warning("edgewatt: %s failed: %s", what, exc)
            return None

    def _lost_daemon(self, daemon: DaemonBackend, why: str) -> None:
        with self._lock:
            if self._backend is daemon:
                self._backend = None
        daemon.disconnect()
        at = time.time()
        if self.fallback == "auto":
            self._start_local(f"the daemon at {self.socket} {why}")
        else:
            log.warning("edgewatt: the daemon at %s %s; pid %d is no longer monitored",
                        self.socket, why, self.pid)  # fmt: skip
        self.lost = (at, why, "in-process" if self._backend is not None else "nothing")

    def _start_local(self, why: str | None = None, said: bool = False) -> None:
        """Sample in-process; ``why`` (no daemon, or which) goes into the one warning
        (``said``: `edgewatt run` gave it already; an info line then)."""
        with self._lock:
            if self._backend is not None:
                return
            from edgewatt.client._local import LocalSampler

            o = self.options
            try:
                local = LocalSampler(
                    o.pid,
                    labels=o.labels,
                    children=o.children,
                    interval=o.interval,
                    power=o.power,
                    network=o.network,
                )
                self._backend = local.start(thread=not o.sample_on_read)
            except Exception as exc:  # e.g. the pid has exited: stay inactive
                log.warning(
                    "edgewatt: %sin-process monitoring unavailable: %s",
                    f"{why}; " if why else "",
                    exc,
                )
                return
        if why is not None:  # None: fallback="always" asked for this, nothing to warn about
            say = log.info if said else log.warning
            say("edgewatt: %s; monitoring pid %d in-process", why, self.pid)


def covers_since_lost(lost: tuple[float, str, str], registered_at: float) -> dict[str, Any]:
    """A summary's "covers" once the daemon was lost (``lost``: when, why, what samples
    since): the figures are the in-process sampler's, from then on only."""
    at, why, then = lost
    when = time.strftime("%H:%M:%S", time.gmtime(at))
    return {
        "whole": False,
        "from": round(at, 3),
        "registered_at": round(registered_at, 3),
        "why": f"the daemon {why} at {when} UTC: the figures cover the time since, "
        f"sampled {then}; the daemon's figures before are lost with it",
    }


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
    return open_registration(labels, pid, children, socket, fallback)


# Set by `edgewatt run` for its command where no daemon answered it, to the sockets it
# looked at (os.pathsep between them): the command's own register() finding none at the
# same ones says so quietly (said once, not twice).
NO_DAEMON_SAID = "EDGEWATT_NO_DAEMON_SAID"


def open_registration(
    labels: dict[str, str] | None,
    pid: int | None,
    children: bool,
    socket: str | None,
    fallback: str,
    *,
    cgroup: str | None = None,
    interval: float = 1.0,
    power: bool = True,
    sample_on_read: bool = False,
    network: bool = False,
    argv: list[str] | None = None,
) -> Registration:
    """register(), with what a monitor's loop (client._loop) sets: the in-process
    :class:`Options`, and ``cgroup``: the daemon measures that cgroup (`edgewatt run
    --cgroup` put the command in it); in-process, the pid's tree is sampled as ever;
    ``argv``: what the pid will exec (`edgewatt run`'s held fork), the daemon's name
    for it until then."""
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
    options = Options(
        pid or os.getpid(), labels or {}, children, interval, power, sample_on_read, network
    )
    info = None
    why = None  # why no daemon samples it; None where fallback="always" asked for that
    found = None if fallback == "always" else transport.find_daemon(socket, keep=True)
    connection = found.connection if found is not None else None
    path = found.path if found and found.path else transport.candidates(socket)[0][0]
    said = False  # whether `edgewatt run` already said why (NO_DAEMON_SAID)
    looked = os.pathsep.join(p for p, _ in transport.candidates(socket))
    if found is not None and found.path is None:
        why = f"no daemon answering at {found.looked}"
        said = os.environ.get(NO_DAEMON_SAID) == looked
    elif connection is not None:
        try:
            info = _post(connection, _request(options, cgroup, argv))
        except DaemonError as exc:
            if exc.status == 400 and exc.body.get("error") == "invalid labels":
                connection.close()
                raise ValueError(exc.body.get("detail")) from None
            why = f"the daemon at {path} refused the registration: {exc}"
        except OSError as exc:
            why = f"the daemon at {path} stopped answering ({exc})"
    if info is not None and info.get("conflicts"):
        # Joined a target registered with other values (`edgewatt run --label`): said
        # once, as the figures go to that target under its labels.
        refused = "; ".join(f"{c.get('field')}: {c.get('why')}" for c in info["conflicts"])
        log.warning("edgewatt: pid %d joined target %s, which keeps its own %s",
                    options.pid, info.get("id"), refused)  # fmt: skip
    daemon = DaemonBackend(path, info, connection) if info is not None else None
    if daemon is None and connection is not None:
        connection.close()
    registration = Registration(path, options, fallback, daemon)
    if found is not None and found.path is None:
        registration.no_daemon_at = looked
    if daemon is None:
        if fallback == "never":
            log.warning("edgewatt: %s; pid %d is not monitored", why, options.pid)
        else:
            registration._start_local(why, said)
    return registration


def _post(connection: transport.Connection, body: dict[str, Any]) -> Any:
    """POST /v1/targets; a daemon that predates the ``command`` field is asked again
    without it (its target is then named after the launcher until the exec)."""
    try:
        return connection.call_ok("POST", "/v1/targets", body)
    except DaemonError as exc:
        if exc.status != 400 or not str(exc.body.get("detail")).startswith("'command'"):
            raise
    return connection.call_ok(
        "POST", "/v1/targets", {k: v for k, v in body.items() if k != "command"}
    )


def _request(options: Options, cgroup: str | None, argv: list[str] | None = None) -> dict[str, Any]:
    """The body of POST /v1/targets."""
    body: dict[str, Any] = {"labels": options.labels}
    if argv:
        body["command"] = argv
    if cgroup is not None:  # a cgroup is counted whole: no children flag
        body["cgroup"] = cgroup
    else:
        body["children"] = options.children
        if options.pid != os.getpid():
            body["pid"] = options.pid
    return body
