"""The table of registered targets: written by the API (register, delete, phase) and
by the sampler (record, mark_exited); read by both. One lock guards it; every
operation under it is short."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, NamedTuple

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.facts.commands import executable_of
from edgewatt.core.facts.membership import PARENT_LINKS
from edgewatt.core.facts.procfs import ProcHandle
from edgewatt.core.labels import Room
from edgewatt.core.power.provenance import NO_SOURCE, Provenance, unknown
from edgewatt.core.snapshot import ProcessSample
from edgewatt.core.targets import joining
from edgewatt.core.targets.access import (
    Limits,
    check_owner,
    forget_phases,
    hold,
    label_refusal,
    label_room,
)
from edgewatt.core.targets.edges import Settlement, settler
from edgewatt.core.targets.errors import Conflict, NotFound, TargetError
from edgewatt.core.targets.history import MAX_PHASE_DEPTH, History, Phase, phase_name
from edgewatt.core.targets.persistence import StateSaver, saved
from edgewatt.core.targets.resolve import Resolver
from edgewatt.core.targets.row import row_of, sample_dict
from edgewatt.core.targets.summary import (
    PhaseFigures,
    phase_figures,
    summarize,
    summarize_phase,
    with_provenance,
)
from edgewatt.core.targets.target import UNREGISTERED, Identity, Observed, Target
from edgewatt.core.uids import alone

if (
    TYPE_CHECKING
):  # cgroups and the device's context are the daemon's, on Linux: the client never loads them
    from edgewatt.core.facts.cgroup_names import CgroupName
    from edgewatt.core.platforms.context import ContextLog

# A sample's age at record, measured on the wall clock, is taken as at most this (an
# exit sample is dated at the exit, up to an interval before its pass): a wall-clock
# step between the read and the record moves it by no more.
MAX_SAMPLE_AGE_S = 60.0


class Held(NamedTuple):
    """A registration's outcome: the target, whether it is new, and what a registration
    joining a live target asked and did not get (Target.join: labels whose name the
    target has with another value, or beyond its bound; the children flag)."""

    target: Target
    created: bool
    refused: list[dict[str, Any]]


class TargetTable:
    """Every registered target, running or exited until purged, by id and identity."""

    def __init__(
        self,
        limits: Limits,
        resolver: Resolver,
        *,
        on_change: Callable[[list[dict[str, Any]]], None] | None = None,
        carbon: CarbonIntensity | None = None,
        context: ContextLog | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic_clock: Callable[[], float] = time.monotonic,
        person: Callable[[int], int] = alone,
    ) -> None:
        """``on_change``: handed the persistent state after every change (the state
        file); ``carbon``: the intensity summaries convert energy with; ``person``: the
        person a uid is, whose share its targets count in (core/persons.py); ``context``:
        the device's, which summaries give for each target's run."""
        self._limits = limits
        self._person = person
        self._resolver = resolver
        # Per-user bounds on name lookups, registrations' and follows' (the sampler's).
        self.lookups = resolver.lookups
        # Wall time dates what users see (registrations, phases' edges); durations come
        # from the monotonic clock, which no NTP step moves.
        self._wall = wall_clock
        self._monotonic = monotonic_clock
        self._carbon = carbon
        self._context = context
        self._saver = StateSaver(on_change)
        # How a target's members are learnt (facts/membership.py): the daemon says
        # "lineage" where it hears the kernel's process events.
        self.membership = PARENT_LINKS
        # The power sensors' period, as the sampler last saw it (None: no sensor).
        self.energy_period_s: float | None = None
        # Where the device's energy comes from, as the sampler last saw it.
        self.energy_provenance: Provenance = unknown(NO_SOURCE)
        # The device's energy up to a past instant once final (the PowerMeter, set by
        # the sampler; None: no sensor): windows' edges are settled by it (edges.py).
        self.settlement: Settlement | None = None
        # The horizon the passes last settled to: until it moves (a reading comes, or
        # the source falls silent), what a pass could settle is settled.
        self._settled_until: float | None = None
        # The targets whose windows' edges a pass still settles (a new target's first
        # sample, a phase's edges, an exit): the others cost a pass nothing for it.
        self._unsettled: set[str] = set()
        # The targets with rows whose device energy a pass still settles (History.young).
        self._young: set[str] = set()
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        self._by_identity: dict[tuple[int, int], str] = {}

    def _label_room(self, uid: int) -> Room | None:
        """The label bytes a target of ``uid`` may still add (None: no bound beyond a
        target's own: root's, or a table without shares)."""
        if not self._limits.label_shares:
            return None
        return label_room(self._targets.values(), uid, self._person)

    def set_limits(self, limits: Limits) -> None:
        """A reload changed the limits: they hold for what comes next (Limits)."""
        with self._lock:
            self._limits = limits

    # -- registration -------------------------------------------------------------

    def register(
        self,
        pid: int,
        labels: dict[str, str],
        children: bool,
        uid: int,
        *,
        target_id: str | None = None,
        expect_start: int | None = None,
        registered_at: float | None = None,
        holders: int = 1,
        command: str | None = None,
    ) -> Held:
        """Register a live process; registering it again (any labels) joins its target,
        whoever registers it, and so does one in a cgroup target ``uid`` may act on,
        unless it asks for itself alone (``children`` false): joining.py. ``command``:
        what it will exec, its name until then (Identity.command)."""
        handle = self._resolver.process(pid, uid, expect_start)
        if children and target_id is None:
            joined = self._join_cgroup(handle, uid, labels)
            if joined is not None:
                return joined
        identity = Identity(
            id=target_id or secrets.token_hex(6), pid=pid, start_ticks=handle.start_ticks,
            start_time=self._resolver.start_time(handle.start_ticks), labels=labels,
            children=children, uid=uid, registered_at=registered_at or self._wall(),
            executable=executable_of(command) or handle.executable, command=command,
        )  # fmt: skip
        history = History(self._limits.history_samples)
        target = Target(identity, history, handle=handle, holders=max(1, holders))
        target.restored_at = self._wall() if target_id is not None else None  # a restore
        return self._hold_or_add(target, target_id is not None)

    def register_cgroup(
        self,
        name: CgroupName,
        labels: dict[str, str],
        uid: int,
        gids: frozenset[int] = frozenset(),
        *,
        target_id: str | None = None,
        registered_at: float | None = None,
        holders: int = 1,
        limited: bool = True,
        command: str | None = None,
    ) -> Held:
        """Register the cgroup ``name`` names now (joining its live target). Who may
        register which: access.check_cgroup. ``limited``: the user's lookup bounds
        hold (Resolver.cgroup)."""
        cgroup = self._resolver.cgroup(name, uid, gids, limited)
        now = self._wall()
        identity = Identity(
            id=target_id or secrets.token_hex(6), pid=0, start_ticks=cgroup.inode,
            start_time=now, labels=labels, children=True, uid=uid,
            registered_at=registered_at or now, cgroup_name=name, gids=gids,
            executable=executable_of(command) or name.display, command=command,
        )  # fmt: skip
        history, observed = History(self._limits.history_samples), Observed(cgroup=cgroup.path)
        target = Target(identity, history, observed, holders=max(1, holders))
        target.restored_at = now if target_id is not None else None  # a restore
        return self._hold_or_add(target, target_id is not None)

    def _join_cgroup(self, handle: ProcHandle, uid: int, labels: dict[str, str]) -> Held | None:
        """The running cgroup target nearest above the pinned process's cgroup, held
        once more (joining.py); None where there is none (the handle stays the caller's)."""
        with self._lock:
            if not joining.joinable(self._targets.values(), uid):
                return None  # the common case: /proc is not read
        path = self._resolver.cgroup_path(handle)
        with self._lock:
            target = joining.nearest(self._targets.values(), path, uid)
            if target is None:
                return None
            room = self._label_room(target.uid)
            try:
                held = Held(target, False, hold(target, uid, labels, True, room))
            finally:
                handle.close()
        self.persist()
        return held

    def _hold_or_add(self, new: Target, restored: bool) -> Held:
        """The target of ``new``'s identity, held once more (access.hold, who may watch
        the process having been checked by resolving it), or ``new``, within the limits;
        ``new``'s handle is closed where it is not kept. Both are persisted."""
        key = new.identity.key
        with self._lock:
            existing_id = self._by_identity.get(key)
            if existing_id is None:
                running = [t.uid for t in self._targets.values() if t.exited_at is None]
                refusal = self._limits.refusal(running, new.uid, self._person)
                if refusal is None and not restored:  # kept labels are not refused again
                    room = self._label_room(new.uid)
                    refusal = label_refusal(new.identity, room)
                if refusal is not None:
                    _discard(new)
                    raise refusal
                self._targets[new.id] = new
                self._by_identity[key] = new.id
                self._unsettled.add(new.id)
                held = Held(new, True, [])
            else:
                _discard(new)
                target = self._targets[existing_id]
                room = self._label_room(target.uid)
                joined = hold(target, new.uid, new.labels, new.children, room)
                held = Held(target, False, joined)
        self.persist()  # a new target, or one more holder (and labels): both are persisted
        return held

    def delete(self, target_id: str, uid: int) -> Target:
        """Let go of one registration. With the last one a running target ends there
        ("unregistered"); either way it stays readable as an exited one does, for
        exited_retention (purge_exited), so an ended run can still be looked at."""
        with self._lock:
            target = _find(self._targets, target_id)
            check_owner(target, uid)
            if target.holders <= 0:
                raise Conflict("not registered", f"target {target_id} has no registration left")
            target.holders -= 1
            if target.holders == 0 and target.exited_at is None:
                target.end(self._wall(), "last-sample", end_reason=UNREGISTERED)
                self._by_identity.pop(target.identity.key, None)
                self._unsettled.add(target_id)
        # The sampler owns the handle; it closes it when the target leaves its list.
        self.persist()
        return target

    def start_phase(self, target_id: str, name: object, uid: int, depth: int | None = 0) -> Phase:
        """Start phase ``name`` at ``depth`` (None: inside every running phase), ending
        those running at that depth and deeper (history.py); TargetError where the name
        is not a valid label value or the depth is out of bounds."""
        valid = phase_name(name)
        with self._lock:
            target = _find(self._targets, target_id)
            check_owner(target, uid)
            at = target.history.depth if depth is None else depth
            _check_depth(at)
            phase = target.start_phase(valid, self._wall(), self._monotonic(), at)
            forget_phases(self._targets.values(), target.uid, self._person)
            self._unsettled.add(target_id)
            return phase

    def end_phase(self, target_id: str, uid: int, depth: int | None = None) -> Phase | None:
        """End the running phases at ``depth`` and deeper (None: the innermost), if any,
        without starting another; the one at ``depth``."""
        if depth is not None:
            _check_depth(depth)
        with self._lock:
            target = _find(self._targets, target_id)
            check_owner(target, uid)
            return target.history.end_phase(self._wall(), depth, self._monotonic())

    # -- reading ------------------------------------------------------------------

    def get(self, target_id: str) -> Target:
        with self._lock:
            return _find(self._targets, target_id)

    def running(self) -> list[Target]:
        with self._lock:
            return [t for t in self._targets.values() if t.exited_at is None]

    def uids(self) -> set[int]:
        """The uids whose targets the table holds, running or kept."""
        with self._lock:
            return {t.uid for t in self._targets.values()}

    def youngest_phase_age(self) -> float | None:
        """Seconds since the youngest phase still running started (on the monotonic
        clock); None where none runs."""
        with self._lock:
            targets = [t for t in self._targets.values() if t.exited_at is None]
            starts = [p.started_monotonic for t in targets for p in t.history.running_phases]
        return self._monotonic() - max(starts) if starts else None

    def describe(self, target_id: str) -> dict[str, Any]:
        with self._lock:
            return _find(self._targets, target_id).describe()

    def describe_all(self, member: int | None = None) -> list[dict[str, Any]]:
        """Every target, or those running with process ``member`` among their members
        (a Flower ClientApp finding the SuperNode's target it is part of)."""
        with self._lock:
            return [
                t.describe()
                for t in self._targets.values()
                if member is None or (t.exited_at is None and member in t.members)
            ]

    def holders_of(
        self,
        member: int,
        ancestors: Callable[[], Collection[int]],
        cgroup: Callable[[], str | None],
    ) -> list[str]:
        """The running targets that may hold process ``member`` now: its own, those of
        its ancestors registered with their children, the cgroups it is in (or below),
        and those it was a member of at their last reading. ``ancestors`` (its parent,
        its parent's and so on) and ``cgroup`` (its cgroup v2 path; None: unknown) are
        read only where some target needs them, outside the table's lock. One forked
        and re-parented since the last pass may be held by another: a pass of every
        target finds it."""
        with self._lock:
            running = [t for t in self._targets.values() if t.exited_at is None]
        trees = any(t.cgroup_name is None and t.children for t in running)
        parents = ancestors() if trees else ()
        path = cgroup() if any(t.cgroup_name is not None for t in running) else None
        return [t.id for t in running if member in t.members or _may_hold(t, member, parents, path)]

    def sample_age(self, target_id: str) -> float | None:
        """Seconds since the target's latest sample was taken, on the monotonic clock
        (a wall-clock step makes no sample fresh or stale); None: it has none yet."""
        with self._lock:
            last = _find(self._targets, target_id).history.last
            return None if last is None else self._monotonic() - last.monotonic

    def summary(self, target_id: str, logical_cpus: int) -> dict[str, Any]:
        with self._lock:
            target, period_s = _find(self._targets, target_id), self.energy_period_s
            if self.settlement is not None:  # to its last sample: what the trace has
                target.history.settle(settler(self.settlement)[1], to_last=True)
            found = summarize(target, logical_cpus, self._carbon, self.membership, period_s)
            with_provenance(found, self.energy_provenance)
            # None where nothing reads the device's context (in-process monitoring).
            found["context"] = (
                None
                if self._context is None
                else self._context.during(target.identity.registered_at, target.exited_at)
            )
            return found

    def phase_summary(self, target_id: str, phase: Phase, logical_cpus: int) -> dict[str, Any]:
        """One phase's figures, as the summary lists them."""
        with self._lock:
            target = _find(self._targets, target_id)
            if self.settlement is not None:
                until, settle = settler(self.settlement)
                # The last pass settled its windows to that pass's horizon (_settle):
                # more settles only where a reading came since.
                if until is not None and self._horizon_moved(until):
                    target.history.settle(settle)
            item = summarize_phase(phase, logical_cpus, self._carbon, self.energy_period_s)
            return with_provenance(item, self.energy_provenance)

    def final(self, target_id: str) -> bool:
        """Whether the target's windows are settled up to their last samples."""
        with self._lock:
            target = _find(self._targets, target_id)
            if self.settlement is not None:
                target.history.settle(settler(self.settlement)[1], to_last=True)
            return target.history.final

    def network_rate(self, target_id: str) -> dict[str, float] | None:
        """A running target's TCP bytes per second over its last intervals (History)."""
        with self._lock:
            target = _find(self._targets, target_id)
            return None if target.exited_at is not None else target.history.network_rate()

    def samples(self, target_id: str, since: float | None = None) -> list[dict[str, Any]]:
        """The rows kept, each with ``final``: its device energy settled (History.young:
        the newest rows are not, until the power reading after them has come)."""
        with self._lock:
            history = _find(self._targets, target_id).history
            if self.settlement is not None:  # what the trace has now, not at the pass
                history.settle_rows(settler(self.settlement)[1])
            rows = list(history.rows)
            settled = len(rows) - min(history.young, len(rows))
        return [
            {**sample_dict(r), "final": i < settled}
            for i, r in enumerate(rows)
            if since is None or r.time > since
        ]

    # -- sampler side -------------------------------------------------------------

    def record(
        self,
        samples: list[ProcessSample],
        only: set[str] | None = None,
        power: tuple[float | None, float | None] = (None, None),
    ) -> None:
        """One pass's samples into the histories (one lock), or with ``only`` those
        targets' (a pass on demand); ``power``: the device's lowest and highest W since
        the last pass. Their phases' figures for export: :meth:`recent_phases`."""
        wall, monotonic = self._wall(), self._monotonic()
        with self._lock:
            for sample in samples:
                target = self._targets.get(sample.target_id)
                if target is None or target.exited_at is not None:
                    continue  # unregistered while the pass ran: its figures ended there
                at = sample.monotonic
                if at is None:
                    at = _instant(sample, wall, monotonic)
                row = row_of(sample, at) if only is None or target.id in only else None
                target.observe(sample, row, self.energy_period_s, power)
                if row is not None and row.device_energy_j is not None:
                    self._young.add(target.id)
            if self.settlement is not None:
                self._settle(self.settlement)

    def recent_phases(
        self, target_ids: list[str], phases: int
    ) -> dict[str, tuple[PhaseFigures, ...]]:
        """The last ``phases`` phases' figures of each of these running targets that
        has any, for export."""
        recent = {}
        with self._lock:
            for target_id in target_ids:
                target = self._targets.get(target_id)
                if target is None or target.exited_at is not None or not target.history.phases:
                    continue
                latest = target.history.phases[-phases:]
                recent[target_id] = tuple(phase_figures(p) for p in latest)
        return recent

    def _horizon_moved(self, until: float) -> bool:
        """Whether edges may settle past what the passes settled (lock held): the
        horizon moved since, or the source is silent and every new edge settles."""
        return until == math.inf or until != self._settled_until

    def _settle(self, settlement: Settlement) -> None:
        """While the trace still holds the readings around them: the young edges of the
        targets' windows, an exited one's last row too (lock held). Only where the
        horizon moved since the last pass's: until then nothing more settles (an edge
        is at or after the horizon of its pass; a kernel's exit record dated back
        settles with the next reading)."""
        until, settle = settler(settlement)
        if until is not None and not self._horizon_moved(until):
            return
        self._settled_until = until
        for target_id in list(self._unsettled):
            target = self._targets[target_id]
            history, exited = target.history, target.exited_at is not None
            history.settle(settle, to_last=exited)
            if history.settled(exited):
                self._unsettled.discard(target_id)
        for target_id in list(self._young):
            if self._targets[target_id].history.settle_rows(settle):
                self._young.discard(target_id)

    def mark_exited(
        self,
        target_id: str,
        when: float,
        *,
        exit_mode: str = "last-sample",
        rss_peak_bytes: int | None = None,
        end_reason: str | None = None,
        exit_status: int | None = None,
        largest_peak_bytes: int | None = None,
    ) -> None:
        """The target ended, at ``when`` (Target.end); its identity may be registered anew."""
        with self._lock:
            target = self._targets.get(target_id)
            if target is None or target.exited_at is not None:
                return
            target.end(when, exit_mode, rss_peak_bytes, end_reason, exit_status, largest_peak_bytes)
            self._by_identity.pop(target.identity.key, None)
            self._unsettled.add(target_id)
        self.persist()

    def purge_exited(self, now: float) -> int:
        """Forget exited targets older than the retention, and those beyond the bounds
        (Limits.expired), so churn cannot grow the table without bound."""
        with self._lock:
            exited = [t for t in self._targets.values() if t.exited_at is not None]
            expired = self._limits.expired(exited, now, self._person)
            for target_id in expired:
                del self._targets[target_id]
                # Settled only with a power source: without one, nothing else drops them.
                self._unsettled.discard(target_id)
                self._young.discard(target_id)
        return len(expired)

    def persistent_state(self) -> list[dict[str, Any]]:
        """The running targets' state-file entries."""
        with self._lock:
            return [saved(t) for t in self._targets.values() if t.exited_at is None]

    def persist(self) -> None:
        """Hand the state to on_change (the state file)."""
        self._saver.save(self.persistent_state)


def _instant(sample: ProcessSample, wall: float, monotonic: float) -> float:
    """The sample's monotonic instant, or one from its wall-clock age where it has none
    (bounded: a wall-clock step between its read and now moves it no further)."""
    if sample.monotonic is not None:
        return sample.monotonic
    return monotonic - min(max(0.0, wall - sample.time), MAX_SAMPLE_AGE_S)


def _may_hold(target: Target, pid: int, ancestors: Collection[int], cgroup: str | None) -> bool:
    """Whether ``target`` holds process ``pid`` (its ``ancestors`` and ``cgroup`` as
    holders_of takes them) by what it was registered as."""
    if target.cgroup_name is not None:
        within = target.cgroup
        if within is None or cgroup is None:
            return False
        return cgroup == within or cgroup.startswith(within.rstrip("/") + "/")
    return target.pid == pid or (target.children and target.pid in ancestors)


def _check_depth(depth: int) -> None:
    if not 0 <= depth < MAX_PHASE_DEPTH:
        raise TargetError(
            "invalid phase depth", f"a phase runs inside 0 to {MAX_PHASE_DEPTH - 1} others"
        )


def _discard(target: Target) -> None:
    """Let go of what a target not kept holds: its process handle."""
    if target.handle is not None:
        target.handle.close()


def _find(targets: dict[str, Target], target_id: str) -> Target:
    target = targets.get(target_id)
    if target is None:
        raise NotFound("no such target", f"no target with id {target_id!r}")
    return target
