"""Registered targets: identity, labels, lifecycle, bounded history and summaries.

Written by the API (register, delete, phase) and by the sampler (record, exited);
read by both. One lock guards the table; every operation under it is short.
"""

from __future__ import annotations

import contextlib
import operator
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.compat import SLOTS
from edgewatt.core.labels import LabelError, validate_value
from edgewatt.core.lookups import LookupRefused, Lookups
from edgewatt.core.sampling.membership import PARENT_LINKS
from edgewatt.core.sampling.procfs import NoSuchProcess, ProcHandle
from edgewatt.core.snapshot import ProcessSample

if TYPE_CHECKING:  # cgroups are the daemon's, on Linux: the client never loads them
    from edgewatt.core.sampling.cgroup_names import CgroupName
    from edgewatt.core.sampling.cgroups import Cgroup

SAMPLE_FIELDS = (
    "time",
    "cpu_user_s",
    "cpu_system_s",
    "cpu_utilization",
    "memory_rss_bytes",
    "memory_virtual_bytes",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_transmit_bytes",
    "network_receive_bytes",
    "threads",
    "open_fds",
    "processes",
    "power_w",
    "energy_j",
    "device_energy_j",
)
_I = {name: i for i, name in enumerate(SAMPLE_FIELDS)}

SAMPLE_UNITS = {
    "time": "unix seconds",
    "cpu_user_s": "seconds of CPU time, cumulative",
    "cpu_system_s": "seconds of CPU time, cumulative",
    "cpu_utilization": "share of all logical CPUs over the last interval, 0..1",
    "memory_rss_bytes": "bytes",
    "memory_virtual_bytes": "bytes",
    "disk_read_bytes": "bytes read from storage, cumulative",
    "disk_write_bytes": "bytes written to storage, cumulative",
    "network_transmit_bytes": "TCP bytes sent and acknowledged, cumulative (not UDP/Unix)",
    "network_receive_bytes": "TCP bytes received, cumulative (not UDP/Unix)",
    "threads": "count",
    "open_fds": "count",
    "processes": "count (the target and its live descendants)",
    "power_w": "watts attributed over the last interval (docs/attribution.md)",
    "energy_j": "joules attributed since registration, cumulative",
    "device_energy_j": "joules the device's power sensors measured up to this sample's edge, "
    "cumulative since the daemon started (the whole device: a window's difference is what "
    "the sensor saw in it)",
}

# Phases a target's summary lists: the newest, so a tracked training step or an FL
# round keeps being measured past the bound; the older ones are counted as dropped.
MAX_PHASES = 1000
MAX_PHASE_NAME = 128  # bytes of UTF-8


class TargetError(Exception):
    """A refused request; ``status`` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error
        self.detail = detail


class NotFound(TargetError):
    status = 404


class Forbidden(TargetError):
    status = 403


class Conflict(TargetError):
    status = 409


class TooMany(TargetError):
    status = 429


class TooManyLookups(TooMany):
    """Over the user's name lookup bound (lookups.py); ``retry_s``: when a token comes
    (0: when their running lookup ends)."""

    def __init__(self, detail: str, retry_s: float) -> None:
        super().__init__("too many lookups", detail)
        self.retry_s = retry_s


_row: Callable[[ProcessSample], tuple] = operator.attrgetter(*SAMPLE_FIELDS)
"""A sample as the history keeps it: the SAMPLE_FIELDS in order, then (appended at
record) its monotonic time, from which durations come: wall time only dates it."""
_MONOTONIC = len(SAMPLE_FIELDS)
# A sample's age at record, measured on the wall clock, is taken as at most this (an
# exit sample is dated at the exit, up to an interval before its pass): a wall-clock
# step between the read and the record moves it by no more.
MAX_SAMPLE_AGE_S = 60.0


@dataclass(**SLOTS)
class Phase:
    """A named span bounded by samples: from the first sample taken after it began to
    the first taken after it ended. Adjacent phases share that boundary sample, so
    their figures add up; each edge is late by less than one interval."""

    name: str
    started_at: float  # unix seconds: when, as users see it
    started_monotonic: float = 0.0  # for its age (time.monotonic)
    first: tuple | None = None
    last: tuple | None = None
    ended_at: float | None = None
    closed: bool = False  # the sample after the end has been taken
    rss_peak: int = 0
    # The power sensors' coarsest period over the intervals between its samples (the
    # window is flagged against it; None: no sensor, or no interval yet).
    period_s: float | None = None

    def add(self, row: tuple, period_s: float | None = None) -> None:
        """A sample; ``period_s``: the sensors' period over the interval it ends."""
        if self.first is None:
            self.first = row
        elif period_s is not None:
            self.period_s = max(self.period_s or 0.0, period_s)
        self.last = row
        self.rss_peak = max(self.rss_peak, row[_I["memory_rss_bytes"]])
        if self.ended_at is not None:
            self.closed = True


