"""Cgroup targets attacked as a hostile local user would: a normal user
(``nobody``) with a delegated cgroup, as systemd's user@UID.service gives every
logged-in user, beside root's podman containers and services. Real cgroups, the real
daemon over its socket, a real podman container where the finding is about one.

Each test names the finding it covers; each failed on the code before the fix.
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroups, procfs
from edgewatt.core.facts.cgroups import Cgroup, CgroupTree
from tests.conftest import ROOT, SYSTEM_PYTHON, DaemonProcess, call_as, wait_for
from tests.test_containers import AVAILABLE as PODMAN
from tests.test_containers import LIMITS, podman
from tests.test_containers import image as image  # the fixture

NOBODY = 65534
WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0, reason="needs root and a cgroup v2 mount"
)
needs_podman = pytest.mark.skipif(not PODMAN, reason="needs podman and busybox-static")


def delegated(parent: Path, uid: int) -> Path:
    """A cgroup handed to ``uid`` as systemd delegates one (user@UID.service): the
    directory and its cgroup.procs, cgroup.threads, cgroup.subtree_control are theirs."""
    home = parent / "user"
    home.mkdir()
    for path in (home, *(home / f for f in ("cgroup.procs", "cgroup.threads",
                                              "cgroup.subtree_control"))):  # fmt: skip
        os.chown(path, uid, uid)
    return home


def as_user(uid: int, *argv: str) -> None:
    subprocess.run(argv, user=uid, group=uid, check=True, cwd="/", capture_output=True)


def her_unit(daemon: DaemonProcess, public: Path, parent: Path, stem: str) -> tuple[Path, str]:
    """A unit's cgroup made by ``nobody`` in her delegated subtree, registered by her
    by the unit's name (no systemd manager here: the daemon finds it by its cgroup's
    name); (the cgroup, the target id)."""
    unit = f"edgewatt-{stem}{os.getpid()}.service"
    made = delegated(parent, NOBODY) / unit
    as_user(NOBODY, "mkdir", str(made))
    status, target = call_as(NOBODY, public, daemon.socket, "POST", "/v1/targets",
                             {"unit": unit})  # fmt: skip
    assert status == 201, target
    return made, target["id"]


def v2_path(directory: Path) -> str:
    assert WHERE.v2 is not None
    return "/" + str(directory.relative_to(WHERE.v2))


def summary(daemon: DaemonProcess, target_id: str) -> dict[str, Any]:
    status, body = daemon.call("GET", f"/v1/targets/{target_id}/summary?fresh=1")
    assert status == 200, body
    return body


@pytest.fixture
def root_container(image: str) -> Iterator[Any]:
    """Start root's container (``start(name)`` -> its full id); removed at the end."""
    started: list[str] = []

    def start(name: str) -> str:
        podman("rm", "-f", name, check=False)
        started.append(name)
        return podman("run", "-d", "--name", name, *LIMITS, image, "/bin/sleep", "600")

    yield start
    for name in started:
        podman("rm", "-f", "-t", "0", name, check=False)


# -- 1. a followed name is checked again; a decoy never wins ----------------------------


@needs_podman
def test_a_container_name_followed_to_roots_container_ends_the_users_target(
    daemon_factory: Any, public_dir: Path, cgroup_dir: Path, root_container: Any
) -> None:
    daemon = daemon_factory(interval=0.2, socket_dir=public_dir)
    home = delegated(cgroup_dir, NOBODY)
    name, made_up = f"edgewatt-victim-{os.getpid()}", secrets.token_hex(32)
    decoy = home / f"libpod-{made_up}"
    as_user(NOBODY, "mkdir", str(decoy))  # her own, named as podman names a container
    body = {"container": name, "runtime": "podman", "container_id": made_up}
    status, target = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
    assert status == 201, target  # her own cgroup: she may
    assert target["cgroup"]["path"] == v2_path(decoy)
    real = root_container(name)  # root starts a container of that name
    as_user(NOBODY, "rmdir", str(decoy))
    ended = wait_for(lambda: (s := summary(daemon, target["id"]))["state"] == "exited" and s)
    assert ended["cgroup"]["path"] == v2_path(decoy)  # never root's
    assert "belongs to uid 0" in ended["end_reason"], ended
    assert f"libpod-{real}" in ended["end_reason"]
    assert "followed to" not in daemon.log()
    # Its series left /metrics; root's container was never counted for her.
    assert daemon.series("process_cpu_time_seconds_total", container_name=name) == []


