"""A registered target: its persisted identity, what the last pass saw of it, its
history, and its end."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.commands import command_line
from edgewatt.core.facts.held_fork import read_stat
from edgewatt.core.facts.procfs import ProcHandle, executable_name
from edgewatt.core.labels import MAX_LABELS, Room, label_bytes
from edgewatt.core.snapshot import ProcessSample
from edgewatt.core.targets.errors import Conflict
from edgewatt.core.targets.history import History, Phase
from edgewatt.core.targets.row import SampleRow, sample_dict

if TYPE_CHECKING:  # cgroups are the daemon's, on Linux: the client never loads them
    from edgewatt.core.facts.cgroup_names import CgroupName


# A target's end_reason when its last registration let it go while it still ran.
UNREGISTERED = "unregistered"


@dataclass(frozen=True, **SLOTS)
class Identity:
    """Who a target is, fixed at registration: the state file keeps it (with the
    number of holders) and a restarted daemon registers it again from there."""

    id: str
    pid: int  # 0 for a cgroup target
    # The process's start in clock ticks since boot (a pid reused is another), or the
    # cgroup's inode.
    start_ticks: int
    start_time: float  # unix seconds
    labels: dict[str, str]
    children: bool
    uid: int
    registered_at: float  # unix seconds
    executable: str = ""  # a cgroup target's: the name it was registered by
    # A cgroup target (a container, a unit, a path): what it was registered as.
    cgroup_name: CgroupName | None = None
    # The registrant's groups at registration: their rights, checked again whenever
    # the name is followed to a new cgroup.
    gids: frozenset[int] = frozenset()
    # What its registrant said it runs (`edgewatt run`'s command, registered before its
    # exec): its name until a pass sees the command itself (Target._name).
    command: str | None = None

    @property
    def held_bytes(self) -> int:
        """What it counts against its person's label bytes: labels, and the command."""
        return label_bytes(self.labels) + len((self.command or "").encode())

    @property
    def key(self) -> tuple[int, int]:
        """One process (a reused pid is another) or one cgroup: the table's index."""
        return self.pid, self.start_ticks


@dataclass(**SLOTS)
class Observed:
    """What the last pass saw of a target, copied from its sample (record)."""

    members: tuple[int, ...] = ()  # live members' pids
    # A cgroup target's cgroup now (a name is followed when its container restarts),
    # its memory (current, kernel's peak) bytes and IP packets (sent, received,
    # cumulative); what its network figures count (cgroup_traffic.py's kinds), or why
    # it has none.
    cgroup: str | None = None
    cgroup_memory: tuple[int | None, int | None] = (None, None)
    cgroup_packets: tuple[int, int] | None = None
    network_counts: str | None = None
    network_unknown: str | None = None

    def update(self, sample: ProcessSample) -> None:
        """Take ``sample``'s view; a cgroup's figures come only with its cgroup, and
        what the network figures count stays until a pass says otherwise."""
        self.members = sample.members
        if sample.cgroup is not None:
            self.cgroup, self.cgroup_memory = sample.cgroup, sample.cgroup_memory
            self.cgroup_packets = sample.cgroup_packets
            self.network_counts = sample.network_counts or self.network_counts
            self.network_unknown = sample.network_unknown


