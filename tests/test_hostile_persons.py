"""A share belongs to a person, not a uid: a user runs as any of her 65,536 subordinate
uids (/etc/subuid) inside a user namespace of her own, and every per-user bound counts
them as hers (core/persons.py). Root keeps a reserve of the API's connections and of
the running targets; one person's churn forgets her own finished targets, never
another's; no number of local users locks the scrapers out of /metrics.

The daemon tests run as root: they act as other uids (``os.seteuid`` in one helper
process for connections, ``user=`` for processes that register themselves), and read
the subordinate ranges from a file of their own (``subuid_path``), never /etc/subuid.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.core.facts.cgroup_traffic import CgroupTraffic
from edgewatt.core.kernel import nftables
from edgewatt.core.lookups import LookupLimits, LookupRefused, Lookups
from edgewatt.core.persons import RECHECK_S, Persons, Range, parse_ranges
from edgewatt.core.targets import History, Identity, Limits, Target, TooMany
from edgewatt.core.uids import alone
from tests.conftest import SYSTEM_PYTHON, DaemonProcess, call_as, wait_for
from tests.test_hostile import NOBODY, STRANGER, run_as, timed_health, timed_scrape
from tests.test_hostile_traffic import joining

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")

ALICE_RANGE = 100000  # nobody's subordinate uids in the tests' subuid file
BOB_RANGE = 200000  # STRANGER's


# -- the person of a uid -------------------------------------------------------------


def test_a_subuid_file_gives_each_range_to_its_owner_by_name_or_uid(tmp_path: Path) -> None:
    text = (
        "nobody:100000:65536\n"
        "4242:200000:65536\n"
        "no-such-user:300000:10\n"  # newuidmap could not use it either
        "# a comment\n\nbroken:1\n"
        "4343:210000:10\n"  # inside 4242's range: those uids stay 4242's
    )
    assert parse_ranges(text) == [Range(NOBODY, 100000, 65536), Range(4242, 200000, 65536)]
    (tmp_path / "subuid").write_text(text)
    persons = Persons(str(tmp_path / "subuid"))
    assert [persons.of(uid) for uid in (100000, 165535, 165536, 210005, 1000, 0)] == [
        NOBODY, NOBODY, 165536, 4242, 1000, 0,
    ]  # fmt: skip


def test_the_subuid_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "subuid"
    now = [0.0]
    persons = Persons(str(path), clock=lambda: now[0])
    assert persons.of(100001) == 100001  # no file: every uid is its own person
    path.write_text("nobody:100000:65536\n")
    now[0] += RECHECK_S
    assert persons.of(100001) == NOBODY
    path.write_text("4242:100000:65536\n")
    assert persons.of(100001) == NOBODY  # looked at once a second, not at every lookup
    now[0] += RECHECK_S
    assert persons.of(100001) == 4242
    path.unlink()
    now[0] += RECHECK_S
    assert persons.of(100001) == 100001


# -- the table's bounds, per person --------------------------------------------------


def _target(name: str, uid: int, exited_at: float | None = None) -> Target:
    identity = Identity(name, 1, 1, 0.0, {}, False, uid, 0.0)
    return Target(identity, History(1), exited_at=exited_at)


def person(uid: int) -> int:
    """Alice is NOBODY and her range; Bob STRANGER and his."""
    if ALICE_RANGE <= uid < ALICE_RANGE + 65536:
        return NOBODY
    if BOB_RANGE <= uid < BOB_RANGE + 65536:
        return STRANGER
    return uid


def test_a_persons_subordinate_uids_share_her_running_targets() -> None:
    limits = Limits(
        max_targets=30, history_samples=1, exited_retention_s=600, max_targets_per_uid=2
    )
    running = [ALICE_RANGE + 1, ALICE_RANGE + 2]
    refused = limits.refusal(running, ALICE_RANGE + 3, person)
    assert isinstance(refused, TooMany) and refused.detail == "at most 2 per user may run at once"
    assert limits.refusal(running, NOBODY, person) is not None  # her own uid too
    assert limits.refusal(running, BOB_RANGE + 1, person) is None  # another person
    assert limits.refusal(running, ALICE_RANGE + 3, alone) is None  # counted by uid: not


def test_root_keeps_a_tenth_of_the_running_targets() -> None:
    limits = Limits(
        max_targets=10, history_samples=1, exited_retention_s=600, max_targets_per_uid=5
    )
    users = [1000 + n for n in range(9)]  # nine persons, one target each
    refused = limits.refusal(users, 2000, person)
    assert isinstance(refused, TooMany)
    assert refused.detail == "at most 9 may run at once for users (1 kept for root)"
    assert limits.refusal(users, 0, person) is None
    assert limits.refusal([*users, 0], 0, person) is not None  # the total holds for root


def test_finished_targets_are_forgotten_per_person_the_largest_keeper_first() -> None:
    limits = Limits(max_targets=6, history_samples=1, exited_retention_s=600, max_targets_per_uid=4)
    alice = [_target(f"a{n}", NOBODY, exited_at=float(n)) for n in range(2)]
    # Bob churns from his subordinate uids after Alice's finished: 10 more.
    bob = [_target(f"b{n}", BOB_RANGE + n, exited_at=10.0 + n) for n in range(10)]
    gone = limits.expired(alice + bob, 20.0, person)
    assert sorted(gone) == sorted(f"b{n}" for n in range(6))  # his oldest six, none of hers
    # A third person fills the table: the total holds, whoever keeps the most gives.
    carol = [_target(f"c{n}", 3000, exited_at=30.0 + n) for n in range(3)]
    kept = [t for t in alice + bob + carol if t.id not in gone]
    gone = limits.expired(kept, 40.0, person)
    assert sorted(gone) == ["b6", "b7", "c0"]  # 2 + 2 + 2 left of 6
    # Past the retention everything goes, whoever it was.
    assert len(limits.expired(alice, 700.0, person)) == 2


def test_a_persons_subordinate_uids_share_her_name_lookups() -> None:
    lookups = Lookups(LookupLimits(rate_per_s=1.0, burst=2), lambda: 100.0, person)
    for uid in (ALICE_RANGE + 1, ALICE_RANGE + 2):  # her burst, from two of her uids
        with lookups.bounded(uid, f"podman:{uid}"):
            pass
    with pytest.raises(LookupRefused, match="per user"), lookups.bounded(NOBODY, "podman:x"):
        pass
    assert not lookups.follow(ALICE_RANGE + 3)
    with lookups.bounded(BOB_RANGE + 1, "podman:x"):  # another person has a bucket of his own
        pass


@pytest.mark.skipif(
    cgroups.mounts().v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)
def test_a_persons_subordinate_uids_share_her_network_namespaces(cgroup_dir: Path) -> None:
    """Each namespace a target's members use costs the daemon a context: 32 a person,
    whichever of her uids registered the targets (11 each for three of them)."""
    where = cgroups.mounts().v2
    assert where is not None
    traffic = CgroupTraffic(where, person=person)
    own = os.stat("/proc/self/ns/net").st_ino
    members: dict[str, list[subprocess.Popen]] = {name: [] for name in "abc"}
    try:
        for name, theirs in members.items():
            (cgroup_dir / name).mkdir()
            for _ in range(11):
                namespace = ["unshare", "-n", "sleep", "600"]
                theirs.append(subprocess.Popen(namespace, preexec_fn=joining(cgroup_dir / name)))
        every = [p for theirs in members.values() for p in theirs]
        wait_for(lambda: all(os.stat(f"/proc/{p.pid}/ns/net").st_ino != own for p in every))
        for n, (name, theirs) in enumerate(members.items()):
            path = f"/{cgroup_dir.name}/{name}"
            traffic.watch(name, path, 2, [p.pid for p in theirs], uid=ALICE_RANGE + n)
        assert traffic.problem("a") is None and traffic.problem("b") is None
        problem = traffic.problem("c")
        assert problem is not None and "more than 32 network namespaces" in problem, problem
    finally:
        for p in (p for theirs in members.values() for p in theirs):
            p.kill()
            p.wait()
        traffic.close()


# -- the daemon: the registration API's connections ----------------------------------

# Connections held as other uids by one root process: each made under os.seteuid(uid)
# (SO_PEERCRED and sock_diag give the uid a socket was made by). A plan is a list of
# [uid, source address or null for the Unix socket, count]. API connections ask for
# /healthz (200 taken, 429 refused); /metrics ones send nothing, and a last request on
# a connection of the plan's first uid, answered after every earlier connection was
# dealt with, tells the ones the daemon closed. It prints
# {uid: [open, refused]}, then holds: what the daemon ends is made again.
HOLDER = r"""
import json, os, select, socket, sys, time
target, plan = sys.argv[1], json.loads(sys.argv[2])
held = {}

