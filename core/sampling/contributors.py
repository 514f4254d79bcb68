"""What contributes per-target figures to a pass, beside each target's own reader.

The sampler is given its contributors at construction and, each pass, calls them in
order: ``begin`` before any target is read, ``contribute`` once every target is
(network accounting needs them all at once: one socket dump per pass), ``forget``
when a target goes, ``status`` for the pass's counters, ``close`` at the end. A new
per-target figure is a field of ProcessSample and a contributor (or a key of one's
``contribute``), listed in contributor_list.py: see docs/architecture.md, Layout.
"""

from __future__ import annotations

import dataclasses
import logging
import typing  # runtime aliases: Python 3.8's builtins take no [...]
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from edgewatt.core.facts.traffic_counts import NOT_COUNTED
from edgewatt.core.snapshot import ProcessSample

if TYPE_CHECKING:  # cgroup_traffic is the daemon's alone: the client never loads it (fcntl)
    from edgewatt.core.facts.cgroup_traffic import CgroupTraffic
    from edgewatt.core.facts.network import NetworkAccounting
    from edgewatt.core.sampling.tracked import TargetState

log = logging.getLogger(__name__)


class Unchanged:
    """The type of ``UNCHANGED``, its one instance."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


# A target's entry in ``contribute``'s figures: as the last mapping given for it.
UNCHANGED: Final = Unchanged()

# Target id -> its ProcessSample fields, or UNCHANGED (see Contributor).
Figures = typing.Mapping[str, typing.Union[typing.Mapping[str, Any], Unchanged]]

# The targets a contributor counts (its ``counts``), by kind: a cgroup target is one
# registered by its cgroup (Target.cgroup_name), a process target the others.
TARGET_KINDS: Mapping[str, tuple[str, ...]] = {
    "process": ("process",),
    "cgroup": ("cgroup",),
    "any": ("process", "cgroup"),
}


@dataclass(frozen=True)
class Status:
    """A contributor's state, read after each pass."""

    # Kernel notifications lost since start (a listener's buffer overran), by listener.
    overflows: Mapping[str, int] = field(default_factory=dict)
    # Whether what it counts is final at a target's exit (every closed connection's
    # last counts came): an exit sample is "exact" only when each says so.
    exact: bool = True


class Contributor(Protocol):
    """Counts figures of the targets read in a pass. Two rules hold for what
    ``contribute`` hands out, one entry per target it counts:

    - Each entry is a mapping of the target's figures (all the contributor sets for
      it), or ``UNCHANGED``: the figures stand as in the last mapping it gave for that
      target (one it never gave figures is a ValueError naming the contributor). The
      sampler keeps a read-only copy of each mapping, by target, until the target
      goes (``gather``, ``TargetState.given``): a mapping edited after it was handed
      out changes nothing, and a new mapping equal to the last is unchanged too. A
      target whose reading and figures are all unchanged gets a copy of its last
      sample (``TargetState.sample``), the copy path the CPU budget rests on:
      ``UNCHANGED`` keeps it free of any per-target allocation or comparison.
    - Figures are set by name: each key is a ProcessSample field, set on the sample
      as given. A name that is no field raises AttributeError in the pass (Python
      3.10+ by the sample's slots; 3.8 and 3.9 by the check in ``tracked.py``).
    """

    name: str  # what it does, for the log: "<name> failed: <why>"
    # The ProcessSample fields its figures set, and the targets it counts (a key of
    # TARGET_KINDS): checked when the sampler is built (check_declared).
    sets: tuple[str, ...]
    counts: str
    # Optional, True where absent. False: gauges the regular passes keep fresh (PSS);
    # at an edge it is asked only for the targets it never gave figures, and the others
    # keep their last (an edge's cost is then the caller's, and never a dear read),
    # but for targets whose processes are all gone (gather).
    at_edges: bool

    def begin(self) -> None:
        """A pass begins: take what the kernel queued since the last one."""

    def contribute(self, states: Sequence[TargetState]) -> Figures:
        """The figures of the targets read in this pass (each state's ``reading``)."""

    def forget(self, target_id: str) -> None:
        """The target is gone: let go of what is kept about it."""

    def status(self) -> Status: ...

    def close(self) -> None: ...


