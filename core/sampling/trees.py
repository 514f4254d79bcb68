"""The process-tree contributor: each target's reader (a process and its descendants,
or a cgroup), with the kernel's exit records and process events where the daemon has
them (taskstats.py, membership.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgewatt.core.facts import cgroups
from edgewatt.core.facts.cgroups import Cgroup, CgroupGone, CgroupTree, InvalidCgroup, NotTheirs
from edgewatt.core.facts.membership import Membership
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.kernel.taskstats import TaskExits
from edgewatt.core.platforms import Platform, Tree
from edgewatt.core.sampling.contributors import Figures, Status
from edgewatt.core.sampling.tracked import TargetState

if TYPE_CHECKING:
    from edgewatt.core.lookups import Lookups
    from edgewatt.core.targets import Target

# Seconds a container's or unit's target waits for its cgroup to come back (a restart:
# podman and docker take under a second, a unit its RestartSec) before it ends.
RESTART_GRACE_S = 10.0
# Seconds between two lookups of a gone cgroup's name (each runs a runtime's CLI or
# walks the cgroup tree): at most 10 in a restart's grace, whatever the interval.
FOLLOW_LOOKUP_EVERY_S = 1.0


class TargetEnded(Exception):
    """A target ends before its reader opens; the message says why (its summary)."""


class ProcessTrees:
    """Opens targets' readers; as a contributor, takes the kernel's exit records and
    process events at each pass's start and gives a cgroup target's cgroup figures."""

    name = "reading cgroup accounts"
    sets = ("cgroup", "cgroup_memory")
    counts = "cgroup"

    def __init__(
        self,
        platform: Platform,
        *,
        exits: TaskExits | None = None,
        membership: Membership | None = None,
        cgroup_mounts: cgroups.Mounts | None = None,
    ) -> None:
        self.platform = platform
        self.exits = exits  # the kernel's exit records: exact figures at a target's exit
        self.membership = membership or Membership()  # who belongs to which target
        self._cgroup_mounts = cgroup_mounts  # read at the first cgroup target
        self.proc = getattr(platform, "proc", "/proc")  # cgroup members' stat files
        self.logical_cpus = platform.logical_cpus()

    def open(self, target: Target, lookups: Lookups) -> Tree | None:
        """The target's reader; None while it has no live handle. TargetEnded where
        its cgroup is gone and its name names none of the registrant's."""
        if target.cgroup_name is not None:
            return self._cgroup_tree(target, lookups)
        if target.handle is None:
            return None
        return self.platform.process_tree(
            target.handle,
            children=target.children,
            logical_cpus=self.logical_cpus,
            lineage=self.membership.track(target.id, target.pid) if target.children else None,
            exits=self.exits,
        )

    def _cgroup_tree(self, target: Target, lookups: Lookups) -> CgroupTree:
        if self._cgroup_mounts is None:
            self._cgroup_mounts = cgroups.mounts()
        mounts, name = self._cgroup_mounts, target.cgroup_name
        assert name is not None

        from edgewatt.core.facts import cgroup_names  # the daemon's alone (grp)

        def locate() -> Cgroup | None:
            """The cgroup the name names now, if the registrant may have it (checked
            as at registration: NotTheirs says why not); None while its user's lookup
            bound holds it back (lookups.py)."""
            if not lookups.follow(target.uid):
                return None
            try:
                found = cgroup_names.locate(name, mounts, uid=target.uid)
            except (InvalidCgroup, OSError):
                return None
            refused = cgroup_names.refusal(name, found, target.uid, target.gids)
            if refused is not None:
                raise NotTheirs(refused)
            return found

        # A plain cgroup path ends with its cgroup; a container or service restarting
        # has none for a moment: its target waits for the next one.
        follow = locate if name.kind != "cgroup" else None
        try:
            cgroup: Cgroup | None = Cgroup(target.cgroup or "", mounts)
        except (InvalidCgroup, CgroupGone, OSError):
            try:
                cgroup = follow() if follow is not None else None
            except NotTheirs as refused:
                raise TargetEnded(
                    f"its name now names a cgroup not the registrant's: {refused}"
                ) from None
        if cgroup is None:
            raise TargetEnded(f"its cgroup {target.cgroup} is gone")
        return CgroupTree(
            cgroup,
            self.logical_cpus,
            resolve=follow,
            proc=self.proc,
            restart_grace_s=RESTART_GRACE_S,
            lookup_every_s=FOLLOW_LOOKUP_EVERY_S,
            # A plain path may be `edgewatt run`'s, whose root's exit status is known.
            exits=self.exits if name.kind == "cgroup" else None,
        )

    def abandoned(self, tree: Tree, reading: TreeReading) -> str | None:
        """Why a cgroup target ends though its cgroup is there: `edgewatt run --cgroup`
        was killed (SIGKILL) before it could unregister; its emptied cgroup and target
        go, as it would have removed them. None: it goes on."""
        if not isinstance(tree, CgroupTree) or reading.pids:
            return None
        if not tree.cgroup.run_is_gone(self.proc):
            return None
        removed = "removed" if tree.cgroup.remove() else "left in place"
        return f"its edgewatt run is gone and its cgroup is empty ({removed})"

    def begin(self) -> None:
        if self.exits is not None:
            self.exits.update()
        self.membership.update()

    def contribute(self, states: Sequence[TargetState]) -> Figures:
        figures = {}
        for state in states:
            tree = state.tree
            if isinstance(tree, CgroupTree) and state.reading is not None:
                usage = tree.usage
                memory = (usage.memory_bytes, usage.memory_peak_bytes) if usage else (None, None)
                figures[state.target.id] = {"cgroup": tree.cgroup.path, "cgroup_memory": memory}
        return figures

    def forget(self, target_id: str) -> None:
        self.membership.forget(target_id)

    def status(self) -> Status:
        overflows = {}
        if self.exits is not None:
            overflows["taskstats"] = self.exits.overflows
        if self.membership.events is not None:
            overflows["proc_events"] = self.membership.overflows
        return Status(overflows=overflows)

    def close(self) -> None:
        if self.exits is not None:
            self.exits.close()
        self.membership.close()
        self.platform.close()