def connect(uid, source):
    os.seteuid(uid)
    try:
        if source is None:
            s = socket.socket(socket.AF_UNIX)
            s.connect(target)
        else:
            s = socket.socket()
            s.bind((source, 0))
            s.connect(("127.0.0.1", int(target)))
    finally:
        os.seteuid(0)
    if source is not None:
        return s, True
    s.settimeout(10)
    head = b""
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    except OSError:  # a 429 came at once, and the connection ended
        pass
    while len(head) < 12:
        chunk = s.recv(12 - len(head))
        if not chunk:
            break
        head += chunk
    return s, head[9:12] == b"200"

def closed(s):
    try:
        return s.recv(1 << 16, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True

counts = {}
for uid, source, count in plan:
    for _ in range(count):
        s, taken = connect(uid, source)
        held[s] = (uid, source)
        counts.setdefault(str(uid), [0, 0])[0 if taken else 1] += 1
if plan[0][1] is not None:
    probe = connect(*plan[0][:2])[0]
    probe.sendall(b"GET /none HTTP/1.0\r\n\r\n")
    probe.settimeout(10)
    try:
        while probe.recv(1 << 16):
            pass
    except ConnectionResetError:  # closed before it read the request
        pass
    for s, (uid, _) in held.items():
        if closed(s):
            counts[str(uid)][0] -= 1
            counts[str(uid)][1] += 1
print(json.dumps(counts), flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.2)  # paced: a holder, not a flood
    for s in [s for s in held if closed(s)]:
        again = held.pop(s)
        s.close()
        held[connect(*again)[0]] = again
"""


def hold(target: str | int, plan: list[list[Any]]) -> tuple[subprocess.Popen, dict[int, list[int]]]:
    holder = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", HOLDER, str(target), json.dumps(plan)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line, "the holder ended before it reported"
    return holder, {int(uid): counts for uid, counts in json.loads(line).items()}


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for holder in started:
        holder.kill()
        holder.wait()


def subuid_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "subuid"
    path.write_text(text)
    return {"EDGEWATT_SUBUID_PATH": str(path)}


def healthz_as(uid: int, socket_path: str) -> str:
    """The status of GET /healthz asked by a process of ``uid``."""
    other = run_as(
        uid,
        "import contextlib, socket\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({socket_path!r})\n"
        # A refusal (429) is written and the connection closed before it is read.
        "with contextlib.suppress(BrokenPipeError, ConnectionResetError):\n"
        "    s.sendall(b'GET /healthz HTTP/1.1\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "print(s.recv(100).split()[1].decode())",
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return str(other.communicate(timeout=10)[0].strip())


@as_root
def test_a_users_subordinate_uids_share_her_api_connections(
    daemon_factory: Any, public_dir: Path, tmp_path: Path, holders: list[subprocess.Popen]
) -> None:
    env = subuid_file(tmp_path, "nobody:100000:65536\n")
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    plan = [[ALICE_RANGE + 1, None, 32], [ALICE_RANGE + 2, None, 8], [NOBODY, None, 1]]
    holder, counts = hold(daemon.socket, plan)
    holders.append(holder)
    # Her 32: one uid of hers took them all, so her second uid and her own get 429
    # (counted by uid, these 9 connections were let in).
    assert counts == {ALICE_RANGE + 1: [32, 0], ALICE_RANGE + 2: [0, 8], NOBODY: [0, 1]}
    assert healthz_as(STRANGER, daemon.socket) == "200"  # another user still served
    assert timed_health(daemon.socket) < 5  # root too


@as_root
def test_root_is_served_whatever_the_users_hold(
    daemon_factory: Any, public_dir: Path, tmp_path: Path, holders: list[subprocess.Popen]
) -> None:
    daemon = daemon_factory(socket_dir=public_dir, env=subuid_file(tmp_path, ""))
    # Four users (no ranges: four uids, four persons) ask for all 128 connections.
    holder, counts = hold(daemon.socket, [[ALICE_RANGE + n, None, 32] for n in range(4)])
    holders.append(holder)
    # Root's 16, at once, while the users keep theirs: none is refused.
    root = hold(daemon.socket, [[0, None, 16]])
    holders.append(root[0])
    assert root[1] == {0: [16, 0]}
    assert sum(taken for taken, _ in counts.values()) == 112  # 16 are root's alone
    assert sum(refused for _, refused in counts.values()) == 16


# -- the daemon: running and finished targets ----------------------------------------

SLEEPER = "import time; time.sleep(60)"


def registrations_as(uid: int, public: Path, socket_path: str, count: int, churn: bool) -> Any:
    """``count`` registrations of itself by one process of ``uid``, each a new target:
    with ``churn``, each unregistered at once (a finished target); without, the
    process stays registered once and its children are registered (sleepers it
    starts, killed at its end). Returns the statuses."""
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", registrations(socket_path, count, churn)], user=uid, group=uid,
        cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def registrations(socket_path: str, count: int, churn: bool) -> str:
    """The code of registrations_as: it prints the statuses, then waits for its stdin
    to end."""
    return f"""
import json, subprocess, sys
from edgewatt.core import transport
path, statuses, children = {socket_path!r}, [], []
for n in range({count}):
    if {churn!r}:
        status, body = transport.call(path, "POST", "/v1/targets", {{"labels": {{"who": "churn"}}}})
        if status == 201:
            transport.call(path, "DELETE", "/v1/targets/" + body["id"])
    else:
        child = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}])
        children.append(child)
        status, _ = transport.call(path, "POST", "/v1/targets", {{"pid": child.pid}})
    statuses.append(status)
