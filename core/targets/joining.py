"""Which cgroup target a registering process joins: a process `edgewatt run` put in a
cgroup of its own is counted there whole (its short connections too), so registering
it, or a process below it, joins that target rather than making a second one."""

from __future__ import annotations

from typing import Iterable

from edgewatt.core.targets.target import Target


def joinable(targets: Iterable[Target], uid: int) -> list[Target]:
    """The running cgroup targets ``uid`` may join: its own, or any for root (another
    user's process there gets a process target of its own)."""
    return [
        t
        for t in targets
        if t.cgroup_name is not None and t.exited_at is None and uid in (0, t.uid)
    ]


def nearest(targets: Iterable[Target], path: str | None, uid: int) -> Target | None:
    """The joinable target whose cgroup is ``path`` or holds it, the deepest; None where
    there is none (``path`` None: the process's cgroup was not read)."""
    if path is None:
        return None
    holding = [t for t in joinable(targets, uid) if t.cgroup is not None and within(path, t.cgroup)]
    return max(holding, key=lambda t: len(t.cgroup or ""), default=None)


def within(path: str, cgroup: str) -> bool:
    """Whether cgroup v2 path ``path`` is ``cgroup`` or below it."""
    return cgroup == "/" or path == cgroup or path.startswith(cgroup.rstrip("/") + "/")
