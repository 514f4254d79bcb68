"""Registering a cgroup target through the real daemon's API: what a request may hold,
who may register which cgroup, and a registration that survives a daemon restart."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.exporter.registration import InvalidRegistration, parse_request, parse_saved
from tests.conftest import WITHOUT_SYS_ADMIN, call_as, wait_for
from tests.test_api import settled

NOBODY = 65534
WHERE = cgroups.mounts()
needs_v2 = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0, reason="needs root and a cgroup v2 mount"
)


@pytest.mark.parametrize(
    ("body", "error", "detail"),
    [
        ({"cgroup": "/a", "pid": 1}, "conflicting fields", "give one of pid, cgroup"),
        ({"unit": "x", "container": "y"}, "conflicting fields", "unit, container"),
        ({"cgroup": "/a", "runtime": "podman"}, "invalid runtime", "goes with container"),
        ({"cgroup": "/a", "children": False}, "invalid children", "counted whole"),
        ({"cgroup": "a/b"}, "invalid cgroup", "starts with '/'"),
        ({"unit": "-x"}, "invalid unit", "not a systemd unit name"),
        ({"container": "c", "runtime": "lxc"}, "invalid container", "podman, docker"),
        ({"container": "c", "runtim": "podman"}, "unknown field", "'runtim'"),
    ],
)
def test_a_bad_cgroup_request_is_refused_by_name(body: dict, error: str, detail: str) -> None:
    with pytest.raises(InvalidRegistration) as refused:
        parse_request(body, caller_pid=1, pid_max=4194304)
    assert refused.value.error == error
    assert detail in refused.value.detail


def test_a_saved_cgroup_registration_is_checked_like_a_new_one() -> None:
    entry = {"id": "a1", "pid": 0, "start_ticks": 5, "uid": 0, "registered_at": 1.0}
    saved = parse_saved({**entry, "cgroup": {"kind": "unit", "name": "x"}}, 4194304)
    assert saved.registration.cgroup is not None
    assert saved.registration.cgroup.name == "x.service"
    with pytest.raises(InvalidRegistration, match="unknown"):
        parse_saved({**entry, "cgroup": {"kind": "vm", "name": "x"}}, 4194304)


@needs_v2
def test_who_may_register_a_cgroup(daemon_factory: Any, public_dir: Path, cgroup_dir: Path) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    body = {"cgroup": f"/{cgroup_dir.name}"}
    status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
    assert status == 403 and answer["error"] == "not your cgroup"
    assert "belongs to uid 0: root or its owner may register it" in answer["detail"]
    os.chown(cgroup_dir, NOBODY, NOBODY)  # delegated to that user, as systemd does
    os.chown(cgroup_dir / "cgroup.procs", NOBODY, NOBODY)
    status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
    assert status == 201 and answer["kind"] == "cgroup", answer
    status, answer = daemon.call("POST", "/v1/targets", {"cgroup": "/no-such-cgroup"})
    assert status == 400 and answer["error"] == "no such cgroup"
    assert "no cgroup /no-such-cgroup" in answer["detail"]


@needs_v2
def test_a_cgroup_target_survives_a_restart_and_ends_with_its_cgroup(
    daemon_factory: Any, tmp_path: Path, cgroup_dir: Path
) -> None:
    state = tmp_path / "state"
    daemon = daemon_factory(interval=0.2, state_dir=state)
    body = {"cgroup": f"/{cgroup_dir.name}", "labels": {"task": "etl"}}
    status, target = daemon.call("POST", "/v1/targets", body)
    assert status == 201, target
    status, held = daemon.call("POST", "/v1/targets", body)  # a second holder
    assert status == 200 and held["id"] == target["id"]
    daemon.stop(signal.SIGKILL)  # what was persisted at each registration, no more
    again = daemon_factory(interval=0.2, state_dir=state)
    # Both holds came back: letting go of one keeps the target.
    assert again.call("DELETE", f"/v1/targets/{target['id']}")[0] == 200
    status, found = again.call("GET", f"/v1/targets/{target['id']}")
    assert status == 200, found
    assert found["cgroup"]["path"] == f"/{cgroup_dir.name}"
    assert found["labels"] == {"task": "etl"}
    cgroup_dir.rmdir()  # the service went: so does its target
    status, summary = again.call("GET", f"/v1/targets/{target['id']}/summary?fresh=1")
    assert status == 200 and summary["state"] == "exited"


SENDER = """
import socket, sys
sys.stdin.readline()  # registered
for _ in range(40):
    with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as s:
        s.sendall(b"x" * 20000)