@dataclass(**SLOTS)
class Target:
    """One registered target: ``identity`` (persisted), ``observed`` (the last pass),
    ``history``, the live ``handle`` and how many registrations hold it. The identity's
    and observed fields the sampler reads are properties here."""

    identity: Identity
    history: History
    observed: Observed = field(default_factory=Observed)
    handle: ProcHandle | None = None  # the sampler's; None once exited (or restored without)
    # Registrations holding it: a process registered by `edgewatt run` and by itself
    # is one target, which stays until the last of them unregisters (or it exits).
    holders: int = 1
    exited_at: float | None = None
    exit_mode: str | None = None  # once exited: "exact", "exit-records" or "last-sample"
    # Why it ended: a cgroup target's cgroup gone (for its summary), or UNREGISTERED.
    end_reason: str | None = None
    # Its process's exit code, or -N for signal N, where the kernel's exit record said.
    exit_status: int | None = None
    # When a restarted daemon took it again from the state file (unix s): its history,
    # and so every figure, covers only the time since (None: since its registration).
    restored_at: float | None = None
    # What it runs, as a person names it (``python train.py``): its process's command
    # line, a cgroup's first member's; read again once a held fork exec'd (`edgewatt
    # run` registers the command before its exec). None: not read yet.
    command: str | None = None
    named_execs: int = -1  # the sample's root_execs when it was read
    # identity.id, which never changes (a join replaces the identity, not its id): an
    # attribute, not a property, as the sampler reads it many times per target per pass.
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.identity.id
        self.command = self.command or self.identity.command

    @property
    def pid(self) -> int:
        return self.identity.pid

    @property
    def uid(self) -> int:
        return self.identity.uid

    @property
    def gids(self) -> frozenset[int]:
        return self.identity.gids

    @property
    def labels(self) -> dict[str, str]:
        return self.identity.labels

    @property
    def children(self) -> bool:
        return self.identity.children

    @property
    def executable(self) -> str:
        return self.identity.executable

    @property
    def cgroup_name(self) -> CgroupName | None:
        return self.identity.cgroup_name

    @property
    def members(self) -> tuple[int, ...]:
        return self.observed.members

    @property
    def cgroup(self) -> str | None:
        return self.observed.cgroup

    @property
    def state(self) -> str:
        """ "running", "exited", or "unregistered" (its last holder let it go first)."""
        if self.exited_at is None:
            return "running"
        return "unregistered" if self.end_reason == UNREGISTERED else "exited"

    @property
    def kind(self) -> str:
        return "process" if self.identity.cgroup_name is None else "cgroup"

    def join(
        self, labels: dict[str, str], children: bool, room: Room | None = None
    ) -> list[dict[str, Any]]:
        """Another registration of this target: ``labels`` it lacks are added (up to
        MAX_LABELS, and the bytes ``room`` leaves: None, no bound), its own values and
        children flag kept; returns what was asked and not taken, each with why (never
        a silent overwrite)."""
        left = room.left if room is not None else 0
        mine = self.identity.labels
        added: dict[str, str] = {}
        refused = []
        for name, value in labels.items():
            kept = mine.get(name)
            if kept == value:
                continue
            size = label_bytes({name: value})
            if kept is not None:
                why = f"the target has {name}={kept!r}"
            elif len(mine) + len(added) >= MAX_LABELS:
                why = f"the target has {MAX_LABELS} labels, the most it may"
            elif room is not None and size > left:
                why = room.bound
            else:
                added[name] = value
                left -= size
                continue
            refused.append({"field": f"labels.{name}", "asked": value, "kept": kept, "why": why})
        if children != self.identity.children:
            kept_flag = self.identity.children
            what = "counts its children" if kept_flag else "counts the process alone"
            refused.append({"field": "children", "asked": children, "kept": kept_flag,
                            "why": f"the target {what}"})  # fmt: skip
        if added:  # a new mapping: the sampler sees the change (TargetState.identity)
            self.identity = dataclasses.replace(self.identity, labels={**mine, **added})
        return refused

    def observe(
        self,
        sample: ProcessSample,
        row: SampleRow | None,
        period_s: float | None,
        power: tuple[float | None, float | None] = (None, None),
    ) -> None:
        """One pass's ``sample``: what it saw is kept, its ``row`` added to the history
        (None: a pass on demand for other targets); ``period_s``, ``power``: the power
        sensors' period and the device's lowest and highest power over that pass."""
        self.observed.update(sample)
        if sample.root_execs != self.named_execs or self.command is None:
            self._name(sample)
        self.history.note(period_s, *power)
        if row is not None:
            self.history.add(row, sample.root_execs)

    def _name(self, sample: ProcessSample) -> None:
        """Its command (and a process's executable) as ``sample``'s pass finds them:
        after a held fork's exec, the command's, no longer its registrant's. A
        container or a unit keeps the name it was registered by (what runs there)."""
        if self.identity.command is not None and not sample.root_execs:
            # The registrant's word: its held fork's own command line is the launcher's
            # (python3 .../edgewatt run), and a command that exec'd and exited before a
            # pass saw it may never be seen.
            self.command, self.named_execs = self.identity.command, sample.root_execs
            return
        name = self.cgroup_name
        pid = self.pid or min(sample.members, default=0)
        if not pid or (name is not None and name.kind != "cgroup"):
            return
        # psutil's handle (the client elsewhere than Linux) has no procfs: /proc then,
        # where a read finds nothing and the name stays the registration's.
        proc = getattr(self.handle, "proc", "/proc")
        # A command that exec'd and exited before any pass (a zombie now) keeps its comm
        # alone: that names it, never the registrant's fork before the exec.
        stat = read_stat(pid, proc) if sample.root_execs and self.named_execs == 0 else None
        comm = stat.comm if stat is not None else None
        self.command = command_line(pid, proc) or comm or self.command
        if self.pid and sample.root_execs and self.named_execs == 0:
            executable = executable_name(pid, comm or self.identity.executable, proc)
            self.identity = dataclasses.replace(self.identity, executable=executable)
        self.named_execs = sample.root_execs

    def start_phase(self, name: str, now: float, monotonic: float, depth: int = 0) -> Phase:
        """Start phase ``name`` at ``now`` and ``depth`` (ending the running ones at that
        depth and deeper); Conflict where the target has exited."""
        if self.exited_at is not None:
            raise Conflict("target has exited", f"target {self.id} exited")
        phase = Phase(name=name, started_at=now, started_monotonic=monotonic, depth=depth)
        self.history.start_phase(phase, now)
        return phase

    def end(
        self,
        when: float,
        exit_mode: str,
        rss_peak_bytes: int | None = None,
        end_reason: str | None = None,
        exit_status: int | None = None,
        largest_peak_bytes: int | None = None,
    ) -> None:
        """It exited at ``when``; its last sample (taken at the exit, see Sampler) ends
        its history. ``exit_mode`` says how exact that sample is; ``rss_peak_bytes`` is
        the kernel's peak RSS of a one-process target, which no sample can miss;
        ``exit_status`` its root's exit code, or -N for signal N, where known;
        ``largest_peak_bytes`` the largest peak RSS in its processes' exit records."""
        self.exited_at = when
        self.exit_mode = exit_mode
        self.end_reason = end_reason
        self.exit_status = exit_status
        self.history.end(when, rss_peak_bytes, largest_peak_bytes)
        self.handle = None

    def cgroup_info(self) -> dict[str, Any] | None:
        name = self.identity.cgroup_name
        if name is None:
            return None
        current, peak = self.observed.cgroup_memory
        packets = self.observed.cgroup_packets
        return {
            "kind": name.kind,  # cgroup, unit or container
            "name": name.name,
            "runtime": name.runtime or None,
            "path": self.observed.cgroup,  # in the cgroup v2 tree
            "memory_current_bytes": current,
            "memory_peak_bytes": peak,  # the kernel's high-water mark, where it keeps one
            # The packets behind the network bytes (since registration): each carries
            # its headers once, which makes the bytes checkable against a payload.
            "network_transmit_packets": None if packets is None else packets[0],
            "network_receive_packets": None if packets is None else packets[1],
        }

    def describe(self) -> dict[str, Any]:
        """The target as GET /v1/targets/{id} answers: identity, state, latest sample."""
        me, latest = self.identity, self.history.last
        return {
            "id": me.id,
            "kind": self.kind,
            "pid": me.pid,
            "start_time": round(me.start_time, 2),
            "executable": me.executable,
            "command": self.command,
            "labels": dict(me.labels),
            "children": me.children,
            "state": self.state,
            "registered_at": round(me.registered_at, 3),
            "exited_at": self.exited_at,
            "latest": sample_dict(latest) if latest else None,
            "cgroup": self.cgroup_info(),
        }
