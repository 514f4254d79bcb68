"""Who may do what with targets: who may register a process or a cgroup, who may act
on a target, and the bounds on how many run and how long the exited are kept. Root
is exempt from all but the table's total, and has a reserve of it no user can take:
its registrations are the administrator's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.procfs import ProcHandle
from edgewatt.core.labels import (
    MAX_PERSON_LABEL_BYTES,
    MAX_USERS_LABEL_BYTES,
    Room,
)
from edgewatt.core.targets.errors import Forbidden, TooMany
from edgewatt.core.targets.history import MAX_PERSON_PHASES, MAX_USERS_PHASES
from edgewatt.core.targets.target import Identity, Target

if TYPE_CHECKING:  # cgroups are the daemon's, on Linux: the client never loads them
    from edgewatt.core.facts.cgroup_names import CgroupName
    from edgewatt.core.facts.cgroups import Cgroup


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
    from edgewatt.core.facts.cgroup_names import refusal

    reason = refusal(name, cgroup, uid, gids)
    if reason is not None:
        raise Forbidden("not your cgroup", reason)


def check_owner(target: Target, uid: int) -> None:
    """Forbidden unless ``uid`` registered ``target`` (or is root)."""
    if uid != 0 and uid != target.uid:
        raise Forbidden("not your target", f"target {target.id} belongs to uid {target.uid}")


def hold(
    target: Target,
    uid: int,
    labels: dict[str, str],
    children: bool,
    room: Room | None = None,
) -> list[dict[str, Any]]:
    """One more registration of ``target`` by ``uid``: joining is acting on the target,
    so its registrant's or root's alone; ``labels`` joined (Target.join) within
    ``room`` (label_room: the label bytes its registrant may still add; None: root's
    target, unbounded), what was not taken returned."""
    check_owner(target, uid)
    if target.holders >= MAX_HOLDERS:
        raise TooMany("too many holders", f"target {target.id} has {MAX_HOLDERS}")
    conflicts = target.join(labels, children, room)
    target.holders += 1
    return conflicts


def share(uid: int, person: Callable[[int], int]) -> int | None:
    """Whose share a target of ``uid`` counts in: its person's (a user's subordinate
    uids are hers: core/persons.py); None for root's, the administrator's."""
    return None if uid == 0 else person(uid)


def label_room(targets: Iterable[Target], uid: int, person: Callable[[int], int]) -> Room | None:
    """The label bytes a target of ``uid`` may still add beside ``targets`` (the
    table's, running and kept exited: their labels are held either way): her person's
    share, or what all users' leave; None for root."""
    mine = share(uid, person)
    if mine is None:
        return None
    users = ours = 0
    for target in targets:
        owner = share(target.uid, person)
        if owner is not None:
            size = target.identity.held_bytes
            users += size
            ours += size if owner == mine else 0
    person_room = Room(
        MAX_PERSON_LABEL_BYTES - ours, f"at most {MAX_PERSON_LABEL_BYTES} bytes of labels per user"
    )
    users_room = Room(
        MAX_USERS_LABEL_BYTES - users,
        f"at most {MAX_USERS_LABEL_BYTES} bytes of labels for all users together",
    )
    return min(person_room, users_room)


def label_refusal(identity: Identity, room: Room | None) -> TooMany | None:
    """Why a new target's labels and command do not fit ``room`` (label_room), None
    when they do."""
    size = identity.held_bytes
    if room is None or size <= room.left:
        return None
    what = "names and values" + (", and the command" if identity.command else "")
    detail = f"{room.bound} ({what}): {size} asked, {max(0, room.left)} left"
    return TooMany("too many label bytes", detail)


def forget_phases(targets: Iterable[Target], uid: int, person: Callable[[int], int]) -> None:
    """After a phase of ``uid``'s target started: past her person's MAX_PERSON_PHASES
    kept over her targets, her target keeping the most forgets its oldest; past all
    users' MAX_USERS_PHASES, the target of any user keeping the most does (each
    counted in its summary's phases_dropped). Root's are held to MAX_PHASES a target."""
    mine = share(uid, person)
    if mine is None:
        return
    owned = [(share(t.uid, person), t) for t in targets]
    users = [t for owner, t in owned if owner is not None]
    hers = [t for owner, t in owned if owner == mine]
    for group, bound in ((hers, MAX_PERSON_PHASES), (users, MAX_USERS_PHASES)):
        for _ in range(sum(len(t.history.phases) for t in group) - bound):
            max(group, key=lambda t: len(t.history.phases)).history.drop_oldest_phase()


@dataclass(frozen=True, **SLOTS)
class Limits:
    """The table's bounds; a reload replaces them whole, for what comes next (a smaller
    max_targets refuses new registrations, it ends no running target; a new history
    length holds for targets registered from then on). Every per-user bound is per
    person (``share``)."""

    max_targets: int  # running at once, all users together; also exited ones kept
    history_samples: int  # rows each new target's history keeps
    exited_retention_s: float  # how long an exited target stays readable
    max_targets_per_uid: int | None = None  # per person, running and exited (None: max_targets)
    # Label bytes shared out per person and among users (the daemon's table); False:
    # a table of one process's own (the client's in-process one), held to the
    # per-target bounds alone, as nobody else's labels are there to share with.
    label_shares: bool = True

    @property
    def root_reserve(self) -> int:
        """Running slots only root may take: users together run at most the rest."""
        return self.max_targets // 10

    def refusal(self, running: list[int], uid: int, person: Callable[[int], int]) -> TooMany | None:
        """Why ``uid`` may not add a running target beside those of ``running`` (the
        uid of each running target), None when it may."""
        if len(running) >= self.max_targets:
            return TooMany("too many targets", f"at most {self.max_targets} may run at once")
        mine = share(uid, person)
        if mine is None:
            return None
        shares = [s for s in (share(u, person) for u in running) if s is not None]
        users = self.max_targets - self.root_reserve
        if len(shares) >= users:
            detail = (
                f"at most {users} may run at once for users ({self.root_reserve} kept for root)"
            )
            return TooMany("too many targets", detail)
        per_person = self.max_targets_per_uid or self.max_targets
        if shares.count(mine) >= per_person:
            return TooMany("too many targets", f"at most {per_person} per user may run at once")
        return None

    def expired(
        self, exited: Iterable[Target], now: float, person: Callable[[int], int]
    ) -> list[str]:
        """The ids of exited targets to forget at ``now``: those past the retention; a
        person's oldest beyond max_targets_per_uid of hers (root's are bounded by the
        total alone); and while more than max_targets are left, the oldest of whoever
        keeps the most. One person's churn forgets her own, never another's share."""
        kept: dict[int | None, list[Target]] = {}
        gone = []
        for target in sorted(exited, key=lambda t: t.exited_at or 0.0):
            if now - (target.exited_at or 0.0) > self.exited_retention_s:
                gone.append(target.id)
            else:
                kept.setdefault(share(target.uid, person), []).append(target)
        per_person = self.max_targets_per_uid or self.max_targets
        for owner, targets in kept.items():
            excess = len(targets) - per_person if owner is not None else 0
            if excess > 0:
                gone += [t.id for t in targets[:excess]]
                del targets[:excess]
        left = sum(len(targets) for targets in kept.values())
        while left > self.max_targets:
            most = max(kept.values(), key=lambda ts: (len(ts), -(ts[0].exited_at or 0.0)))
            gone.append(most.pop(0).id)
            left -= 1
        return gone