def check_declared(contributors: Sequence[Contributor]) -> None:
    """Each field a contributor declares is a ProcessSample field, and no two
    contributors set one for the same kind of target (one would overwrite the other's
    figure unseen): ValueError naming the field. A contributor that declares nothing
    (no ``sets``) is not checked."""
    names = {f.name for f in dataclasses.fields(ProcessSample)}
    setters: dict[tuple[str, str], Contributor] = {}
    for contributor in contributors:
        declared = getattr(contributor, "sets", None)
        if declared is None:
            continue
        kinds = TARGET_KINDS.get(contributor.counts)
        if kinds is None:
            raise ValueError(
                f"{contributor.name}: counts {contributor.counts!r}, not one of "
                f"{', '.join(TARGET_KINDS)}"
            )
        for name in declared:
            if name not in names:
                raise ValueError(f"{contributor.name}: {name!r} is not a ProcessSample field")
            for kind in kinds:
                other = setters.setdefault((name, kind), contributor)
                if other is not contributor:
                    raise ValueError(
                        f"{name!r} of {kind} targets is set by two contributors: "
                        f"{other.name}, {contributor.name}"
                    )


def gather(
    contributors: Sequence[Contributor],
    states: Sequence[TargetState],
    edge: bool = False,
    at_edges: bool | None = None,
) -> tuple[dict[str, list[Mapping[str, Any]]], int]:
    """Each contributor's figures for the targets read, by target: one mapping per
    contributor that counted it, not merged; and how many contributors refused this
    pass (OSError: their figures absent, retried next pass, logged). At an ``edge``,
    a contributor not ``at_edges`` is asked only for targets it never gave figures, or
    whose processes are all gone. ``at_edges`` True or False: only the contributors
    whose own ``at_edges`` is that (a pass asks the counters at its instant, the
    gauges after it, once an edge's answer is written); None: all.

    The mappings are the sampler's read-only copies, kept in each target's state by
    the contributor's place in ``contributors`` (``TargetState.given``) and replaced
    only when a contributor hands out figures that differ from them: a mapping of the
    last pass's is the same object while its figures stand, which TargetState.sample
    tells at once."""
    # Each contributor that counted a target, by its place in ``contributors``, and
    # whether the targets it was not asked for keep their last figures (an edge).
    answers: list[tuple[int, Contributor, Figures, bool]] = []
    refused = 0
    for place, contributor in enumerate(contributors):
        counters = getattr(contributor, "at_edges", True)
        if at_edges is not None and counters != at_edges:
            continue
        keeps = edge and not counters
        asked = [s for s in states if place not in s.given or _gone(s)] if keeps else states
        try:
            figures = contributor.contribute(asked) if asked else {}
        except OSError as exc:
            refused += 1
            log.warning("%s failed: %s", contributor.name, exc)
            continue
        if figures or keeps:
            answers.append((place, contributor, figures, keeps))
    merged: dict[str, list[Mapping[str, Any]]] = {}
    for state in states:
        target_id, given = state.target.id, state.given
        kept_now = []
        for place, contributor, figures, keeps in answers:
            fields = figures.get(target_id)
            if fields is None:
                if keeps and place in given:  # not asked at this edge: as they were
                    kept_now.append(given[place])
                continue
            kept = given.get(place)
            if fields is UNCHANGED:
                if kept is None:
                    raise ValueError(
                        f"{contributor.name}: UNCHANGED for target {target_id}, never given figures"
                    )
            elif kept is None or fields != kept:  # a copy: later edits of theirs change nothing
                kept = given[place] = MappingProxyType(dict(fields))
            kept_now.append(kept)
        if kept_now:
            merged[target_id] = kept_now
    return merged, refused


def _gone(state: TargetState) -> bool:
    """No process of it alive: figures kept from a read of processes gone (`edgewatt
    run`'s fork before its exec among them) are asked again, which reads nothing."""
    return state.reading is not None and not state.reading.pids


