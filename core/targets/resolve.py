"""What a registration names, pinned and checked against the caller's rights: a live
process (its handle, so a reused pid cannot pass for it) or the cgroup a name names
now (a container's or unit's name looked up within the user's bounds)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.procfs import NoSuchProcess, ProcHandle
from edgewatt.core.lookups import LookupRefused, Lookups
from edgewatt.core.targets.access import check_cgroup, check_process
from edgewatt.core.targets.errors import TargetError, TooManyLookups

if TYPE_CHECKING:  # cgroups are the daemon's, on Linux: the client never loads them
    from edgewatt.core.facts.cgroup_names import CgroupName
    from edgewatt.core.facts.cgroups import Cgroup


def _cgroup_of(pid: int, proc: str) -> str | None:
    """The process's cgroup v2 path, None where it has none or is gone."""
    from edgewatt.core.facts import cgroups

    try:
        return cgroups.cgroup_of(pid, proc)
    except (OSError, ValueError):  # InvalidCgroup is a ValueError
        return None


def _locate(name: CgroupName, uid: int) -> Cgroup:
    from edgewatt.core.facts import cgroup_names, cgroups

    return cgroup_names.locate(name, cgroups.mounts(), uid=uid)


@dataclass(frozen=True, **SLOTS)
class Resolver:
    """The seams between the table and the system: how a pid is pinned, how a cgroup
    name is looked up, and the clock a process's start is read on."""

    boot_time: float  # unix seconds
    clock_ticks: int  # a second, in the kernel's start times
    proc: str = "/proc"
    # open_process(pid, proc, expect_start=...) pins a process's identity: /proc here,
    # psutil in the client where /proc is absent (core/platforms/portable.py).
    open_process: Callable[..., Any] = ProcHandle
    # locate_cgroup(name, uid): the cgroup a name names now for that user.
    locate_cgroup: Callable[[CgroupName, int], Cgroup] = _locate
    # Per-user bounds on name lookups, registrations' and follows' (the sampler's).
    lookups: Lookups = field(default_factory=Lookups)
    # cgroup_of(pid, proc): a process's cgroup v2 path, None where it has none.
    cgroup_of: Callable[[int, str], str | None] = _cgroup_of

    def process(self, pid: int, uid: int, expect_start: int | None = None) -> ProcHandle:
        """The live process ``pid`` pinned (started at ``expect_start`` ticks, where
        given), which ``uid`` may watch; TargetError where there is none, Forbidden
        where it is not theirs."""
        try:
            handle = self.open_process(pid, self.proc, expect_start=expect_start)
        except NoSuchProcess as exc:
            raise TargetError("no such process", f"pid {pid} does not exist") from exc
        check_process(handle, uid)
        return handle

    def cgroup_path(self, handle: ProcHandle) -> str | None:
        """The cgroup v2 path of the pinned process, None where it has none; read by its
        pid, then the handle read again: a pid reused meanwhile is never taken for it."""
        path = self.cgroup_of(handle.pid, self.proc)
        try:
            handle.stat()
        except NoSuchProcess:
            return None
        return path

    def start_time(self, start_ticks: int) -> float:
        """A process's start in unix seconds, from its start in ticks since boot."""
        return self.boot_time + start_ticks / self.clock_ticks

    def cgroup(self, name: CgroupName, uid: int, gids: frozenset[int], limited: bool) -> Cgroup:
        """The cgroup ``name`` names now, which ``uid`` may watch. ``limited``: the
        user's lookup bounds hold (TooManyLookups beyond them); a name (not a path)
        runs a runtime's CLI or walks the tree, but a registration the daemon restores
        from its state file is not bounded."""
        bounded = name.kind != "cgroup" and limited
        key = f"{name.display} {name.container_id}"
        try:
            with self.lookups.bounded(uid, key) if bounded else contextlib.nullcontext():
                cgroup = self.locate_cgroup(name, uid)
        except LookupRefused as exc:
            raise TooManyLookups(exc.detail, exc.retry_s) from None
        except (ValueError, OSError) as exc:  # InvalidCgroup is a ValueError
            raise TargetError("no such cgroup", str(exc)) from None
        check_cgroup(name, cgroup, uid, gids)
        return cgroup