@dataclass(**SLOTS)
class History:
    """A bounded ring of samples plus running figures that outlive the ring."""

    capacity: int
    rows: deque = field(init=False)
    first: tuple | None = None
    last: tuple | None = None
    count: int = 0
    rss_peak: int = 0
    rss_sum: float = 0.0
    phases: list[Phase] = field(default_factory=list)
    phases_dropped: int = 0  # the oldest phases, beyond the newest MAX_PHASES
    # The sensors' coarsest period since the last row (passes that added none to this
    # target's history: on demand for others), and over the whole history.
    pending_period_s: float | None = None
    period_s: float | None = None

    def __post_init__(self) -> None:
        self.rows = deque(maxlen=self.capacity)

    def note_period(self, period_s: float | None) -> None:
        """A pass's sensor period, whether or not it adds a row here."""
        if period_s is not None:
            self.pending_period_s = max(self.pending_period_s or 0.0, period_s)

    def add(self, row: tuple) -> None:
        period, self.pending_period_s = self.pending_period_s, None
        if self.first is not None and period is not None:
            self.period_s = max(self.period_s or 0.0, period)
        self.rows.append(row)
        if self.first is None:
            self.first = row
        self.last = row
        self.count += 1
        rss = row[_I["memory_rss_bytes"]]
        self.rss_peak = max(self.rss_peak, rss)
        self.rss_sum += rss
        # Only the last two phases can still be open: the running one, and the one
        # that ended since the previous sample and waits for its closing sample.
        for phase in self.phases[-2:]:
            if not phase.closed:
                phase.add(row, period)

    def start_phase(self, phase: Phase, now: float) -> None:
        """End the running phase at ``now`` and start ``phase``; the oldest beyond the
        bound go (they are closed: only the last two can still take samples)."""
        phases = self.phases
        if phases and phases[-1].ended_at is None:
            phases[-1].ended_at = now
        phases.append(phase)
        if len(phases) > MAX_PHASES:
            del phases[0]  # a list, not a deque: the pass slices the last few
            self.phases_dropped += 1