class TcpAccounting:
    """Process targets' TCP bytes (sock_diag; network.py)."""

    name = "reading TCP socket counters"
    sets = ("network_transmit_bytes", "network_receive_bytes")
    counts = "process"

    def __init__(self, network: NetworkAccounting) -> None:
        self.network = network
        # Each target's bytes (sent, received) as last handed out: UNCHANGED while
        # they do not move.
        self._given: dict[str, tuple[int, int]] = {}

    def begin(self) -> None:
        pass  # the sockets are dumped once every target's members are known

    def contribute(self, states: Sequence[TargetState]) -> Figures:
        pids_of: dict[str, tuple[int, ...]] = {}
        idle = []
        figures: dict[str, Mapping[str, Any] | Unchanged] = {}
        given, unattached = self._given, self.network.unattached
        for s in states:
            reading = s.reading
            if reading is None or s.target.cgroup_name is not None:
                continue
            target_id = s.target.id
            if (
                target_id in unattached
                and target_id in given
                and len(reading.idle_pids) == len(reading.pids)
            ):  # no socket, and no member ran since: its bytes as they were, unread
                figures[target_id] = UNCHANGED
                continue
            pids_of[target_id] = reading.pids
            idle.append(reading.idle_pids)
        counted = self.network.sample(pids_of, idle=frozenset().union(*idle))
        for target_id, pair in counted.items():
            if pair is None:
                continue
            if given.get(target_id) == pair:
                figures[target_id] = UNCHANGED
                continue
            given[target_id] = pair
            figures[target_id] = {
                "network_transmit_bytes": pair[0],
                "network_receive_bytes": pair[1],
            }
        return figures

    def forget(self, target_id: str) -> None:
        self._given.pop(target_id, None)
        self.network.forget(target_id)

    def status(self) -> Status:
        destroyed = self.network.destroyed is not None
        overflows = {"tcp_destroy": self.network.overflows} if destroyed else {}
        return Status(overflows=overflows, exact=self.network.exact)

    def close(self) -> None:
        self.network.close()


class CgroupTrafficCounts:
    """Cgroup targets' traffic (nftables counters; cgroup_traffic.py), or, without
    them (``traffic`` None), why their network figures are absent."""

    name = "reading cgroup traffic counters"
    sets = (
        "network_transmit_bytes",
        "network_receive_bytes",
        "network_unknown",
        "cgroup_packets",
        "network_counts",
    )
    counts = "cgroup"

    def __init__(self, traffic: CgroupTraffic | None, problem: str | None = None) -> None:
        self.traffic = traffic
        self.problem = problem or NOT_COUNTED  # why not, where traffic is None
        # Packets and what they count, as last counted: kept while the bytes are absent.
        self._last: dict[str, dict[str, Any]] = {}

    def begin(self) -> None:
        pass

    def contribute(self, states: Sequence[TargetState]) -> Figures:
        watched = [(s, s.cgroup) for s in states if s.reading is not None]
        watched = [(s, c) for s, c in watched if c is not None]
        traffic = self.traffic
        if traffic is None:
            return {s.target.id: {"network_unknown": self.problem} for s, _ in watched}
        if not watched:
            return {}
        for s, cgroup in watched:
            pids = s.reading.pids if s.reading is not None else ()
            traffic.watch(s.target.id, cgroup.path, cgroup.level, pids, s.target.uid)
        counted = traffic.sample()
        figures = {}
        for s, _ in watched:
            target_id = s.target.id
            counts = counted.get(target_id)
            if counts is None:
                unknown = traffic.problem(target_id) or "not counted yet"
                figures[target_id] = {**self._last.get(target_id, {}), "network_unknown": unknown}
                continue
            self._last[target_id] = {
                "cgroup_packets": (counts.sent_packets, counts.received_packets),
                "network_counts": traffic.kind(target_id),
            }
            figures[target_id] = {
                "network_transmit_bytes": counts.sent_bytes,
                "network_receive_bytes": counts.received_bytes,
                "network_unknown": None,
                **self._last[target_id],
            }
        return figures

    def forget(self, target_id: str) -> None:
        self._last.pop(target_id, None)
        if self.traffic is not None:
            self.traffic.forget(target_id)

    def status(self) -> Status:
        return Status()

    def close(self) -> None:
        if self.traffic is not None:
            self.traffic.close()
