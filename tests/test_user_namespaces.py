"""A peer in a user namespace is its owner's (core/user_namespaces.py): whatever uids
the namespace maps, and whether or not /etc/subuid names them (ranges from libsubid's
nss sources, or written by root, are not in it).

The namespaces here are real: made by NOBODY with ``unshare --user``, their uid maps
written by the test as root (0-99 inside are 500000-500099 outside, in no subuid file),
so the daemon meets uids it knows nothing of but through the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import persons as persons_module
from edgewatt.core.persons import Persons
from edgewatt.core.user_namespaces import namespace_owner, owners
from tests.conftest import SYSTEM_PYTHON, wait_for
from tests.machine import user_namespace_as
from tests.test_hostile import NOBODY, STRANGER
from tests.test_hostile_persons import HOLDER, SLEEPER, healthz_as, statuses, subuid_file

BASE = 500000  # the namespace's uid 0, outside it

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or user_namespace_as(NOBODY) is not None,
    reason=f"needs root and user namespaces for users ({user_namespace_as(NOBODY)})"
    if os.geteuid() == 0
    else "needs root to act as other users",
)

# Make a user namespace and enter it (unshare(2) itself: an unshare(1) would exec its
# command before the maps are written, as an unmapped uid, and lose the namespace's
# capabilities); wait until the test wrote the maps, become the inside uid argv[1]
# (its root keeps the capabilities), run argv[2:].
ENTER = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
    raise OSError(ctypes.get_errno(), "unshare")
os.read(0, 3)
os.setgid(0)
os.setuid(int(sys.argv[1]))
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def in_namespace(inside_uid: int, argv: list[str]) -> subprocess.Popen:
    """``python3 argv`` as ``inside_uid`` of a user namespace NOBODY made, its uids
    0-99 mapped to BASE-BASE+99."""
    env = {"PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", ENTER, str(inside_uid), *argv],
        user=NOBODY, group=NOBODY, cwd="/", env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    own = os.stat("/proc/self/ns/user").st_ino
    wait_for(lambda: os.stat(f"/proc/{process.pid}/ns/user").st_ino != own)
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{process.pid}/{name}").write_text(f"0 {BASE} 100\n")
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()
    return process


# Registers ``count`` sleepers it starts, in raw HTTP (the client, inside the namespace,
# sees the daemon's root as an unmapped uid and trusts no such server); prints the
# statuses, then holds them until its stdin ends.
REGISTRATIONS = """
import json, socket, subprocess, sys
path, count, statuses, children = sys.argv[1], int(sys.argv[2]), [], []
for _ in range(count):
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    children.append(child)
    body = json.dumps({"pid": child.pid}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"POST /v1/targets HTTP/1.1\\r\\nConnection: close\\r\\nContent-Length: "
              + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
    statuses.append(int(s.makefile("rb").readline().split()[1]))
    s.close()
print(json.dumps(statuses), flush=True)
sys.stdin.read()
for child in children:
    child.kill()
""".replace("SLEEPER", repr(SLEEPER))


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


# -- the owner of a peer's namespace -------------------------------------------------


@needs_namespaces
def test_a_nested_namespace_is_the_outermost_owners(started: list[subprocess.Popen]) -> None:
    # Her namespace's root makes one more inside it (its own root is BASE outside).
    nest = (
        "import os; os.execvp('unshare', ['unshare', '--user', '--map-root-user', 'sleep', '60'])"
    )
    process = in_namespace(0, ["-c", nest])
    started.append(process)

    def chain() -> list[int]:
        with open(f"/proc/{process.pid}/ns/user") as namespace:
            return owners(namespace.fileno(), os.stat("/proc/self/ns/user").st_ino)

    wait_for(lambda: len(chain()) == 2)
    assert chain() == [BASE, NOBODY]  # the inner one made by her namespace's root
    pidfd = os.pidfd_open(process.pid)
    try:
        assert namespace_owner(process.pid, BASE, pidfd) == NOBODY
        assert namespace_owner(process.pid, BASE, None) == NOBODY  # by its uid
        # Not the peer: another uid connected (its pid reused since), or, with a
        # pidfd, a peer that is gone.
        assert namespace_owner(process.pid, BASE + 1, None) is None
        gone = subprocess.Popen(["true"])
        gone_fd = os.pidfd_open(gone.pid)
        gone.wait()
        try:
            assert namespace_owner(process.pid, BASE, gone_fd) is None
        finally:
            os.close(gone_fd)
    finally:
        os.close(pidfd)
    assert namespace_owner(os.getpid(), 0, None) is None  # the daemon's own namespace


def test_a_uid_learned_is_its_owners_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    persons = Persons("/nonexistent", clock=lambda: now[0])
    monkeypatch.setattr(persons_module, "MAX_LEARNED_PER_PERSON", 2)
    assert persons.learn(BASE + 1, NOBODY) and persons.learn(BASE + 2, NOBODY)
    assert persons.of(BASE + 1) == NOBODY and persons.learned(BASE + 2)
    assert not persons.learn(BASE + 3, NOBODY)  # her room is full
    assert persons.of(BASE + 3) == BASE + 3
    assert persons.learn(BASE + 3, STRANGER)  # another person's room is his
    # Past the idle time, what holds no target is forgotten when room is needed.
    persons.in_use = lambda: {BASE + 1}
    now[0] += persons_module.LEARNED_IDLE_S
    assert persons.learn(BASE + 4, NOBODY)
    assert persons.of(BASE + 1) == NOBODY  # a target's uid stays hers
    assert persons.of(BASE + 2) == BASE + 2


# -- the daemon ----------------------------------------------------------------------


@needs_namespaces
def test_a_namespaces_uids_share_its_owners_api_connections(
    daemon_factory: Any, public_dir: Path, tmp_path: Path, started: list[subprocess.Popen]
) -> None:
    daemon = daemon_factory(socket_dir=public_dir, env=subuid_file(tmp_path, ""))
    plan = [[1, None, 32], [2, None, 8]]  # inside uids: BASE + 1 and BASE + 2 outside
    holder = in_namespace(0, ["-c", HOLDER, daemon.socket, json.dumps(plan)])
    started.append(holder)
    assert holder.stdout is not None
    counts = json.loads(holder.stdout.readline())
    # Her 32, whichever uid of her namespace took them (counted by uid, 40 were let in).
    assert counts == {"1": [32, 0], "2": [0, 8]}
    assert healthz_as(NOBODY, daemon.socket) == "429"  # her own uid: hers too
    assert healthz_as(STRANGER, daemon.socket) == "200"


@needs_namespaces
def test_a_namespaces_uids_share_its_owners_running_targets(
    daemon_factory: Any, public_dir: Path, tmp_path: Path, started: list[subprocess.Popen]
) -> None:
    env = {"EDGEWATT_MAX_TARGETS_PER_UID": "2", **subuid_file(tmp_path, "")}
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    first = in_namespace(1, ["-c", REGISTRATIONS, daemon.socket, "2"])
    started.append(first)
    try:
        assert statuses(first) == [201, 201]
        second = in_namespace(2, ["-c", REGISTRATIONS, daemon.socket, "1"])
        started.append(second)
        assert statuses(second) == [429]  # her third, from another uid of her namespace
        assert len(daemon.call("GET", "/v1/targets")[1]["targets"]) == 2
    finally:
        for process in started:  # their children (sleepers) end with them
            process.communicate("", timeout=10)