print("done", flush=True)
sys.stdin.readline()
"""


@needs_v2
def test_a_namespace_the_daemon_may_not_enter_is_counted_by_its_interfaces(
    daemon_factory: Any, cgroup_dir: Path
) -> None:
    # As under the systemd unit: no CAP_SYS_ADMIN, so no setns into a container's own
    # network. Its member sends 40 connections of 20,000 bytes over a veth to a server
    # outside; the figure is the frames of the namespace's interfaces (IP bytes plus a
    # 14-byte link header each, ARP beside them), from when the target first saw it.
    name, subnet = f"ewt{os.getpid() % 100000}", f"10.231.{os.getpid() % 250}"
    run = lambda *args: subprocess.run(args, check=True, capture_output=True)  # noqa: E731
    run("ip", "netns", "add", name)
    try:
        run("ip", "link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}c")
        run("ip", "link", "set", f"{name}c", "netns", name)
        run("ip", "addr", "add", f"{subnet}.1/30", "dev", f"{name}h")
        run("ip", "link", "set", f"{name}h", "up")
        inside = ["ip", "netns", "exec", name]
        run(*inside, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        run(*inside, "ip", "addr", "add", f"{subnet}.2/30", "dev", f"{name}c")
        run(*inside, "ip", "link", "set", f"{name}c", "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        server = socket.create_server((f"{subnet}.1", 0))
        received = []

        def serve() -> None:
            for _ in range(40):
                conn, _ = server.accept()
                with conn:
                    while chunk := conn.recv(65536):
                        received.append(len(chunk))

        threading.Thread(target=serve, daemon=True).start()
        sender = subprocess.Popen(
            [*inside, sys.executable, "-c", SENDER, f"{subnet}.1", str(server.getsockname()[1])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        (cgroup_dir / "cgroup.procs").write_text(str(sender.pid))
        daemon = daemon_factory(interval=0.2, prefix=WITHOUT_SYS_ADMIN)
        assert daemon.call("GET", "/healthz")[1]["cgroup_other_namespaces"] is False
        status, target = daemon.call("POST", "/v1/targets", {"cgroup": f"/{cgroup_dir.name}"})
        assert status == 201, target
        wait_for(lambda: "cannot be entered" in daemon.log(), timeout=10)
        assert sender.stdin is not None and sender.stdout is not None
        sender.stdin.write("go\n")
        sender.stdin.flush()
        assert sender.stdout.readline() == "done\n"
        wait_for(lambda: sum(received) == 40 * 20000, timeout=10)
        daemon.wait_passes(target["id"])  # a pass after the last frame
        summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary?fresh=1")[1]
        info = daemon.call("GET", f"/v1/targets/{target['id']}")[1]["cgroup"]
        sent, packets = summary["network_transmit_bytes"], info["network_transmit_packets"]
        assert summary["network_counts"] == "interface-bytes", summary
        # Each packet: 14 bytes of link header, 20 of IP, 20 to 60 of TCP; plus an ARP
        # request or reply (42 bytes) or two.
        overhead = sent - 40 * 20000
        assert 54 * packets <= overhead <= 94 * packets + 200, (sent, packets)
        assert summary["network_receive_bytes"] > 40 * 3 * 54  # SYN-ACKs, ACKs, FINs
        sender.stdin.close()
        sender.wait(timeout=10)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{name}h"], capture_output=True)


@needs_v2
def test_a_member_of_a_cgroup_target_is_found_by_reading_that_target_alone(
    daemon_factory: Any, cgroup_dir: Path
) -> None:
    # `edgewatt run -- flower-supernode` in a cgroup of its own: each ClientApp the
    # SuperNode starts afterwards is in its cgroup (or one below it), which the member
    # lookup reads alone, whatever else is registered.
    daemon = daemon_factory(interval=60.0)  # no regular pass in between
    (cgroup_dir / "inner").mkdir()
    forking = (
        "import subprocess, sys\n"
        "sys.stdin.readline()\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(c.pid, flush=True); c.wait()"
    )
    supernode = subprocess.Popen(
        [sys.executable, "-c", forking], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    other = subprocess.Popen(sleep)
    started: list[int] = []
    try:
        (cgroup_dir / "cgroup.procs").write_text(str(supernode.pid))
        status, target = daemon.call("POST", "/v1/targets", {"cgroup": f"/{cgroup_dir.name}"})
        assert status == 201, target
        unrelated = daemon.register(other.pid)["id"]
        settled(daemon, target["id"])  # the registrations' rows follow their answers
        assert daemon.samples_taken(unrelated) == 1
        assert supernode.stdin is not None and supernode.stdout is not None
        supernode.stdin.write("fork\n")
        supernode.stdin.flush()
        started.append(int(supernode.stdout.readline()))  # in the cgroup, forked after
        below = subprocess.Popen(sleep)
        started.append(below.pid)
        (cgroup_dir / "inner" / "cgroup.procs").write_text(str(below.pid))  # one below it
        for pid in started:
            status, found = daemon.call("GET", f"/v1/targets?member={pid}")
            assert status == 200 and [t["id"] for t in found["targets"]] == [target["id"]]
        settled(daemon, target["id"])
        assert daemon.samples_taken(unrelated) == 1  # never read for them
        status, found = daemon.call("GET", f"/v1/targets?member={other.pid}")
        assert [t["id"] for t in found["targets"]] == [unrelated]
    finally:
        for pid in [supernode.pid, other.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in (supernode, other):
            process.wait()
