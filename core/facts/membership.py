"""Who belongs to which target: the one home of that rule.

A target registered with children is its process and everything that process forked,
transitively, until each exits, wherever it is re-parented: to init, to a subreaper
inside the target (tini, a supervisor) or outside it (``edgewatt run``). Two ways to
learn it, and :attr:`Membership.mode` says which applies:

- ``lineage``: the kernel's fork and exit events (``proc_events.py``, CAP_NET_ADMIN),
  applied in the order they happened, so a double fork between two passes is seen.
  Only its exit event takes a member out: one reaped before a pass could read it
  stays in until that event comes (``departures.py`` then counts its exit record).
- ``parent-links``: without the capability, the parent links a pass sees in /proc. A
  member stays a member when re-parented, but a process whose whole chain to the
  target ended between two passes (a double fork whose middle exited at once) is
  never found.

After an overflow of the events socket, parent links are walked as well until the
events are whole again (the next pass). Reading the members each pass is
``tree_walk.py``'s, the accounting of a departed member's figures (counted once,
whatever the order of exits) ``departures.py``'s; this module only says who is in.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

from edgewatt.core.kernel.proc_events import ProcEvents

log = logging.getLogger(__name__)

LINEAGE = "lineage"
PARENT_LINKS = "parent-links"


class Lineage:
    """One target's members as the events tell them (or as a tree adds them)."""

    def __init__(self, owners: dict[int, set[Lineage]], root: int, events: bool) -> None:
        self._owners = owners
        self.pids: set[int] = set()
        self.parents: dict[int, int] = {}  # member -> its parent when it joined
        # Members that exited since the tree last took them: pid -> the parent at its
        # exit (who reaps it; 0 where the kernel does not say).
        self.exited: dict[int, int] = {}
        self.events = events
        self.lossy = not events  # parent links must be walked (no events, or lost ones)
        self.add(root)

    def add(self, pid: int, parent: int = 0) -> None:
        self.pids.add(pid)
        self.parents[pid] = parent
        self._owners.setdefault(pid, set()).add(self)

    def discard(self, pid: int) -> None:
        self.pids.discard(pid)
        self.parents.pop(pid, None)
        owners = self._owners.get(pid)
        if owners is not None:
            owners.discard(self)
            if not owners:
                del self._owners[pid]

    def take_exited(self) -> dict[int, int]:
        exited, self.exited = self.exited, {}
        return exited

    def close(self) -> None:
        for pid in list(self.pids):
            self.discard(pid)


class Membership:
    """Every target's lineage, fed by one events socket (or none)."""

    def __init__(self, events: ProcEvents | None = None) -> None:
        self.events = events
        self._owners: dict[int, set[Lineage]] = {}  # pid -> the lineages holding it
        self._lineages: dict[Hashable, Lineage] = {}

    @property
    def mode(self) -> str:
        return LINEAGE if self.events is not None else PARENT_LINKS

    @property
    def overflows(self) -> int:
        return self.events.overflows if self.events is not None else 0

    def track(self, key: Hashable, root: int) -> Lineage:
        lineage = self._lineages.get(key)
        if lineage is None:
            lineage = self._lineages[key] = Lineage(self._owners, root, self.events is not None)
        return lineage

    def forget(self, key: Hashable) -> None:
        lineage = self._lineages.pop(key, None)
        if lineage is not None:
            lineage.close()

    def update(self) -> None:
        """Apply the events since the last pass, in order (once per pass, first)."""
        if self.events is None:
            return
        try:
            # Every fork on the host arrives: with no target to follow, none is decoded.
            events, overflowed = self.events.drain(decode=bool(self._lineages))
        except OSError as exc:  # never seen; the parent links then stand in
            log.warning("reading process events failed: %s", exc)
            events, overflowed = [], True
        for lineage in self._lineages.values():
            lineage.lossy = overflowed
        owners = self._owners
        for event in events:
            if event.kind == "fork":
                for lineage in list(owners.get(event.parent, ())):
                    lineage.add(event.pid, event.parent)
            else:
                for lineage in list(owners.get(event.pid, ())):
                    lineage.discard(event.pid)
                    lineage.exited[event.pid] = event.parent

    def close(self) -> None:
        for key in list(self._lineages):
            self.forget(key)
        if self.events is not None:
            self.events.close()
