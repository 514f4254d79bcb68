"""Who may do what with targets: who may register a process or a cgroup, who may act
on a target, and the bounds on how many run and how long the exited are kept. Root
is exempt from all but the table's total: its registrations are the administrator's."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.sampling.procfs import ProcHandle
from edgewatt.core.targets.errors import Forbidden, TooMany
from edgewatt.core.targets.target import Target

if TYPE_CHECKING:  # cgroups are the daemon's, on Linux: the client never loads them
    from edgewatt.core.sampling.cgroup_names import CgroupName
    from edgewatt.core.sampling.cgroups import Cgroup


# Registrations one target may hold at once (the state file keeps the count).
MAX_HOLDERS = 1_000_000


def check_process(handle: ProcHandle, uid: int) -> None:
    """Forbidden (the handle closed) unless ``uid`` may watch the process: the kernel's
    rule for reading its /proc files (ProcHandle.refuses)."""
    reason = handle.refuses(uid) if uid != 0 else None
    if reason is not None:
        handle.close()
        raise Forbidden("not your process", reason)


def check_cgroup(name: CgroupName, cgroup: Cgroup, uid: int, gids: frozenset[int]) -> None:
    """Forbidden unless ``uid`` (in groups ``gids``) may watch ``cgroup``: root any, a
    user the cgroups they own (a delegated subtree), the docker group docker's
    containers, as its socket lets it run them anyway (cgroup_names.refusal)."""
    from edgewatt.core.sampling.cgroup_names import refusal

    reason = refusal(name, cgroup, uid, gids)
    if reason is not None:
        raise Forbidden("not your cgroup", reason)


def check_owner(target: Target, uid: int) -> None:
    """Forbidden unless ``uid`` registered ``target`` (or is root)."""
    if uid != 0 and uid != target.uid:
        raise Forbidden("not your target", f"target {target.id} belongs to uid {target.uid}")


def hold(target: Target, uid: int, labels: dict[str, str], children: bool) -> list[dict[str, Any]]:
    """One more registration of ``target`` by ``uid``: joining is acting on the target,
    so its registrant's or root's alone; ``labels`` joined (Target.join), what was not
    taken returned."""
    check_owner(target, uid)
    if target.holders >= MAX_HOLDERS:
        raise TooMany("too many holders", f"target {target.id} has {MAX_HOLDERS}")
    conflicts = target.join(labels, children)
    target.holders += 1
    return conflicts


@dataclass(frozen=True, **SLOTS)
class Limits:
    """The table's bounds; a reload replaces them whole, for what comes next (a smaller
    max_targets refuses new registrations, it ends no running target; a new history
    length holds for targets registered from then on)."""

    max_targets: int  # running at once, all users together; also exited ones kept
    history_samples: int  # rows each new target's history keeps
    exited_retention_s: float  # how long an exited target stays readable
    max_targets_per_uid: int | None = None  # running at once per user (None: max_targets)

    def refusal(self, running_uids: list[int], uid: int) -> TooMany | None:
        """Why ``uid`` may not add a running target beside those of ``running_uids``
        (one entry per running target), None when it may."""
        if len(running_uids) >= self.max_targets:
            return TooMany("too many targets", f"at most {self.max_targets} may run at once")
        per_uid = self.max_targets_per_uid or self.max_targets
        if uid != 0 and running_uids.count(uid) >= per_uid:
            return TooMany("too many targets", f"at most {per_uid} per user may run at once")
        return None

    def expired(self, exited: Iterable[Target], now: float) -> list[str]:
        """The ids of exited targets to forget at ``now``: those past the retention and
        the oldest beyond max_targets of them, so churn cannot grow the table."""
        oldest_first = sorted(exited, key=lambda t: t.exited_at or 0.0)
        excess = max(0, len(oldest_first) - self.max_targets)
        return [
            t.id
            for n, t in enumerate(oldest_first)
            if n < excess or now - (t.exited_at or 0.0) > self.exited_retention_s
        ]