print(json.dumps(statuses), flush=True)
if children:
    sys.stdin.read()
for child in children:
    child.kill()
"""


def statuses(process: subprocess.Popen) -> list[int]:
    assert process.stdout is not None
    return list(json.loads(process.stdout.readline()))


@as_root
def test_a_users_subordinate_uids_share_her_running_targets(
    daemon_factory: Any, public_dir: Path, tmp_path: Path
) -> None:
    env = {"EDGEWATT_MAX_TARGETS_PER_UID": "2", **subuid_file(tmp_path, "nobody:100000:65536\n")}
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    first = registrations_as(ALICE_RANGE + 1, public_dir, daemon.socket, 2, churn=False)
    second = None
    try:
        assert statuses(first) == [201, 201]
        second = registrations_as(ALICE_RANGE + 2, public_dir, daemon.socket, 1, churn=False)
        assert statuses(second) == [429]  # her third, from another of her uids
        sleeper = run_as(STRANGER, SLEEPER)
        try:
            answer = call_as(STRANGER, public_dir, daemon.socket, "POST", "/v1/targets",
                             {"pid": sleeper.pid})  # fmt: skip
            assert answer[0] == 201  # another user's first
        finally:
            sleeper.kill()
            sleeper.wait()
    finally:
        for process in (first, second):
            if process is not None:
                process.communicate("", timeout=10)


@as_root
def test_users_together_leave_root_a_tenth_of_the_targets(
    daemon_factory: Any, public_dir: Path, tmp_path: Path, spawn: Any
) -> None:
    daemon = daemon_factory(socket_dir=public_dir, env={"EDGEWATT_MAX_TARGETS": "10"})
    users = [
        registrations_as(uid, public_dir, daemon.socket, 5, churn=False)
        for uid in (ALICE_RANGE + 1, BOB_RANGE + 1)
    ]
    try:
        assert sorted(statuses(users[0]) + statuses(users[1])) == [201] * 9 + [429]
        assert daemon.register(spawn(SLEEPER).pid)["pid"]  # root's tenth
    finally:
        for process in users:
            process.communicate("", timeout=10)


@as_root
def test_one_persons_churn_never_forgets_anothers_finished_targets(
    daemon_factory: Any, public_dir: Path, tmp_path: Path
) -> None:
    env = {
        "EDGEWATT_MAX_TARGETS": "10",
        "EDGEWATT_MAX_TARGETS_PER_UID": "3",
        **subuid_file(tmp_path, "4242:200000:65536\n"),
    }
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    sleeper = run_as(NOBODY, SLEEPER)
    try:
        status, alices = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets",
                                 {"pid": sleeper.pid})  # fmt: skip
        assert status == 201
    finally:
        sleeper.kill()
        sleeper.wait()
    # Her process exited; then Bob churns, as himself and as two of his uids: 24
    # registrations, each unregistered at once.
    churners = [
        registrations_as(uid, public_dir, daemon.socket, 8, churn=True)
        for uid in (STRANGER, BOB_RANGE + 1, BOB_RANGE + 2)
    ]
    for churner in churners:
        assert statuses(churner) == [201] * 8
        churner.communicate("", timeout=10)

    def churned() -> int:
        targets = daemon.call("GET", "/v1/targets")[1]["targets"]
        return sum(t["labels"].get("who") == "churn" for t in targets)

    def summary() -> tuple[int, Any]:
        return daemon.call("GET", f"/v1/targets/{alices['id']}/summary")

    # A pass forgets what is over the bounds: his oldest (or, counted in all, hers).
    wait_for(lambda: churned() == 3 or summary()[0] == 404)
    assert summary()[0] == 200, summary()  # hers is kept its 600 s
    assert churned() == 3


# -- the daemon: /metrics connections ------------------------------------------------


@as_root
def test_a_users_uids_and_addresses_share_one_scrape_share(
    daemon: DaemonProcess, tmp_path: Path, holders: list[subprocess.Popen]
) -> None:
    """16 from 127.0.0.1 refused local scrapers there, 16 from each of 127.0.0.2-17
    every scraper: counted by uid, a local user holds 16, however many addresses."""
    plan = [[NOBODY, f"127.0.0.{n}", 16] for n in range(1, 18)]
    holder, counts = hold(daemon.port, plan)
    holders.append(holder)
    for _ in range(5):
        _, answer = timed_scrape(daemon.port, "127.0.0.1")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    assert counts[NOBODY][0] == 16


@as_root
def test_a_full_metrics_endpoint_still_lets_a_scraper_in(
    daemon_factory: Any, tmp_path: Path, holders: list[subprocess.Popen]
) -> None:
    daemon = daemon_factory(env=subuid_file(tmp_path, "nobody:100000:65536\n"))
    # Alice's subordinate uids are hers: 16 of them hold 16 in all.
    alice = [[ALICE_RANGE + n, f"127.0.0.{n}", 16] for n in range(1, 17)]
    holder, counts = hold(daemon.port, alice)
    holders.append(holder)
    assert sum(taken for taken, _ in counts.values()) == 16
    # 17 persons of 16 each (272): the 256 are full, and stay so while they hold.
    others = [[300000 + n, f"127.0.1.{n}", 16] for n in range(1, 18)]
    holder, counts = hold(daemon.port, others)
    holders.append(holder)
    assert sum(taken for taken, _ in counts.values()) >= 256 - 16
    for _ in range(5):  # a scraper with none open gets in: the largest holder gives
        _, answer = timed_scrape(daemon.port, "127.0.0.1")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    assert run_scrape_as(STRANGER, daemon.port).startswith("HTTP/1.1 200")


def run_scrape_as(uid: int, port: int) -> str:
    """The status line of a scrape by a process of ``uid``."""
    code = (
        "import socket\n"
        f"s = socket.socket(); s.connect(('127.0.0.1', {port}))\n"
        "s.sendall(b'GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode())"
    )
    return str(run_as(uid, code, stdout=subprocess.PIPE, text=True).communicate(timeout=10)[0])