@needs_podman
def test_a_decoy_named_after_a_running_containers_id_never_wins(
    daemon_factory: Any, public_dir: Path, cgroup_dir: Path, root_container: Any
) -> None:
    daemon = daemon_factory(interval=0.5, socket_dir=public_dir)
    real = root_container(f"edgewatt-running-{os.getpid()}")
    home = delegated(cgroup_dir, NOBODY)
    # The id is anyone's to read, in /proc/PID/cgroup; her decoy may be met first.
    as_user(NOBODY, "mkdir", str(home / f"libpod-{real}"))
    body = {"container": f"no-such-{os.getpid()}", "runtime": "podman", "container_id": real}
    status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
    assert status == 403 and answer["error"] == "not your cgroup", answer
    assert "belongs to uid 0" in answer["detail"]


def test_a_unit_name_followed_to_roots_service_ends_the_users_target(
    daemon_factory: Any, public_dir: Path, cgroup_dir: Path
) -> None:
    daemon = daemon_factory(interval=0.2, socket_dir=public_dir)
    decoy, target_id = her_unit(daemon, public_dir, cgroup_dir, "x")
    unit = decoy.name
    service = cgroup_dir / "system.slice" / unit  # root's service of that name starts
    service.mkdir(parents=True)
    # While both are there, a new registration of hers gets root's: refused.
    status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets",
                             {"unit": unit, "labels": {"again": "1"}})  # fmt: skip
    assert status == 403 and "belongs to uid 0" in answer["detail"], answer
    as_user(NOBODY, "rmdir", str(decoy))
    ended = wait_for(lambda: (s := summary(daemon, target_id))["state"] == "exited" and s)
    assert ended["cgroup"]["path"] == v2_path(decoy)
    assert f"cgroup {v2_path(service)} belongs to uid 0" in ended["end_reason"], ended
    # Root's own registration of the name gets root's service.
    status, roots = daemon.call("POST", "/v1/targets", {"unit": unit})
    assert status == 201 and roots["cgroup"]["path"] == v2_path(service), roots


# -- 2. the docker group reaches docker's containers only ------------------------------


@pytest.fixture
def docker_gid() -> int:
    """The docker group's id, the group made where docker is not installed (its name
    is docker's own: it stays, as a docker package would leave it)."""
    subprocess.run(["groupadd", "-f", "docker"], check=True)
    return grp.getgrnam("docker").gr_gid


@needs_podman
def test_the_docker_group_cannot_reach_a_podman_container_by_its_id(
    daemon_factory: Any, public_dir: Path, root_container: Any, docker_gid: int
) -> None:
    docker = docker_gid
    daemon = daemon_factory(interval=0.5, socket_dir=public_dir)
    real = root_container(f"edgewatt-podman-{os.getpid()}")
    code = (
        "import json, sys; from edgewatt.core import transport;"
        "print(json.dumps(transport.call(sys.argv[1], 'POST', '/v1/targets',"
        " json.loads(sys.argv[2]))))"
    )
    body = f'{{"container": "x", "runtime": "docker", "container_id": "{real}"}}'
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", code, daemon.socket, body], capture_output=True, text=True,
        user=NOBODY, group=NOBODY, extra_groups=[docker], cwd="/", check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)},
    )  # fmt: skip
    status, answer = json.loads(done.stdout)
    assert status == 400 and answer["error"] == "no such cgroup", answer
    assert daemon.call("GET", "/v1/targets")[1]["targets"] == []


def test_docker_group_rights_hold_for_dockers_naming_only(
    cgroup_dir: Path, docker_gid: int
) -> None:
    from edgewatt.core.facts.cgroup_names import CgroupName, refusal

    cid = secrets.token_hex(32)
    name = CgroupName("container", "x", "docker", cid)
    podmans, dockers = cgroup_dir / f"libpod-{cid}", cgroup_dir / f"docker-{cid}.scope"
    podmans.mkdir()
    dockers.mkdir()
    gids = frozenset({docker_gid})
    assert refusal(name, Cgroup(v2_path(dockers), WHERE), NOBODY, gids) is None
    refused = refusal(name, Cgroup(v2_path(podmans), WHERE), NOBODY, gids)
    assert refused is not None and "belongs to uid 0" in refused
    assert refusal(name, Cgroup(v2_path(dockers), WHERE), NOBODY, frozenset()) is not None


