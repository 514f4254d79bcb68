"""A pass over one target's members: who is there now, read, and who departed.

``membership.py`` says who belongs (the lineage); this module opens and reads them each
pass, parents before children, finds new children through the parent links where the
events are absent or were lost, and lists the members that departed with the member
that reaps them. What a departed member's figures become is ``departures.py``'s.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.facts.member_counters import Member, MemberReader
from edgewatt.core.facts.membership import Lineage
from edgewatt.core.facts.procfs import NoSuchProcess, ProcHandle, Stat

# Departed members remembered, so that a zombie already counted is not let back in
# by a walk of the parent links (bounded: a target may fork millions over its life).
MAX_DEPARTED = 4096

# (pid, its member as last read or None where never read, the pid that reaps it);
# a runtime alias: Python 3.8's builtins take no [...]
Departed = typing.Tuple[int, typing.Optional[Member], int]


@dataclass
class Walked:
    """One pass's members: read, gone, or not read yet."""

    live: dict[int, tuple[Member, Stat]]
    departed: list[Departed]  # read before, gone now: deepest first
    never_seen: list[Departed]  # born and gone between two passes
    unseen: set[int]  # gone from /proc before their first read: their exit event is coming


class TreeWalk:
    """The members of one target, as of the last pass (:meth:`walk`, then :meth:`done`
    once their figures are settled: the settling reads the members as they were)."""

    def __init__(
        self, root: ProcHandle, lineage: Lineage, reader: MemberReader, *, children: bool, proc: str
    ) -> None:
        self.root = root
        self.lineage = lineage
        self._reader = reader
        self._children = children
        self._proc = proc
        self.members: dict[int, Member] = {}
        self.unseen: set[int] = set()  # members gone from /proc before their first read
        self._departed: dict[int, int] = {}  # pid -> start ticks: never let back in
        self.exact = True  # no member came and went unseen (events lost, none came)

    def walk(
        self, children_of: Callable[[int], list[int]], *, first: bool, recheck: bool
    ) -> Walked:
        lineage = self.lineage
        exited = lineage.take_exited()
        if lineage.events and lineage.lossy and not first:
            self.exact = False  # events were lost: a member may have come and gone unseen
        # Parent links: on the first pass, and where events are absent or were lost.
        walk = self._children and (lineage.lossy or first)
        # With the events whole since the last pass, only its exit event takes a member
        # out. One forked before this pass drained the events, then exited and reaped
        # before its first read, has its exit event in the next drain: it stays in,
        # unread, until that event brings the kernel's exit record.
        whole = lineage.events and not lineage.lossy and not first
        unseen: set[int] = set()
        live: dict[int, tuple[Member, Stat]] = {}
        departed: list[Departed] = []
        # Parents before children: a zombie reaped between the two reads is then in
        # neither (the ratchet in departures.py keeps the total), never in both.
        queue = sorted(lineage.pids, key=self.depth, reverse=True)
        while queue:
            pid = queue.pop()
            if pid in live:
                continue
            known = self.members.get(pid)
            opened = self._open(pid, known)
            member = None
            if opened is not None:
                before = self.members.get(opened[0].pid)
                member = self._reader.read(*opened, before, recheck)
            if opened is None or member is None:  # gone, or never a member after all
                if known is None and whole and pid not in self.unseen:
                    unseen.add(pid)  # exited and reaped unread: its exit event is coming
                    continue
                if known is None and pid in self.unseen:
                    self.exact = False  # no exit event came for it: its figures are lost
                lineage.discard(pid)
                if known is not None:
                    departed.append((pid, known, exited.pop(pid, known.ppid)))
                continue
            live[pid] = (member, opened[1])
            if walk:
                for child in children_of(pid):
                    if child not in lineage.pids and child not in self._departed | exited.keys():
                        lineage.add(child, pid)
                        queue.append(child)
        # Members the events say exited, that this pass did not read.
        gone = {pid for pid, _, _ in departed}
        for pid, known in self.members.items():
            if pid not in live and pid not in gone:
                self._reader.read_zombie(known)
                departed.append((pid, known, exited.pop(pid, known.ppid)))
        # Born and gone between two passes: only the events knew them.
        never_seen: list[Departed] = [(pid, None, parent) for pid, parent in exited.items()]
        # Children before their parents: a child's figures reach its reaper first.
        departed.sort(key=lambda d: -self.depth(d[0]))
        return Walked(live, departed, never_seen, unseen)

    def done(self, walked: Walked) -> None:
        """The pass's members become the known ones; the departed are remembered (a
        zombie already counted is never let back in) and their handles let go."""
        for pid, known, _ in walked.departed:
            assert known is not None
            self._departed[pid] = known.handle.start_ticks
            if len(self._departed) > MAX_DEPARTED:  # the oldest are long reaped
                del self._departed[next(iter(self._departed))]
            if known.handle is not self.root:
                known.handle.close()
        self.members = {pid: m for pid, (m, _) in walked.live.items()}
        self.unseen = walked.unseen

    def depth(self, pid: int) -> int:
        """How far a member is from the target's root by the last known parent links,
        read or, for one not read yet, from its fork (0 for the root and for members
        re-parented outside the target)."""
        depth = 0
        members, parents = self.members, self.lineage.parents
        while depth <= len(members) + len(parents):
            member = members.get(pid)
            pid = member.ppid if member is not None else parents.get(pid, 0)
            if pid not in members and pid not in parents:
                return depth
            depth += 1
        return depth

    def _open(self, pid: int, known: Member | None) -> tuple[ProcHandle, Stat] | None:
        """The member's handle and a fresh stat, or None when it is gone."""
        if known is not None:
            try:
                return known.handle, known.handle.stat()
            except NoSuchProcess:
                return None
        if pid == self.root.pid and not self.members and pid not in self._departed:
            handle = self.root
        else:
            try:
                handle = ProcHandle(pid, self._proc)
            except NoSuchProcess:
                return None
            if self._departed.get(pid) == handle.start_ticks:
                handle.close()  # a zombie already counted as departed
                return None
        try:
            return handle, handle.stat()
        except NoSuchProcess:
            if handle is not self.root:
                handle.close()
            return None

    def close(self) -> None:
        for member in self.members.values():
            if member.handle is not self.root:
                member.handle.close()
        self.members = {}