@dataclass(**SLOTS)
class Target:
    id: str
    pid: int
    start_ticks: int
    start_time: float  # unix seconds
    labels: dict[str, str]
    children: bool
    uid: int
    registered_at: float
    history: History
    handle: ProcHandle | None = None  # None once exited (or restored without one)
    executable: str = ""
    exited_at: float | None = None
    exit_mode: str | None = None  # once exited: "exact", "exit-records" or "last-sample"
    members: tuple[int, ...] = ()  # live members' pids at the last pass
    # Registrations holding it: a process registered by `edgewatt run` and by itself
    # is one target, which stays until the last of them unregisters (or it exits).
    holders: int = 1
    # A cgroup target (a container, a unit, a path): what it was registered as, the
    # cgroup it is in now, and that cgroup's memory (current, kernel's peak) bytes.
    # Its pid is 0 and its start_ticks the cgroup's inode.
    cgroup_name: CgroupName | None = None
    cgroup: str | None = None
    cgroup_memory: tuple[int | None, int | None] = (None, None)
    cgroup_packets: tuple[int, int] | None = None  # IP packets sent, received, cumulative
    network_counts: str | None = None  # a cgroup target's (cgroup_traffic.py's kinds)
    # The registrant's groups at registration: their rights, checked again whenever
    # the name is followed to a new cgroup.
    gids: frozenset[int] = frozenset()
    end_reason: str | None = None  # why a cgroup target ended, for its summary
    network_unknown: str | None = None  # why a cgroup target has no network figures

    @property
    def state(self) -> str:
        return "running" if self.exited_at is None else "exited"

    @property
    def kind(self) -> str:
        return "process" if self.cgroup_name is None else "cgroup"

    def _membership(self, membership: str) -> str:
        if self.cgroup_name is not None:
            return "cgroup"
        return membership if self.children else "process"

    def cgroup_info(self) -> dict[str, Any] | None:
        if self.cgroup_name is None:
            return None
        current, peak = self.cgroup_memory
        packets = self.cgroup_packets
        return {
            "kind": self.cgroup_name.kind,  # cgroup, unit or container
            "name": self.cgroup_name.name,
            "runtime": self.cgroup_name.runtime or None,
            "path": self.cgroup,  # in the cgroup v2 tree
            "memory_current_bytes": current,
            "memory_peak_bytes": peak,  # the kernel's high-water mark, where it keeps one
            # The packets behind the network bytes (since registration): each carries
            # its headers once, which makes the bytes checkable against a payload.
            "network_transmit_packets": None if packets is None else packets[0],
            "network_receive_packets": None if packets is None else packets[1],
        }

    def describe(self) -> dict[str, Any]:
        latest = self.history.last
        return {
            "id": self.id,
            "kind": self.kind,
            "pid": self.pid,
            "start_time": round(self.start_time, 2),
            "executable": self.executable,
            "labels": dict(self.labels),
            "children": self.children,
            "state": self.state,
            "registered_at": round(self.registered_at, 3),
            "exited_at": self.exited_at,
            "latest": dict(zip(SAMPLE_FIELDS, latest)) if latest else None,
            "cgroup": self.cgroup_info(),
        }

    def summary(
        self,
        logical_cpus: int,
        carbon: CarbonIntensity | None = None,
        membership: str = PARENT_LINKS,
        period_s: float | None = None,
    ) -> dict[str, Any]:
        """Totals and per-phase figures; gCO2e beside each energy only when ``carbon``;
        ``membership``: how descendants are learnt (sampling/membership.py);
        ``period_s``: the power sensors' period now, for a window with no interval of
        its own yet (the others keep the coarsest period they were read at)."""
        h = self.history
        result: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "pid": self.pid,
            "labels": dict(self.labels),
            "state": self.state,
            "registered_at": round(self.registered_at, 3),
            "exited_at": self.exited_at,
            # How the figures end: at the kernel's exit records with every teardown
            # ("exact"), at the exit records with a reaped child's teardown missing
            # ("exit-records"), or at the last pass before the exit ("last-sample");
            # None while running.
            "exit": self.exit_mode,
            # Who is counted: the process alone, or everything it forked until each
            # exits, learnt from the kernel's events ("lineage") or from the parent
            # links each pass sees ("parent-links": a double fork between two passes
            # escapes it).
            # ... or the kernel's members of a cgroup ("cgroup").
            "membership": self._membership(membership),
            # What the network figures count: TCP payload acknowledged, or every IP
            # byte of the cgroup's sockets, headers included, or the frames of the
            # interfaces of a network namespace the daemon may not enter, or both
            # (docs/reference.md).
            "network_counts": "tcp-payload"
            if self.cgroup_name is None
            else None
            if self.network_unknown
            else self.network_counts or "ip-bytes",
            "samples": h.count,
        }
        if self.cgroup_name is not None:
            # Why it ended (its cgroup removed, or followed to one not the registrant's).
            result["end_reason"] = self.end_reason
        result.update(_span(h.first, h.last, logical_cpus, carbon, h.period_s or period_s))
        result["memory_rss_peak_bytes"] = h.rss_peak if h.count else None
        result["memory_rss_avg_bytes"] = round(h.rss_sum / h.count) if h.count else None
        result["phases"] = [_phase_item(p, logical_cpus, carbon, period_s) for p in h.phases]
        result["phases_dropped"] = h.phases_dropped
        if self.cgroup_name is not None:
            # Why its network figures are absent (None: they are counted).
            result["network_unknown"] = self.network_unknown
            result["cgroup"] = self.cgroup_info()
        if carbon is not None:
            result["carbon_intensity_g_per_kwh"] = carbon.g_per_kwh
            result["carbon_intensity_source"] = carbon.source
        return result


def _recent(phase: Phase) -> tuple[str, bool, float | None, float]:
    """A phase as exported: (name, running, energy J, duration s so far), as _span
    gives them (two of its fields: this runs for the last phases at every pass)."""
    first, last = phase.first, phase.last
    if first is None or last is None:
        return phase.name, phase.ended_at is None, None, 0.0
    energy = _difference(first, last, _ENERGY)
    duration = _difference(first, last, _MONOTONIC) or 0.0
    return (
        phase.name,
        phase.ended_at is None,
        None if energy is None else round(energy, 3),
        round(duration, 3),
    )


