"""Names a user gives a cgroup target, and the cgroup each names now.

- a cgroup path ("/system.slice/x.service"), as it is;
- a systemd unit ("flower-supernode.service"), through `systemctl show`;
- a container (podman or docker, by name or id), through the runtime's own CLI: its
  main process's pid, whose /proc/PID/cgroup is the truth whatever the cgroup manager.

A name is resolved again when its cgroup goes (a restarted container or service), so
one target follows the container across restarts.
"""

from __future__ import annotations

import grp
import os
import re
import shutil
import subprocess
import typing
from dataclasses import dataclass

from edgewatt.core.compat import SLOTS
from edgewatt.core.sampling.cgroups import (
    Cgroup,
    CgroupGone,
    InvalidCgroup,
    Mounts,
    cgroup_of,
    normalize,
)

KINDS = ("cgroup", "unit", "container")
RUNTIMES = ("podman", "docker")
_UNIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9:_.@\\-]{0,254}")  # never an option
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_TIMEOUT_S = 10.0

Runner = typing.Callable[[typing.List[str]], str]  # runtime alias: 3.8 subscripts typing only


class UnknownName(InvalidCgroup):
    """The name resolves to no running cgroup; the message says why."""


def run_command(argv: list[str]) -> str:
    """The command's standard output; UnknownName with its own message when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownName(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise UnknownName(f"{' '.join(argv[:2])}: {message[-1] if message else 'failed'}")
    return done.stdout.strip()


@dataclass(frozen=True, **SLOTS)
class CgroupName:
    """What a cgroup target was registered as; ``runtime`` only for a container."""

    kind: str
    name: str
    runtime: str = ""
    # A container's full id, as the registering user's runtime gave it: found in the
    # cgroup tree by the runtime's own naming where the daemon may not run the runtime
    # (a service's dynamic user is neither root nor in the docker group).
    container_id: str = ""

    @property
    def display(self) -> str:
        return self.name if self.kind == "cgroup" else f"{self.runtime or self.kind}:{self.name}"

    def resolve(self, run: Runner = run_command, proc: str = "/proc", v2: str | None = None) -> str:
        """The cgroup v2 path it names now (``v2``: the v2 mount, to find a container
        by its id); UnknownName when none."""
        if self.kind == "cgroup":
            return self.name
        if self.kind == "unit":
            return self._unit(run, v2)
        try:
            pid_text = run([self.runtime, "inspect", "--format", "{{.State.Pid}}", self.name])
        except UnknownName as failed:
            found = by_container_id(self.container_id, v2) if self.container_id and v2 else None
            if found is None:
                hint = "; edgewatt register --container asks the runtime as you, for its id"
                raise UnknownName(f"{failed}{'' if self.container_id else hint}") from None
            return found
        if not pid_text.isdigit() or int(pid_text) == 0:
            raise UnknownName(f"{self.runtime} container {self.name} is not running")
        try:
            return normalize(cgroup_of(int(pid_text), proc))
        except FileNotFoundError:
            raise UnknownName(f"{self.runtime} container {self.name} has just stopped") from None

    def _unit(self, run: Runner, v2: str | None) -> str:
        """systemd's word where the daemon may ask it; else the cgroup named as the
        unit (a service's sandbox may not reach systemd's bus)."""
        try:
            path = run(["systemctl", "show", "--property=ControlGroup", "--value", self.name])
        except UnknownName as failed:
            found = by_unit_name(self.name, v2) if v2 else []
            if len(found) != 1:
                why = "no cgroup is named so" if not found else f"{len(found)} are named so"
                raise UnknownName(f"{failed}; {why}") from None
            return found[0]
        if not path:
            raise UnknownName(f"unit {self.name} is not running (it has no cgroup)")
        return normalize(path)


# How runtimes name a container's cgroup: podman (cgroupfs or systemd), docker, CRI-O
# and containerd; the id is the full one.
_CONTAINER_CGROUPS = ("{}", "libpod-{}", "libpod-{}.scope", "docker-{}.scope", "crio-{}.scope",
                      "cri-containerd-{}.scope")  # fmt: skip
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # a full id, as runtimes print it


def by_container_id(container_id: str, v2: str) -> str | None:
    """The cgroup (v2 path) of the container with this full id, by its runtime's naming;
    None when no cgroup has it (not running)."""
    found = _named(v2, {pattern.format(container_id) for pattern in _CONTAINER_CGROUPS})
    return found[0] if found else None


def by_unit_name(unit: str, v2: str) -> list[str]:
    """Cgroups (v2 paths) named as the unit: systemd names a unit's cgroup after it,
    in its slice (/system.slice/x.service, or a user's under user@UID.service)."""
    return _named(v2, {unit})


def _named(v2: str, names: set[str]) -> list[str]:
    """The v2 paths of every cgroup whose own name is one of ``names``."""
    return [
        normalize("/" + os.path.relpath(os.path.join(directory, sub), v2))
        for directory, subdirs, _files in os.walk(v2)
        for sub in subdirs
        if sub in names
    ]


def locate(name: CgroupName, where: Mounts, run: Runner = run_command) -> Cgroup:
    """The cgroup ``name`` names now; UnknownName saying why when none."""
    path = name.resolve(run, v2=where.v2)
    try:
        return Cgroup(path, where)
    except CgroupGone as exc:
        raise UnknownName(str(exc)) from None


def runs_docker(gids: frozenset[int]) -> bool:
    """Whether a caller with these groups may run docker containers (its socket)."""
    try:
        return grp.getgrnam("docker").gr_gid in gids
    except KeyError:
        return False


def parse(
    kind: str, name: object, runtime: object = None, container_id: object = None
) -> CgroupName:
    """Check a name as the API receives it; InvalidCgroup naming the problem."""
    if kind not in KINDS:
        raise InvalidCgroup(f"kind must be one of {', '.join(KINDS)}")
    if kind == "cgroup":
        return CgroupName("cgroup", normalize(name))
    if not isinstance(name, str):
        raise InvalidCgroup(f"a {kind} name is a string, got {type(name).__name__}")
    if kind == "unit":
        if not _UNIT.fullmatch(name):
            raise InvalidCgroup(f"{name!r:.80} is not a systemd unit name")
        return CgroupName("unit", name if "." in name else name + ".service")
    if not _CONTAINER.fullmatch(name):
        raise InvalidCgroup(f"{name!r:.80} is not a container name or id")
    if runtime is None:
        found = [r for r in RUNTIMES if shutil.which(r)]
        if not found:
            raise InvalidCgroup("no container runtime found (podman or docker); name one")
        runtime = found[0]
    if runtime not in RUNTIMES:
        raise InvalidCgroup(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r:.40}")
    if container_id is not None and not (
        isinstance(container_id, str) and CONTAINER_ID.fullmatch(container_id)
    ):
        raise InvalidCgroup(f"a container id is 64 hex digits, got {container_id!r:.80}")
    return CgroupName("container", name, str(runtime), container_id or "")
