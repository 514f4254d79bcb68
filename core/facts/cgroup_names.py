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
from edgewatt.core.facts.cgroups import (
    Cgroup,
    CgroupGone,
    InvalidCgroup,
    Mounts,
    cgroup_of,
    normalize,
)

KINDS = ("cgroup", "unit", "container")
RUNTIMES = ("podman", "docker")
# Never an option; a backslash only in systemd's escapes (flower\x2dsupernode.slice)
_UNIT = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9:_.@-]|\\x[0-9a-f]{2}){0,254}")
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

    def resolve(
        self, run: Runner = run_command, proc: str = "/proc", v2: str | None = None, uid: int = 0
    ) -> str:
        """The cgroup v2 path it names now (``v2``: the v2 mount, to find a container
        by its id or a unit by its name, for user ``uid``); UnknownName when none."""
        if self.kind == "cgroup":
            return self.name
        if self.kind == "unit":
            return self._unit(run, v2, uid)
        try:
            pid_text = run([self.runtime, "inspect", "--format", "{{.State.Pid}}", self.name])
        except UnknownName as failed:
            found = None
            if self.container_id and v2:
                found = by_container_id(self.container_id, self.runtime, v2, uid)
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

    def _unit(self, run: Runner, v2: str | None, uid: int) -> str:
        """systemd's word where the daemon may ask it; else the cgroup named as the
        unit (a service's sandbox may not reach systemd's bus)."""
        try:
            path = run(["systemctl", "show", "--property=ControlGroup", "--value", self.name])
        except UnknownName as failed:
            found = by_unit_name(self.name, v2, uid) if v2 else []
            if len(found) != 1:
                why = "no cgroup is named so" if not found else f"{len(found)} are named so"
                raise UnknownName(f"{failed}; {why}") from None
            return found[0]
        if not path:
            raise UnknownName(f"unit {self.name} is not running (it has no cgroup)")
        return normalize(path)


# How each runtime names a container's cgroup (the id is the full one): podman (cgroupfs
# or systemd), docker (systemd, or cgroupfs's /docker/ID). Only the named runtime's
# naming is searched: a `docker` group member must not reach podman's containers.
CONTAINER_CGROUPS = {
    "podman": ("libpod-{}", "libpod-{}.scope"),
    "docker": ("docker-{}.scope", "docker/{}"),
}
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # a full id, as runtimes print it


def by_container_id(container_id: str, runtime: str, v2: str, uid: int = 0) -> str | None:
    """The cgroup (v2 path) of the container with this full id, by ``runtime``'s naming;
    None when no cgroup has it (not running). Of several, the system's (root-owned)
    one, then one of ``uid``'s: see _first."""
    names = {pattern.format(container_id) for pattern in CONTAINER_CGROUPS.get(runtime, ())}
    found = _first(_named(v2, names), v2, uid)
    if len(found) > 1:
        raise UnknownName(f"{len(found)} cgroups have container id {container_id[:12]}")
    return found[0] if found else None


def by_unit_name(unit: str, v2: str, uid: int = 0) -> list[str]:
    """Cgroups (v2 paths) named as the unit: systemd names a unit's cgroup after it,
    in its slice (/system.slice/x.service, or a user's under user@UID.service). Of
    several, the system's (root-owned) ones, then ``uid``'s: see _first."""
    return _first(_named(v2, {unit}), v2, uid)


def _named(v2: str, names: set[str]) -> list[str]:
    """The v2 paths of every cgroup whose own name, or parent/name, is one of ``names``."""
    return [
        normalize("/" + os.path.relpath(os.path.join(directory, sub), v2))
        for directory, subdirs, _files in os.walk(v2)
        for sub in subdirs
        if sub in names or f"{os.path.basename(directory)}/{sub}" in names
    ]


def _first(paths: list[str], v2: str, uid: int) -> list[str]:
    """Those of ``paths`` a name may mean: the cgroups root owns (a runtime's or
    systemd's own, outside every delegated subtree) where there are any, else those
    ``uid`` owns, else the rest. A directory a user makes in her own subtree, named
    after root's container or unit, so never wins over the real one."""

    def rank(path: str) -> int:
        try:
            owner = os.stat(v2 + path).st_uid
        except OSError:
            return 3  # gone since the walk
        return 0 if owner == 0 else 1 if owner == uid else 2

    ranks = {path: rank(path) for path in paths}
    best = min(ranks.values(), default=3)
    return [path for path, r in ranks.items() if r == best < 3]


def locate(name: CgroupName, where: Mounts, run: Runner = run_command, uid: int = 0) -> Cgroup:
    """The cgroup ``name`` names now, for user ``uid`` (who is preferred among cgroups
    of one name: _first); UnknownName saying why when none."""
    path = name.resolve(run, v2=where.v2, uid=uid)
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


_DOCKERS = re.compile(r"(?:^|/)(?:docker-[0-9a-f]{64}\.scope|docker/[0-9a-f]{64})$")


def refusal(name: CgroupName, cgroup: Cgroup, uid: int, gids: frozenset[int]) -> str | None:
    """Why user ``uid`` (groups ``gids``) may not have ``cgroup`` as ``name``'s target,
    or None: root may have any; a user the cgroups they own (a delegated subtree); the
    docker group docker's containers, named as docker names them (its socket lets it
    run them anyway), and nothing else by that right. Checked at registration and again
    whenever a name is followed to a new cgroup."""
    if uid == 0:
        return None
    try:
        owner = cgroup.owner()
    except OSError:
        return f"cgroup {cgroup.path} is gone"
    if owner == uid:
        return None
    if name.runtime == "docker" and _DOCKERS.search(cgroup.path) and runs_docker(gids):
        return None
    return (
        f"cgroup {cgroup.path} belongs to uid {owner}: root or its owner may register it "
        "(a user, cgroups delegated to them, such as under user@UID.service)"
    )


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