_ENERGY = _I["energy_j"]


def _difference(first: tuple, last: tuple, index: int) -> Any:
    a, b = first[index], last[index]
    return None if a is None or b is None else b - a


def _phase_item(
    phase: Phase, logical_cpus: int, carbon: CarbonIntensity | None, period_s: float | None
) -> dict[str, Any]:
    item = {"name": phase.name, "started_at": phase.started_at, "ended_at": phase.ended_at}
    item.update(_span(phase.first, phase.last, logical_cpus, carbon, phase.period_s or period_s))
    item["memory_rss_peak_bytes"] = phase.rss_peak if phase.first else None
    return item


def _span(
    first: tuple | None,
    last: tuple | None,
    logical_cpus: int,
    carbon: CarbonIntensity | None,
    period_s: float | None = None,
) -> dict[str, Any]:
    """Differences between two samples: what the target consumed in between."""

    def delta(name: str) -> Any:
        if first is None or last is None:
            return None
        return _difference(first, last, _I[name])

    duration = 0.0 if first is None or last is None else last[_MONOTONIC] - first[_MONOTONIC]
    user, system, energy = delta("cpu_user_s"), delta("cpu_system_s"), delta("energy_j")
    device = delta("device_energy_j")
    cpu = None if user is None or system is None else user + system
    per_second = duration > 0 and cpu is not None
    span = {
        "duration_s": round(duration, 3),
        "cpu_user_s": None if user is None else round(user, 3),
        "cpu_system_s": None if system is None else round(system, 3),
        "cpu_avg_cores": round(cpu / duration, 4) if per_second else None,
        "cpu_avg_utilization": round(cpu / duration / logical_cpus, 4) if per_second else None,
        "disk_read_bytes": delta("disk_read_bytes"),
        "disk_write_bytes": delta("disk_write_bytes"),
        "network_transmit_bytes": delta("network_transmit_bytes"),
        "network_receive_bytes": delta("network_receive_bytes"),
        "energy_j": None if energy is None else round(energy, 3),
        "power_avg_w": round(energy / duration, 3) if energy is not None and duration > 0 else None,
        "device_energy_j": None if device is None else round(device, 3),
        # A window shorter than the sensors' period is not resolved by them: its energy
        # is interpolated between readings outside it (None: no sensor, or its period
        # is unknown).
        "shorter_than_sensor_period": None
        if device is None or period_s is None
        else duration < period_s,
    }
    if carbon is not None:  # of the energy as reported, so that the product is exact
        span["carbon_g"] = None if energy is None else carbon.grams(span["energy_j"])
    return span


