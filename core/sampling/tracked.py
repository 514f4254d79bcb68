"""What the sampler keeps about one tracked target between passes, in one object."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgewatt.core.channels import NAMES
from edgewatt.core.compat import SLOTS
from edgewatt.core.facts.cgroups import Cgroup, CgroupTree
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.facts.traffic_counts import NOT_COUNTED
from edgewatt.core.platforms import Tree
from edgewatt.core.sampling.exits import Ending
from edgewatt.core.snapshot import ProcessSample

if TYPE_CHECKING:
    from edgewatt.core.targets import Target

# The names a contributor's figures may have: ProcessSample's fields. With slots
# (Python 3.10+) a misspelt one raises as it is set; without (3.8, 3.9) it would be a
# stray attribute, unseen by every exporter, so there the names are checked first.
FIGURE_NAMES = frozenset(f.name for f in dataclasses.fields(ProcessSample))
CHECK_NAMES = not SLOTS


@dataclass
class TargetState:
    """One target's reader and what the sampler remembers of it; :meth:`close` lets
    go of it all. A contributor keeps its own per-target figures, let go by its
    ``forget``; what each handed out last is kept here (``given``)."""

    target: Target  # as the table gave it this pass
    tree: Tree | None = None  # its reader, opened at its first pass
    attributes: Mapping[str, str | int] | None = None  # its series' identity
    labels: Mapping[str, str] | None = None  # the target's labels it was built from
    failed: bool = False  # its last read failed (said once in the log)
    cpu_s: float | None = None  # its CPU seconds at the last pass that read it
    reading: TreeReading | None = None  # this pass's (None: not read in it)
    ending: Ending | None = None  # found ended in this pass
    # Each contributor's figures as last handed out for it, by the contributor's place
    # in the sampler's list: read-only copies, replaced only when they differ, and what
    # the contributor's UNCHANGED stands for (contributors.gather).
    given: dict[int, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # Its last sample, with the reading and the figures (of given) it was built from:
    # a target that did not run gets a copy of it (see sample).
    last: ProcessSample | None = None
    last_reading: TreeReading | None = None
    last_figures: Sequence[Mapping[str, Any]] = ()
    copied: bool = False  # its last sample is a copy of the one before
    figures_since: int = 0  # the pass whose figures that sample carries (Snapshot's)

    @property
    def cgroup(self) -> Cgroup | None:
        """A cgroup target's cgroup now (None for a process target, or unopened)."""
        return self.tree.cgroup if isinstance(self.tree, CgroupTree) else None

    def identity(self, host_name: str) -> Mapping[str, str | int]:
        """Its series' attributes: pid and executable, or its container's, unit's or
        cgroup's name; its id, the host and its labels (built again when a joining
        registration added labels: Target.join replaces the mapping, or its executable
        changed)."""
        target = self.target
        if (
            self.attributes is None
            or self.labels is not target.labels
            # A held fork exec'd: the command's executable names its series now.
            or (
                target.cgroup_name is None
                and self.attributes["process.executable.name"] != target.executable
            )
        ):
            self.labels = target.labels
            self.attributes = _attributes(target, host_name)
        return self.attributes

    def sample(
        self,
        host_name: str,
        *,
        power_w: float | None,
        energy_j: float | None,
        device_energy_j: float | None,
        gpu: tuple[float | None, int | None],
        figures: Sequence[Mapping[str, Any]],
        monotonic: float | None = None,
    ) -> ProcessSample:
        """Its sample for this pass: its reading (at ``monotonic``, its instant on that
        clock), its energy (attribution's), its GPU use, and ``figures``, what each
        contributor counted for it (kept in ``given``). Where all of that is what the last
        sample was built from (a target that did not run: its tree gave the same reading
        back, and no contributor's figures changed), the last sample dated anew."""
        target, reading, last = self.target, self.reading, self.last
        assert reading is not None
        if (
            last is not None
            and reading is self.last_reading
            # Set afresh by the first quiet reading after a run (ProcessTree._quiet).
            and last.cpu_mode_utilization is reading.cpu_mode_utilization
            and last.attributes is self.identity(host_name)
            and last.power_w == power_w
            and last.energy_j == energy_j
            and last.gpu_utilization == gpu[0]
            and last.gpu_memory_bytes == gpu[1]
            # Each kept mapping is replaced only when its figures change (gather): the
            # list compares by identity first, element by element, in C.
            and figures == self.last_figures
        ):
            self.last = last.redated(reading.time, monotonic, device_energy_j)
            self.copied = True
            return self.last
        sample = ProcessSample(
            target_id=target.id,
            pid=target.pid,
            executable=target.executable,
            attributes=self.identity(host_name),
            time=reading.time,
            cpu_user_s=reading.cpu_user_s,
            cpu_system_s=reading.cpu_system_s,
            cpu_utilization=reading.cpu_utilization,
            cpu_mode_utilization=reading.cpu_mode_utilization,
            memory_rss_bytes=reading.rss_bytes,
            memory_virtual_bytes=reading.vms_bytes,
            disk_read_bytes=reading.read_bytes,
            disk_write_bytes=reading.write_bytes,
            threads=reading.threads,
            open_fds=reading.open_fds,
            processes=reading.processes,
            power_w=power_w,
            energy_j=energy_j,
            device_energy_j=device_energy_j,
            gpu_utilization=gpu[0],
            gpu_memory_bytes=gpu[1],
            members=reading.pids,
            root_execs=reading.root_execs,
            monotonic=monotonic,
            # A cgroup target's network figures come from a contributor, or are absent.
            network_unknown=NOT_COUNTED if self.cgroup is not None else None,
        )
        if reading.counts is not None:  # the channels' fields (core/channels.py)
            for name, value in zip(NAMES, reading.counts):
                setattr(sample, name, value)
        for given in figures:
            if CHECK_NAMES and not given.keys() <= FIGURE_NAMES:
                unknown = ", ".join(sorted(given.keys() - FIGURE_NAMES))
                raise AttributeError(f"not a ProcessSample field: {unknown}")
            for name, value in given.items():
                setattr(sample, name, value)
        self.last, self.last_reading, self.last_figures = sample, reading, figures
        self.copied = False
        return sample

    def close(self) -> None:
        if self.tree is not None:
            self.tree.close()
            self.tree = None


def _attributes(target: Target, host_name: str) -> dict[str, str | int]:
    name = target.cgroup_name
    if name is None:
        identity: dict[str, str | int] = {
            "process.pid": target.pid,
            "process.executable.name": target.executable,
        }
    elif name.kind == "container":  # OpenTelemetry's container attributes
        identity = {"container.name": name.name, "container.runtime.name": name.runtime}
    elif name.kind == "unit":
        identity = {"edgewatt.target.unit": name.name}
    else:
        identity = {"edgewatt.target.cgroup": name.name}
        if target.identity.command is not None:  # `edgewatt run`'s: the command's program
            identity["process.executable.name"] = target.executable
    return {**identity, "edgewatt.target.id": target.id, "host.name": host_name, **target.labels}
