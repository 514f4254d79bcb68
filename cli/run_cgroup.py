"""Where `edgewatt run` puts its command: a cgroup of its own whenever the machine
allows it, so that the daemon counts every byte of its traffic (a connection opened
and closed between two passes included), else a process target.

- root: ``/edgewatt/run-PID`` (cgroups.OwnCgroup);
- a user whose own cgroup is delegated to them (already under ``systemd-run --user
  --scope``, or inside such a run): a child of it;
- a user whose systemd user manager answers: `edgewatt run` runs itself again inside
  a transient scope of that manager (``systemd-run --user --scope -p Delegate=yes``),
  which delegates the scope to the user, and goes on there as above. systemd-run
  rather than edgewatt's own D-Bus call: it reaches the manager by its private socket
  where no session bus runs (a login without dbus-user-session, `su`), and it has the
  system manager move a process that lives in a login session's cgroup, which the user
  may not move herself; exec keeps the pid, the terminal, the signals and the exit
  status of `edgewatt run` as they were.
- otherwise a process target, after one line saying what that costs.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
from typing import Callable, NoReturn

from edgewatt.core import transport
from edgewatt.core.facts import cgroups

AUTO, INSIST, NO = "auto", "insist", "no"
# Set in the environment of the `edgewatt run` that systemd-run starts in the scope: it
# never asks for another (and its command does not inherit it).
IN_SCOPE = "EDGEWATT_RUN_SCOPE"
COST = "a connection it opens and closes between two of the daemon's passes is not counted"


class NoCgroup(Exception):
    """No cgroup of its own for the command; the message says why."""


def own_cgroup(
    mode: str, arguments: list[str], before_exec: Callable[[], None] = lambda: None
) -> cgroups.OwnCgroup | None:
    """The command's cgroup, made now; None for ``mode`` NO. NoCgroup saying why where
    none can be made (the caller falls back, or refuses for INSIST). Where a user
    manager can delegate one, this process becomes `edgewatt run ARGUMENTS` in a scope
    of it (:func:`exec_in_scope`) after ``before_exec``, and this call does not return."""
    in_scope = os.environ.pop(IN_SCOPE, None) is not None  # never the command's
    if mode == NO:
        return None
    where = cgroups.mounts()
    try:
        return cgroups.OwnCgroup(where)
    except (OSError, cgroups.InvalidCgroup) as exc:
        why = str(exc)
    if os.geteuid() == 0 or in_scope or where.v2 is None:
        raise NoCgroup(why)
    manager = user_manager()
    if manager is None:
        raise NoCgroup(f"{why}, and no systemd user manager answers to delegate one")
    before_exec()
    try:
        exec_in_scope(manager, arguments)
    except OSError as exc:
        raise NoCgroup(f"{why}; systemd-run cannot be run: {exc}") from None


def daemon_counts(socket_path: str | None) -> tuple[bool, str | None]:
    """(whether a daemon answers, why it cannot count a cgroup's traffic or None): a
    cgroup of its own is worth asking for only where one answers and can (else the
    command's process tree is sampled, in-process or as a process target, whose TCP
    bytes a daemon without nftables counts still)."""
    found = transport.find_daemon(socket_path)
    if found.path is None:
        return False, None
    try:
        health = transport.call_ok(found.path, "GET", "/healthz", timeout=1.0)
    except (OSError, transport.DaemonError):
        return False, None
    problem = health.get("cgroup_traffic") if isinstance(health, dict) else None
    return True, None if problem is None else str(problem)


def process_target_reason(proc: str = "/proc") -> str | None:
    """Why `edgewatt run` here would make a process target, None where its command gets
    a cgroup of its own (asked without making one: `edgewatt doctor`)."""
    v2 = cgroups.mounts().v2
    if v2 is None:
        return "this host has no cgroup v2 mount"
    if os.geteuid() == 0:
        return None
    try:
        own = cgroups.cgroup_of(os.getpid(), proc)
        if os.stat(v2 + own.rstrip("/")).st_uid == os.geteuid():
            return None
    except (OSError, cgroups.InvalidCgroup) as exc:
        return str(exc)
    if user_manager() is not None:
        return None
    return f"your cgroup {own} is not delegated to you and no systemd user manager answers"


def user_manager(uid: int | None = None) -> str | None:
    """The runtime directory of this user's systemd manager where it answers on its
    private socket (as `systemctl --user` and `systemd-run --user` reach it), else
    None. ``$XDG_RUNTIME_DIR``, else ``/run/user/UID`` where it is the user's own (a
    login by `su` leaves the variable unset)."""
    uid = os.geteuid() if uid is None else uid
    if shutil.which("systemd-run") is None:
        return None
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    try:
        if os.stat(runtime_dir).st_uid != uid:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(f"{runtime_dir}/systemd/private")
    except OSError:
        return None
    return runtime_dir


def scope_command(arguments: list[str], pid: int) -> list[str]:
    """systemd-run's command line running `edgewatt run ARGUMENTS` again in a transient
    scope delegated to the user, named after this run (a random part: never the name
    of a scope still running); it is collected when it ends, failed or not."""
    return [
        "systemd-run", "--user", "--scope", "--quiet", "--collect", "-p", "Delegate=yes",
        f"--unit=edgewatt-run-{pid}-{secrets.token_hex(3)}", "--",
        sys.executable, "-m", "edgewatt.cli", "run", *arguments,
    ]  # fmt: skip


def exec_in_scope(runtime_dir: str, arguments: list[str]) -> NoReturn:
    """Become systemd-run running `edgewatt run ARGUMENTS` in a scope (no return; an
    OSError where systemd-run cannot be executed)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime_dir, IN_SCOPE: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    command = scope_command(arguments, os.getpid())
    os.execvpe(command[0], command, env)