class TargetTable:
    def __init__(
        self,
        *,
        boot_time: float,
        clock_ticks: int,
        max_targets: int,
        history_samples: int,
        exited_retention_s: float,
        max_targets_per_uid: int | None = None,  # None: max_targets
        proc: str = "/proc",
        on_change: Callable[[list[dict[str, Any]]], None] | None = None,
        open_process: Callable[..., Any] = ProcHandle,
        carbon: CarbonIntensity | None = None,
        locate_cgroup: Callable[[CgroupName, int], Cgroup] | None = None,
        lookups: Lookups | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Wall time dates what users see (registrations, phases' edges); durations come
        # from the monotonic clock, which no NTP step moves.
        self._wall = wall_clock
        self._monotonic = monotonic_clock
        # Per-user bounds on name lookups, registrations' and follows' (the sampler's).
        self.lookups = lookups or Lookups()
        # locate_cgroup(name, uid): the cgroup a name names now for that user
        # (cgroup_names.locate).
        self._locate = locate_cgroup or _locate
        # open_process(pid, proc, expect_start=...) pins a process's identity: /proc
        # here, psutil in the client where /proc is absent (client/_psutil.py).
        self._open = open_process
        self._carbon = carbon
        # How a target's members are learnt (sampling/membership.py): the daemon says
        # "lineage" where it hears the kernel's process events.
        self.membership = PARENT_LINKS
        # The power sensors' period, as the sampler last saw it (None: no sensor).
        self.energy_period_s: float | None = None
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        self._by_identity: dict[tuple[int, int], str] = {}
        self._boot_time = boot_time
        self._clock_ticks = clock_ticks
        self._max_targets = max_targets
        self._max_per_uid = max_targets_per_uid or max_targets
        self._history_samples = history_samples
        self._retention = exited_retention_s
        self._proc = proc
        self._on_change = on_change

    def set_limits(
        self,
        *,
        max_targets: int,
        max_targets_per_uid: int,
        history_samples: int,
        exited_retention_s: float,
    ) -> None:
        """A reload changed the limits: they hold for what comes next (a smaller
        max_targets refuses new registrations, it ends no running target; a new
        history length holds for targets registered from now on)."""
        with self._lock:
            self._max_targets = max_targets
            self._max_per_uid = max_targets_per_uid
            self._history_samples = history_samples
            self._retention = exited_retention_s

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
    ) -> tuple[Target, bool]:
        """Register a live process; returns (target, created). Registering a registered
        process again (same labels) holds the same target once more."""
        try:
            handle = self._open(pid, self._proc, expect_start=expect_start)
        except NoSuchProcess as exc:
            raise TargetError("no such process", f"pid {pid} does not exist") from exc
        reason = handle.refuses(uid) if uid != 0 else None
        if reason is not None:
            handle.close()
            raise Forbidden("not your process", reason)

        def make() -> Target:
            return Target(
                id=target_id or secrets.token_hex(6),
                pid=pid,
                start_ticks=handle.start_ticks,
                start_time=self._boot_time + handle.start_ticks / self._clock_ticks,
                labels=labels,
                children=children,
                uid=uid,
                registered_at=registered_at or time.time(),
                history=History(self._history_samples),
                handle=handle,
                executable=handle.executable,
                holders=max(1, holders),
            )

        return self._hold_or_add(
            (pid, handle.start_ticks),
            uid,
            same=lambda t: t.labels == labels and t.children == children,
            conflict=lambda t: f"pid {pid} is target {t.id} with other labels or children flag",
            make=make,
            discard=handle.close,
        )

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
    ) -> tuple[Target, bool]:
        """Register the cgroup ``name`` names now; returns (target, created). Root may
        register any; a user the cgroups they own (a delegated subtree); the docker
        group docker's containers, as its socket lets it run them anyway
        (cgroup_names.refusal). ``limited``: the user's lookup bounds hold (lookups.py;
        TooMany beyond them)."""
        # A name (not a path) runs a runtime's CLI or walks the tree: bounded per user,
        # but not for a registration the daemon restores from its state file.
        bounded = name.kind != "cgroup" and limited
        key = f"{name.display} {name.container_id}"
        try:
            with self.lookups.bounded(uid, key) if bounded else contextlib.nullcontext():
                cgroup = self._locate(name, uid)
        except LookupRefused as exc:
            raise TooManyLookups(exc.detail, exc.retry_s) from None
        except (ValueError, OSError) as exc:  # InvalidCgroup is a ValueError
            raise TargetError("no such cgroup", str(exc)) from None
        from edgewatt.core.sampling.cgroup_names import refusal as cgroup_refusal

        refusal = cgroup_refusal(name, cgroup, uid, gids)
        if refusal is not None:
            raise Forbidden("not your cgroup", refusal)

        def make() -> Target:
            now = time.time()
            return Target(
                id=target_id or secrets.token_hex(6),
                pid=0,
                start_ticks=cgroup.inode,
                start_time=now,
                labels=labels,
                children=True,
                uid=uid,
                registered_at=registered_at or now,
                history=History(self._history_samples),
                executable=name.display,
                holders=max(1, holders),
                cgroup_name=name,
                cgroup=cgroup.path,
                gids=gids,
            )

        return self._hold_or_add(
            (0, cgroup.inode),
            uid,
            same=lambda t: t.labels == labels,
            conflict=lambda t: f"cgroup {cgroup.path} is target {t.id} with other labels",
            make=make,
        )

    def _hold_or_add(
        self,
        key: tuple[int, int],
        uid: int,
        *,
        same: Callable[[Target], bool],
        conflict: Callable[[Target], str],
        make: Callable[[], Target],
        discard: Callable[[], None] = lambda: None,
    ) -> tuple[Target, bool]:
        """The target of identity ``key`` held once more (the ``same`` registration,
        else Conflict saying ``conflict(it)``), or ``make()``'s, within the limits;
        ``discard`` lets go of what a new target would have kept (its process
        handle). Both are persisted."""
        with self._lock:
            existing_id = self._by_identity.get(key)
            if existing_id is not None:
                discard()
                existing = self._targets[existing_id]
                if not same(existing):
                    raise Conflict("already registered", conflict(existing))
                existing.holders += 1
                target, created = existing, False
            else:
                refusal = self._over_limit(uid)
                if refusal is not None:
                    discard()
                    raise refusal
                target = make()
                self._targets[target.id] = target
                self._by_identity[key] = target.id
                created = True
        self.persist()  # a new target, or one more holder: both are persisted
        return target, created

    def _over_limit(self, uid: int) -> TooMany | None:
        running = [t.uid for t in self._targets.values() if t.exited_at is None]
        if len(running) >= self._max_targets:
            return TooMany("too many targets", f"at most {self._max_targets} may run at once")
        # Root is exempt: its registrations are the administrator's own.
        if uid != 0 and running.count(uid) >= self._max_per_uid:
            return TooMany(
                "too many targets", f"at most {self._max_per_uid} per user may run at once"
            )
        return None

    def delete(self, target_id: str, uid: int) -> Target:
        """Let go of one registration; the target goes with the last one."""
        with self._lock:
            target = self._get(target_id)
            _check_owner(target, uid)
            target.holders -= 1
            if target.holders <= 0:
                del self._targets[target_id]
                self._by_identity.pop((target.pid, target.start_ticks), None)
        # The sampler owns the handle; it closes it when the target leaves its list.
        self.persist()
        return target

    def start_phase(self, target_id: str, name: object, uid: int) -> Phase:
        # A phase name becomes a label value: the same rules, a shorter bound.
        try:
            valid = validate_value(name, "the phase name", MAX_PHASE_NAME)
        except LabelError as exc:
            raise TargetError("invalid phase name", str(exc)) from None
        now = self._wall()
        with self._lock:
            target = self._get(target_id)
            _check_owner(target, uid)
            if target.exited_at is not None:
                raise Conflict("target has exited", f"target {target_id} exited")
            phase = Phase(name=valid, started_at=now, started_monotonic=self._monotonic())
            target.history.start_phase(phase, now)
            return phase

    def end_phase(self, target_id: str, uid: int) -> Phase | None:
        """End the running phase, if any, without starting another."""
        with self._lock:
            target = self._get(target_id)
            _check_owner(target, uid)
            phases = target.history.phases
            if not phases or phases[-1].ended_at is not None:
                return None
            phases[-1].ended_at = self._wall()
            return phases[-1]

    # -- reading ------------------------------------------------------------------

    def get(self, target_id: str) -> Target:
        with self._lock:
            return self._get(target_id)

    def all(self) -> list[Target]:
        with self._lock:
            return list(self._targets.values())

    def running(self) -> list[Target]:
        with self._lock:
            return [t for t in self._targets.values() if t.exited_at is None]

    def youngest_phase_age(self) -> float | None:
        """Seconds since the youngest phase still running started (on the monotonic
        clock); None where none runs."""
        now = self._monotonic()
        with self._lock:
            ages = [
                now - phases[-1].started_monotonic
                for t in self._targets.values()
                if t.exited_at is None
                and (phases := t.history.phases)
                and phases[-1].ended_at is None
            ]
        return min(ages) if ages else None

    def describe(self, target_id: str) -> dict[str, Any]:
        with self._lock:
            return self._get(target_id).describe()

    def describe_all(self, member: int | None = None) -> list[dict[str, Any]]:
        """Every target, or those running with process ``member`` among their members
        (a Flower ClientApp finding the SuperNode's target it is part of)."""
        with self._lock:
            return [
                t.describe()
                for t in self._targets.values()
                if member is None or (t.exited_at is None and member in t.members)
            ]

    def summary(self, target_id: str, logical_cpus: int) -> dict[str, Any]:
        with self._lock:
            return self._get(target_id).summary(
                logical_cpus, self._carbon, self.membership, self.energy_period_s
            )

    def phase_summary(self, target_id: str, phase: Phase, logical_cpus: int) -> dict[str, Any]:
        """One phase's figures, as the summary lists them."""
        with self._lock:
            self._get(target_id)
            return _phase_item(phase, logical_cpus, self._carbon, self.energy_period_s)

    def samples(self, target_id: str, since: float | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = list(self._get(target_id).history.rows)
        return [dict(zip(SAMPLE_FIELDS, r)) for r in rows if since is None or r[0] > since]

    # -- sampler side -------------------------------------------------------------

    def record(
        self, samples: list[ProcessSample], phases: int, only: set[str] | None = None
    ) -> dict[str, tuple[tuple[str, bool, float | None, float], ...]]:
        """Add one pass's samples to the targets' histories (one lock for the pass),
        or, with ``only``, those of these targets (a pass on demand: the others' next
        rows carry their cumulative counters all the same); returns (name, running,
        energy J) of the last ``phases`` phases of each target that has any, for
        export."""
        recent = {}
        wall, monotonic = self._wall(), self._monotonic()
        with self._lock:
            for sample in samples:
                target = self._targets.get(sample.target_id)
                if target is None:
                    continue
                target.members = sample.members
                if sample.cgroup is not None:
                    target.cgroup, target.cgroup_memory = sample.cgroup, sample.cgroup_memory
                    target.cgroup_packets = sample.cgroup_packets
                    target.network_counts = sample.network_counts or target.network_counts
                    target.network_unknown = sample.network_unknown
                target.history.note_period(self.energy_period_s)
                if only is None or target.id in only:
                    age = min(max(0.0, wall - sample.time), MAX_SAMPLE_AGE_S)
                    target.history.add((*_row(sample), monotonic - age))
                if target.history.phases:
                    recent[target.id] = tuple(_recent(p) for p in target.history.phases[-phases:])
        return recent

    def mark_exited(
        self,
        target_id: str,
        when: float,
        *,
        exit_mode: str = "last-sample",
        rss_peak_bytes: int | None = None,
        end_reason: str | None = None,
    ) -> None:
        """The target is gone; its last sample (taken at the exit, see Sampler) ends
        its history. ``exit_mode`` says how exact that sample is; ``rss_peak_bytes`` is
        the kernel's peak RSS of a one-process target, which no sample can miss."""
        with self._lock:
            target = self._targets.get(target_id)
            if target is None or target.exited_at is not None:
                return
            target.exited_at = when
            target.exit_mode = exit_mode
            target.end_reason = end_reason
            if rss_peak_bytes is not None:
                target.history.rss_peak = max(target.history.rss_peak, rss_peak_bytes)
            target.handle = None
            for phase in target.history.phases:
                if phase.ended_at is None:
                    phase.ended_at = when
            self._by_identity.pop((target.pid, target.start_ticks), None)
        self.persist()

    def purge_exited(self, now: float) -> int:
        """Forget exited targets older than the retention, and the oldest beyond
        ``max_targets`` of them, so churn cannot grow the table without bound."""
        with self._lock:
            exited = sorted(
                (t for t in self._targets.values() if t.exited_at is not None),
                key=lambda t: t.exited_at or 0.0,
            )
            excess = max(0, len(exited) - self._max_targets)
            expired = [
                t.id
                for n, t in enumerate(exited)
                if n < excess or now - (t.exited_at or 0.0) > self._retention
            ]
            for target_id in expired:
                del self._targets[target_id]
        return len(expired)

    # -- persistence --------------------------------------------------------------

    def persistent_state(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_saved(t) for t in self._targets.values() if t.exited_at is None]

    def persist(self) -> None:
        """Hand the state to on_change (the state file)."""
        if self._on_change is not None:
            # Taken and handed on under one lock: of two changes saved at once, the
            # state read last is also saved last (never an older over a newer).
            with self._save_lock:
                self._on_change(self.persistent_state())

    def _get(self, target_id: str) -> Target:
        target = self._targets.get(target_id)
        if target is None:
            raise NotFound("no such target", f"no target with id {target_id!r}")
        return target


def _saved(t: Target) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": t.id,
        "pid": t.pid,
        "start_ticks": t.start_ticks,
        "labels": t.labels,
        "children": t.children,
        "uid": t.uid,
        "registered_at": t.registered_at,
        "holders": t.holders,
    }
    if t.cgroup_name is not None:  # resolved again at restore: it may have restarted
        name = t.cgroup_name
        entry["cgroup"] = {
            "kind": name.kind,
            "name": name.name,
            "runtime": name.runtime,
            "container_id": name.container_id,
        }
    return entry


def _locate(name: CgroupName, uid: int) -> Cgroup:
    from edgewatt.core.sampling import cgroup_names, cgroups

    return cgroup_names.locate(name, cgroups.mounts(), uid=uid)


def _check_owner(target: Target, uid: int) -> None:
    if uid != 0 and uid != target.uid:
        raise Forbidden("not your target", f"target {target.id} belongs to uid {target.uid}")
