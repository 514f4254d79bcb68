"""What a registration may hold, checked the same way wherever one comes from: a
request to the API, or an entry of the state file restored at startup (which anyone
who could write that file may have shaped).

Who may register which process is the target table's rule (``TargetTable.register``
checks it on the live process), so a restored entry passes it again too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from edgewatt.core.facts import cgroup_names
from edgewatt.core.facts.cgroup_names import CgroupName
from edgewatt.core.facts.cgroups import InvalidCgroup
from edgewatt.core.facts.commands import MAX_COMMAND, command_name
from edgewatt.core.labels import LabelError, validate_labels
from edgewatt.core.targets.access import MAX_HOLDERS
from edgewatt.core.text import printable

TARGET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no uid"


class InvalidRegistration(ValueError):
    """``error`` is the short reason the API answers with, ``detail`` names the field."""

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail


@dataclass(frozen=True)
class Registration:
    pid: int  # 0 for a cgroup
    labels: dict[str, str]
    children: bool
    cgroup: CgroupName | None = None  # a cgroup target: a path, a unit or a container
    # What it will exec, named as a person names it (``true``, ``python3 train.py``):
    # `edgewatt run`'s word for its held fork, whose own command line is the launcher's.
    command: str | None = None


@dataclass(frozen=True)
class Saved:
    """A registration as the state file keeps it, to be registered again."""

    registration: Registration
    target_id: str
    start_ticks: int
    uid: int
    registered_at: float
    holders: int


def parse_request(body: dict[str, Any], caller_pid: int, pid_max: int) -> Registration:
    """A POST /v1/targets body: a process (``pid``, by default the caller's) or a
    cgroup (``cgroup`` path, ``unit`` or ``container`` with an optional ``runtime``)."""
    known = {"pid", "labels", "children", "command", *CGROUP_FIELDS, "runtime", "container_id"}
    reject_unknown(body, known)
    named = [k for k in ("pid", *CGROUP_FIELDS) if k in body]
    if len(named) > 1:
        raise InvalidRegistration("conflicting fields", f"give one of {', '.join(named)}")
    for extra in ("runtime", "container_id"):
        if extra in body and named != ["container"]:
            raise InvalidRegistration(f"invalid {extra}", f"{extra} goes with container")
    if named and named[0] in CGROUP_FIELDS:
        if "children" in body:
            raise InvalidRegistration("invalid children", "a cgroup is counted whole")
        kind = named[0]
        name = _cgroup_name(kind, body[kind], body)
        return Registration(0, _labels(body), True, name, _command(body.get("command")))
    registration = _registration(body, caller_pid, pid_max)
    return replace(registration, command=_command(body.get("command")))


def _command(argv: object) -> str | None:
    """The ``command`` field, argv as the command will have it, as its name (None:
    not given): bounded and escaped as a command line read from /proc is."""
    if argv is None:
        return None
    if not isinstance(argv, list) or not argv or not all(isinstance(w, str) for w in argv):
        raise InvalidRegistration("invalid command", "command must be a list of strings (argv)")
    name = command_name(argv)
    if name is None:
        raise InvalidRegistration("invalid command", "command has no non-empty word")
    return name


def _saved_command(name: object) -> str | None:
    """A saved entry's ``command``: a name made by _command, checked as one again."""
    if name is None:
        return None
    if not isinstance(name, str) or not 0 < len(name) <= MAX_COMMAND or printable(name) != name:
        raise InvalidRegistration("invalid command", f"{name!r:.80} is not a command's name")
    return name


CGROUP_FIELDS = ("cgroup", "unit", "container")


def _cgroup_name(kind: str, name: object, body: dict[str, Any]) -> CgroupName:
    try:
        return cgroup_names.parse(kind, name, body.get("runtime"), body.get("container_id"))
    except InvalidCgroup as exc:
        raise InvalidRegistration(f"invalid {kind}", str(exc)) from None


def parse_saved(entry: object, pid_max: int) -> Saved:
    """One entry of the state file's ``targets`` list."""
    if not isinstance(entry, dict):
        raise InvalidRegistration("invalid entry", f"an object is needed, got {_kind(entry)}")
    reject_unknown(entry, {"id", "pid", "start_ticks", "labels", "children", "uid",
                            "registered_at", "holders", "cgroup", "command"})  # fmt: skip
    for key in ("id", "pid", "start_ticks", "uid"):
        if key not in entry:
            raise InvalidRegistration(f"no {key}", f"the entry has no {key!r}")
    target_id = entry["id"]
    if not isinstance(target_id, str) or not TARGET_ID.fullmatch(target_id):
        raise InvalidRegistration("invalid id", f"{target_id!r:.80} is not a target id")
    registered_at = entry.get("registered_at")
    if (
        isinstance(registered_at, bool)
        or not isinstance(registered_at, (int, float))
        or not math.isfinite(registered_at)
        or registered_at <= 0
    ):
        raise InvalidRegistration("invalid registered_at", f"got {registered_at!r:.40}")
    if "cgroup" in entry:
        saved = entry["cgroup"]
        if not isinstance(saved, dict) or not isinstance(saved.get("kind"), str):
            raise InvalidRegistration("invalid cgroup", "an object with kind and name is needed")
        if saved["kind"] not in CGROUP_FIELDS:
            raise InvalidRegistration("invalid cgroup", f"kind {saved['kind']!r:.40} is unknown")
        extra = {
            "runtime": saved.get("runtime") or None,
            "container_id": saved.get("container_id") or None,
        }
        name = _cgroup_name(saved["kind"], saved.get("name"), extra)
        registration = Registration(0, _labels(entry), True, name)
    else:
        registration = _registration(entry, None, pid_max)
    return Saved(
        replace(registration, command=_saved_command(entry.get("command"))),
        target_id,
        _integer(entry, "start_ticks", 0, 2**63 - 1),
        _integer(entry, "uid", 0, MAX_UID),
        float(registered_at),
        _integer(entry, "holders", 1, MAX_HOLDERS, default=1),
    )


def _registration(body: dict[str, Any], caller_pid: int | None, pid_max: int) -> Registration:
    if caller_pid is not None and "pid" not in body:
        pid = caller_pid
    else:
        pid = _integer(body, "pid", 1, pid_max)
    children = body.get("children", True)
    if not isinstance(children, bool):
        raise InvalidRegistration("invalid children", "children must be true or false")
    return Registration(pid, _labels(body), children)


def _labels(body: dict[str, Any]) -> dict[str, str]:
    try:
        return validate_labels(body.get("labels"))
    except LabelError as exc:
        raise InvalidRegistration("invalid labels", str(exc)) from None


def _integer(body: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRegistration(f"invalid {key}", f"{key} must be an integer, got {value!r:.40}")
    if not lo <= value <= hi:
        raise InvalidRegistration(f"invalid {key}", f"{key} must be {lo}..{hi}, got {value}")
    return value


def reject_unknown(body: dict[str, Any], known: set[str]) -> None:
    """Refuse a field this version does not know, naming it: a misspelling would
    otherwise pass unnoticed."""
    unknown = sorted(str(k) for k in set(body) - known)
    if unknown:
        detail = f"{unknown[0][:80]!r}; known fields: {', '.join(sorted(known))}"
        raise InvalidRegistration("unknown field", detail)


def _kind(value: object) -> str:
    return type(value).__name__