# -- 7. one cgroup's churn never fails a pass for the others ---------------------------


def test_a_cgroup_made_again_and_gone_while_followed_waits_instead_of_raising(
    cgroup_dir: Path,
) -> None:
    path = v2_path(cgroup_dir)

    def churned() -> Cgroup:
        """Found, then removed before its first read: a user's rmdir/mkdir loop."""
        fresh = Cgroup(path, WHERE)
        cgroup_dir.rmdir()
        return fresh

    tree = CgroupTree(Cgroup(path, WHERE), 1, resolve=churned, restart_grace_s=60)
    before = tree.sample(lambda pid: [])
    cgroup_dir.rmdir()
    cgroup_dir.mkdir()
    waiting = tree.sample(lambda pid: [])  # raised CgroupGone out of the pass before
    assert waiting.pids == () and waiting.cpu_user_s == before.cpu_user_s


CHURN = """
import os, sys, time
path, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < until:
    try:
        os.rmdir(path)
        os.mkdir(path)
    except OSError:
        pass
"""


def test_one_users_churn_never_fails_a_pass_for_another_target(
    daemon_factory: Any, public_dir: Path, cgroup_dir: Path, spawn: Any
) -> None:
    daemon = daemon_factory(interval=0.05, socket_dir=public_dir)
    churned, _ = her_unit(daemon, public_dir, cgroup_dir, "churn")
    other = cgroup_dir / "other"
    other.mkdir()
    worker = spawn("import time\nwhile True: time.sleep(0.01)")
    (other / "cgroup.procs").write_text(str(worker.pid))
    status, mine = daemon.call("POST", "/v1/targets", {"cgroup": v2_path(other)})
    assert status == 201, mine
    subprocess.run([SYSTEM_PYTHON, "-c", CHURN, str(churned), "4"], user=NOBODY, group=NOBODY,
                   check=True, timeout=30)  # fmt: skip
    assert "sampling pass failed" not in daemon.log()
    assert summary(daemon, mine["id"])["state"] == "running"


# -- 8. a plain cgroup path ends with its cgroup ---------------------------------------


def test_a_plain_cgroup_path_made_again_is_not_followed(
    daemon_factory: Any, cgroup_dir: Path
) -> None:
    daemon = daemon_factory(interval=5.0)  # no scheduled pass between rmdir and mkdir
    made = cgroup_dir / "job"
    made.mkdir()
    status, target = daemon.call("POST", "/v1/targets", {"cgroup": v2_path(made)})
    assert status == 201, target
    made.rmdir()
    made.mkdir()  # another cgroup under the same path: not this target's
    ended = summary(daemon, target["id"])
    assert ended["state"] == "exited", ended
    assert ended["end_reason"] == f"its cgroup {v2_path(made)} was removed"
    assert "followed to" not in daemon.log()


# -- 9. templated units ----------------------------------------------------------------


def test_a_templated_unit_registers_and_path_tricks_stay_refused(
    daemon_factory: Any, cgroup_dir: Path, spawn: Any
) -> None:
    daemon = daemon_factory(interval=0.2)
    slice_ = cgroup_dir / "system-flower\\x2dsupernode.slice"  # as systemd escapes '-'
    unit = slice_ / f"flower-supernode@{os.getpid()}.service"
    unit.mkdir(parents=True)
    status, target = daemon.call("POST", "/v1/targets", {"unit": unit.name})
    assert status == 201, target
    assert target["cgroup"]["path"] == v2_path(unit)
    assert "\\x2d" in target["cgroup"]["path"]
    status, again = daemon.call("POST", "/v1/targets", {"cgroup": v2_path(unit)})
    assert status == 200 and again["id"] == target["id"], again  # the same cgroup
    # Its member's bytes are counted (the escaped path reaches the nftables rules).
    server = socket.create_server(("127.0.0.1", 0))
    received: list[int] = []

    def serve() -> None:
        conn, _ = server.accept()
        while chunk := conn.recv(65536):
            received.append(len(chunk))

    threading.Thread(target=serve, daemon=True).start()
    sender = spawn(
        "import socket, sys\nsys.stdin.readline()\n"
        f"s = socket.create_connection(('127.0.0.1', {server.getsockname()[1]}))\n"
        "s.sendall(b'x' * 300000)\ns.close()\nsys.stdin.readline()",
        stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    (unit / "cgroup.procs").write_text(str(sender.pid))
    wait_for(lambda: daemon.call("GET", f"/v1/targets/{target['id']}")[1]["latest"]["processes"])
    sender.stdin.write("go\n")
    sender.stdin.flush()
    wait_for(lambda: sum(received) == 300000)
    sent = wait_for(lambda: summary(daemon, target["id"])["network_transmit_bytes"] or 0)
    assert 300000 < sent < 300000 * 1.1, sent
    for body in (
        {"cgroup": v2_path(slice_) + "\\"},
        {"cgroup": v2_path(slice_) + "\\x2"},
        {"cgroup": v2_path(slice_) + '\\x2d"'},
        {"cgroup": v2_path(slice_) + "/../x"},
        {"cgroup": v2_path(slice_) + "\\n"},
        {"unit": "a\\nb.service"},
        {"unit": "a\\x2.service"},
        {"unit": "a\\X2D.service"},
        {"unit": "\\x2dx.service"},
    ):
        status, answer = daemon.call("POST", "/v1/targets", body)
        assert status == 400, (body, answer)
        assert answer["error"] in ("invalid cgroup", "invalid unit"), answer


# -- 11. `edgewatt run --cgroup` killed with SIGKILL -----------------------------------


def test_a_killed_run_leaves_no_cgroup_and_no_target(daemon_factory: Any) -> None:
    daemon = daemon_factory(interval=0.2)
    run = subprocess.Popen(
        [sys.executable, "-m", "edgewatt.cli", "run", "--cgroup", "--", "sleep", "600"],
        cwd=ROOT, env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    path = f"{cgroups.RUN_PARENT}/run-{run.pid}"

    def registered() -> dict[str, Any] | None:
        targets = daemon.call("GET", "/v1/targets")[1]["targets"]
        found = [t for t in targets if (t["cgroup"] or {}).get("path") == path]
        return found[0] if found and found[0]["latest"] else None

    target = wait_for(registered)
    directory = Path(f"{WHERE.v2}{path}")
    members = (directory / "cgroup.procs").read_text().split()
    assert len(members) == 1
    # Killed once the command runs (a run killed before it let its fork exec: below).
    wait_for(lambda: Path(f"/proc/{members[0]}/cmdline").read_bytes().startswith(b"sleep"))
    run.send_signal(signal.SIGKILL)
    run.wait()
    daemon.wait_passes(target["id"], 2)  # passes while the command still runs: it goes on
    assert summary(daemon, target["id"])["state"] == "running"
    os.kill(int(members[0]), signal.SIGKILL)  # the command ends too
    ended = wait_for(lambda: (s := summary(daemon, target["id"]))["state"] == "exited" and s)
    assert ended["end_reason"] == "its edgewatt run is gone and its cgroup is empty (removed)"
    assert not directory.exists()
    assert daemon.series("edgewatt_process_members", edgewatt_target_id=target["id"]) == []
    # Its slot is free: the target no longer counts against max_targets.
    assert [t["id"] for t in daemon.call("GET", "/v1/targets")[1]["targets"]
            if t["state"] == "running"] == []  # fmt: skip


HELD = """
import os, sys
from edgewatt.cli.run import _GO, _Held
held = _Held("/usr/bin/touch", ["touch", sys.argv[1]])
if sys.argv[2] == "released":  # as release() sends it; killed before it reads the report
    os.write(held._release, _GO)
print(held.pid, flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("when", ["held", "released"])
def test_a_run_killed_before_its_release_never_runs_the_command_and_after_it_does(
    tmp_path: Path, when: str
) -> None:
    # `edgewatt run` gone while its fork waits (registering it): the command was never
    # let run. Gone once it let it run, before it read the fork's peak: it runs on.
    touched = tmp_path / "touched"
    out = subprocess.run([sys.executable, "-c", HELD, str(touched), when], cwd=ROOT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    fork = int(out.stdout)

    def ended() -> bool:
        try:
            return procfs.parse_stat(Path(f"/proc/{fork}/stat").read_text()).state == "Z"
        except FileNotFoundError:
            return True

    wait_for(ended)
    assert touched.exists() == (when == "released")


# -- 3. name lookups are bounded per user ----------------------------------------------

FLOOD = """
import json, sys, threading, time
from edgewatt.core import transport
sock, seconds = sys.argv[1], float(sys.argv[2])
answers, lock = [], threading.Lock()

def flood(n):
    until, i = time.monotonic() + seconds, 0
    while time.monotonic() < until:
        i += 1
        body = {"container": f"nosuch-{n}-{i}", "runtime": "podman"}
        answer = transport.call(sock, "POST", "/v1/targets", body, timeout=30)
        with lock:
            answers.append(answer)

started = time.monotonic()
threads = [threading.Thread(target=flood, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"answers": answers, "elapsed": time.monotonic() - started}))
"""


@needs_podman
def test_one_users_failing_lookups_are_bounded_and_cost_no_one_else(
    daemon_factory: Any, public_dir: Path
) -> None:
    from edgewatt.core.lookups import LookupLimits

    limits = LookupLimits()
    daemon = daemon_factory(interval=0.5, socket_dir=public_dir)
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", FLOOD, daemon.socket, "3"], capture_output=True, text=True,
        user=NOBODY, group=NOBODY, cwd="/", check=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)},
    )  # fmt: skip
    flood = json.loads(done.stdout)
    answers = [tuple(a) for a in flood["answers"]]
    ran = [a for s, a in answers if s == 400 and a["detail"].startswith("podman inspect")]
    refused = [a for s, a in answers if s == 429]
    assert {s for s, _ in answers} == {400, 429}, answers
    assert all(a["error"] == "too many lookups" for a in refused)
    assert any("name lookups a second per user" in a["detail"] for a in refused)
    # Every podman inspect the daemon ran for her came out of her bucket.
    assert len(ran) <= limits.burst + limits.rate_per_s * flood["elapsed"] + 1, len(ran)
    # Another user, and root, still get their own lookups at once.
    status, other = call_as(4242, public_dir, daemon.socket, "POST", "/v1/targets",
                            {"container": "nosuch-other", "runtime": "podman"})  # fmt: skip
    assert status == 400 and other["detail"].startswith("podman inspect"), other
    status, roots = daemon.call("POST", "/v1/targets", {"container": "nosuch-root"})
    assert status == 400, roots


def test_lookup_bounds_per_user() -> None:
    from edgewatt.core.lookups import LookupLimits, LookupRefused, Lookups, RememberedFailure

    now = [100.0]
    lookups = Lookups(LookupLimits(rate_per_s=1.0, burst=2, failed_ttl_s=10.0), lambda: now[0])

    def fails() -> None:
        with lookups.bounded(NOBODY, "podman:x"):
            raise ValueError("podman inspect: no such container")

    with pytest.raises(ValueError, match="no such container"):
        fails()
    with pytest.raises(RememberedFailure, match=r"no such container \(failed within"):
        fails()  # answered from memory: no token taken
    running = lookups.bounded(NOBODY, "podman:y")
    running.__enter__()  # a lookup of hers in another connection
    with pytest.raises(LookupRefused, match="already running"), lookups.bounded(NOBODY, "z"):
        pass
    running.__exit__(None, None, None)
    with pytest.raises(LookupRefused, match=r"retry in 1\.0 s") as refused, lookups.bounded(
        NOBODY, "podman:z"
    ):
        pass
    assert refused.value.retry_s == pytest.approx(1.0)
    assert not lookups.follow(NOBODY)  # a follow takes from the same bucket
    with lookups.bounded(0, "podman:z"):  # root is not bounded
        pass
    now[0] += 1.0
    assert lookups.follow(NOBODY)
    now[0] += 10.0
    with pytest.raises(ValueError, match=r"no such container$"):
        fails()  # forgotten after failed_ttl_s: looked up again
