"""`edgewatt run` puts its command in a cgroup of its own without being asked, where the
machine allows it: every byte of a connection opened and closed between two
passes is counted; a process that registers itself inside joins that target; where no
cgroup can be had, one line says what the process target costs. The real daemon over
its socket, real cgroups and nftables, a normal user (``nobody``) with and without a
delegated cgroup. (With a systemd user manager: deploy/systemd/container-check.sh.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.report import ESCAPES
from edgewatt.cli.run_cgroup import COST
from edgewatt.core.facts import cgroups
from edgewatt.core.kernel import nftables
from edgewatt.core.targets.joining import within
from tests.conftest import (
    PRINT_TCP_SENT,
    ROOT,
    SYSTEM_PYTHON,
    DaemonProcess,
    assert_tcp_ip_bytes,
    tcp_sent,
    wait_for,
)
from tests.machine import WITHOUT_NET_ADMIN
from tests.test_cgroup_traffic import stop_server, tcp_server
from tests.test_hostile_cgroups import delegated

NOBODY = 65534
WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)
PAYLOAD = 6_000_000


def short_connection(port: int, python: str = sys.executable) -> list[str]:
    """A command that connects, sends PAYLOAD, closes, prints what the kernel sent on
    the connection (PRINT_TCP_SENT), and lives on a little: the connection is gone
    long before the daemon's next pass (its interval is 2 s)."""
    code = (
        f"import socket, time; s = socket.create_connection(('127.0.0.1', {port}))\n"
        f"s.sendall(b'x' * {PAYLOAD}); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
        f"{PRINT_TCP_SENT}"
        "s.close(); time.sleep(0.3)\n"
    )
    return [python, "-c", code]


def the_run_target(daemon: DaemonProcess) -> dict[str, Any]:
    (only,) = daemon.call("GET", "/v1/targets")[1]["targets"]
    status, summary = daemon.call("GET", f"/v1/targets/{only['id']}/summary")
    assert status == 200, summary
    return summary


def test_a_short_connection_is_counted_without_asking_for_a_cgroup(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(interval=2.0)
    port, counts, thread = tcp_server(replies=0)
    done = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket, "--",
         *short_connection(port)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == PAYLOAD
    made = re.search(r"\), cgroup (/edgewatt/run-\d+)$", done.stderr, re.M)
    assert made, done.stderr
    assert "a process target" not in done.stderr
    summary = the_run_target(daemon)
    assert summary["membership"] == "cgroup" and summary["network_counts"] == "ip-bytes"
    assert summary["cgroup"]["path"] == made[1]
    # What the kernel sent on it (resent segments included), plus each packet's headers.
    sent = tcp_sent(done.stdout, PAYLOAD)
    packets = summary["cgroup"]["network_transmit_packets"]
    assert_tcp_ip_bytes(summary["network_transmit_bytes"], sent, packets)
    assert not Path(f"{WHERE.v2}{made[1]}").exists()  # removed at the end


def test_a_run_inside_a_run_keeps_its_bytes_in_the_outer_runs_target(
    daemon_factory: Any,
) -> None:
    """The inner run's cgroup is made inside the outer's: both targets count the
    connection (before, root's inner cgroup was /edgewatt/run-PID beside the outer's,
    and the outer target lost what the inner command sent)."""
    daemon = daemon_factory(interval=2.0)
    port, counts, thread = tcp_server(replies=0)
    run = [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket]
    done = subprocess.run(
        [*run, "--label", "run=outer", "--", *run, "--label", "run=inner", "--",
         *short_connection(port)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == PAYLOAD
    sent = tcp_sent(done.stdout, PAYLOAD)
    listed = daemon.call("GET", "/v1/targets")[1]["targets"]
    paths = {}
    for target in listed:
        summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary")[1]
        paths[target["labels"]["run"]] = summary["cgroup"]["path"]
        packets = summary["cgroup"]["network_transmit_packets"]
        assert_tcp_ip_bytes(summary["network_transmit_bytes"], sent, packets)
    assert sorted(paths) == ["inner", "outer"]
    assert re.fullmatch(r"/edgewatt/run-\d+", paths["outer"]), paths
    assert re.fullmatch(re.escape(paths["outer"]) + r"/run-\d+", paths["inner"]), paths


REGISTERS = (
    "import json; from edgewatt import client\n"
    "r = client.register(labels={'step': 'train'})\n"
    "print(json.dumps({'id': r.id, 'mode': r.mode}), flush=True)\n"
    "r.close()\n"
)


def test_a_process_registering_inside_the_runs_cgroup_joins_its_target(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(interval=0.5)
    done = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket,
         "--label", "run=joined", "--", sys.executable, "-c", REGISTERS],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    registered = json.loads(done.stdout)
    assert registered["mode"] == "daemon"
    listed = daemon.call("GET", "/v1/targets")[1]["targets"]
    assert [t["id"] for t in listed] == [registered["id"]]  # one target, not two
    (only,) = listed
    assert only["labels"] == {"run": "joined", "step": "train"}
    assert the_run_target(daemon)["membership"] == "cgroup"


def test_only_the_registrant_of_a_cgroup_target_joins_it(
    daemon_factory: Any, cgroup_dir: Path, public_dir: Path
) -> None:
    """A user's process inside root's cgroup target gets a target of its own (joining is
    acting on the target: its registrant's or root's); one asking for itself alone
    (children false) too; root's process joins."""
    daemon = daemon_factory(interval=0.5, socket_dir=public_dir)
    status, target = daemon.call("POST", "/v1/targets", {"cgroup": f"/{cgroup_dir.name}"})
    assert status == 201, target
    call = (
        "import json, sys; from edgewatt.core import transport\n"
        f"print(json.dumps(transport.call({daemon.socket!r}, 'POST', '/v1/targets', "
        "json.loads(sys.argv[1]))))\n"
    )

    def inside(body: dict[str, Any], *become: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(
            ["sh", "-c", f'echo $$ > {cgroup_dir}/cgroup.procs && exec "$@"', "sh",
             *become, SYSTEM_PYTHON, "-c", call, json.dumps(body)],
            capture_output=True, text=True, cwd="/", timeout=30,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        status, answer = json.loads(done.stdout)
        return status, answer

    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    status, hers = inside({}, *nobody)
    assert status == 201 and hers["id"] != target["id"] and hers["pid"] > 0, hers
    status, alone = inside({"children": False})
    assert status == 201 and alone["id"] != target["id"], alone
    status, joined = inside({"labels": {"by": "root"}})
    assert (status, joined["id"], joined["pid"]) == (200, target["id"], 0), joined


def test_a_cgroup_holds_its_own_path_and_those_below_it_only() -> None:
    assert within("/edgewatt/run-1", "/edgewatt/run-1")
    assert within("/edgewatt/run-1/run-7", "/edgewatt/run-1")
    assert not within("/edgewatt/run-12", "/edgewatt/run-1")  # a sibling sharing a prefix
    assert not within("/edgewatt", "/edgewatt/run-1")
    assert within("/anything", "/")


def as_nobody(*argv: str, cwd: str = "/", public: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, timeout=60, user=NOBODY, group=NOBODY,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public)},
    )  # fmt: skip


def test_without_delegation_one_line_says_what_the_process_target_costs(
    daemon_factory: Any, public_dir: Path
) -> None:
    """nobody's cgroup is root's, and no systemd user manager answers for her here."""
    daemon = daemon_factory(interval=2.0, socket_dir=public_dir)
    run = [SYSTEM_PYTHON, "-m", "edgewatt.cli", "run", "--socket", daemon.socket]
    port, counts, thread = tcp_server(replies=0)
    done = as_nobody(*run, "--", *short_connection(port, SYSTEM_PYTHON), public=public_dir)
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == PAYLOAD
    said = [line for line in done.stderr.splitlines() if "not a cgroup of its own" in line]
    own = cgroups.cgroup_of(os.getpid())  # hers too: a child's, before it moves anywhere
    assert said == [
        "edgewatt run: a process target, not a cgroup of its own (your cgroup "
        f"{own} is not delegated to you (owned by uid 0), and no "
        f"systemd user manager answers to delegate one): {COST}; --no-cgroup says you know"
    ], done.stderr
    assert re.search(rf"network +sent .*; {ESCAPES}\)$", done.stderr, re.M), done.stderr
    summary = the_run_target(daemon)
    assert summary["membership"] != "cgroup" and summary["network_counts"] == "tcp-payload"

    doctor = as_nobody(SYSTEM_PYTHON, "-m", "edgewatt.cli", "doctor", "--socket", daemon.socket,
                       public=public_dir)  # fmt: skip
    line = next(x for x in doctor.stdout.splitlines() if "edgewatt run makes" in x)
    assert line == (
        f"warn  edgewatt run makes process targets here (your cgroup {own} is not delegated "
        f"to you and no systemd user manager answers): {COST}; run it as root, or with a "
        "systemd user manager (loginctl enable-linger USER)"
    ), doctor.stdout

    # Asked for no cgroup: no line about it; the table still says what escapes.
    quiet = as_nobody(*run, "--no-cgroup", "--", "true", public=public_dir)
    assert quiet.returncode == 0, quiet.stderr
    assert "cgroup of its own" not in quiet.stderr and ESCAPES in quiet.stderr

    # Insisting: the command is not run.
    writable = public_dir / "hers"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    marker = writable / "ran"
    insisted = as_nobody(*run, "--cgroup", "--", "touch", str(marker), public=public_dir)
    assert insisted.returncode == 2, insisted.stderr
    assert insisted.stderr.startswith("edgewatt run: --cgroup: no cgroup of its own: ")
    refused = "the command was not run (without --cgroup it runs as a process target)"
    assert insisted.stderr.rstrip().endswith(refused), insisted.stderr
    assert not marker.exists()


def test_where_the_daemon_cannot_count_a_cgroups_traffic_the_run_stays_a_process_target(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """Without CAP_NET_ADMIN the daemon has no nftables counters: a cgroup target would
    have no network figure at all, a process target has its TCP bytes. Without a daemon
    the run samples its process tree itself: no cgroup, no line about one."""
    daemon = daemon_factory(interval=0.5, prefix=WITHOUT_NET_ADMIN)
    problem = daemon.call("GET", "/healthz")[1]["cgroup_traffic"]
    assert problem
    run = [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket]
    done = subprocess.run([*run, "--", "true"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "not a cgroup of its own" in line]
    assert said == [
        "edgewatt run: a process target, not a cgroup of its own (the daemon cannot count "
        f"a cgroup's traffic: {problem}): {COST}; --no-cgroup says you know"
    ], done.stderr
    assert "monitored via daemon)" in done.stderr and "), cgroup " not in done.stderr
    summary = the_run_target(daemon)
    assert "cgroup" not in summary and summary["network_counts"] == "tcp-payload"
    doctor = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    line = next(x for x in doctor.stdout.splitlines() if "edgewatt run makes" in x)
    assert line.startswith("warn  edgewatt run makes process targets here (the daemon cannot "
                           "count a cgroup's traffic"), doctor.stdout  # fmt: skip

    alone = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", str(tmp_path / "none.sock"),
         "--", "true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert "monitored via local)" in alone.stderr, alone.stderr
    assert "cgroup" not in alone.stderr


def test_a_user_in_a_delegated_cgroup_gets_every_short_connection_counted(
    daemon_factory: Any, cgroup_dir: Path, public_dir: Path
) -> None:
    """As under her systemd manager's scope (systemd-run --user --scope): the run makes
    its cgroup in hers, and the root daemon takes it as her target."""
    daemon = daemon_factory(interval=2.0, socket_dir=public_dir)
    home = delegated(cgroup_dir, NOBODY)
    port, counts, thread = tcp_server(replies=0)
    done = subprocess.run(
        ["sh", "-c", f'echo $$ > {home}/cgroup.procs && exec "$@"', "sh",
         "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         SYSTEM_PYTHON, "-m", "edgewatt.cli", "run", "--socket", daemon.socket, "--",
         *short_connection(port, SYSTEM_PYTHON)],
        capture_output=True, text=True, cwd="/", timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)},
    )  # fmt: skip
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == PAYLOAD
    made = f"/{cgroup_dir.name}/user/run-"
    assert f"), cgroup {made}" in done.stderr, done.stderr
    summary = the_run_target(daemon)
    assert summary["membership"] == "cgroup" and summary["cgroup"]["path"].startswith(made)
    sent = tcp_sent(done.stdout, PAYLOAD)
    packets = summary["cgroup"]["network_transmit_packets"]
    assert_tcp_ip_bytes(summary["network_transmit_bytes"], sent, packets)


@pytest.mark.parametrize(
    ("command", "code", "status", "shown"),
    [
        # Its own child exits 7 first, and an orphan outlives it: the root's 3 is the run's.
        (["sh", "-c", "sh -c 'exit 7'; sleep 0.5 & exit 3"], 3, 3, ["3"]),
        (["sh", "-c", "kill -KILL $$"], 128 + 9, -9, ["signal", "9"]),
    ],
    ids=["exit-3", "signal-9"],
)
def test_a_runs_cgroup_target_has_its_commands_exit_status(
    daemon_factory: Any, command: list[str], code: int, status: int, shown: list[str]
) -> None:
    """The root of `edgewatt run`'s cgroup is its command: the kernel's exit record of
    that process gives the target's exit status, in the summary and `edgewatt status`."""
    daemon = daemon_factory()
    edgewatt = [sys.executable, "-m", "edgewatt.cli"]
    done = subprocess.run(
        [*edgewatt, "run", "--socket", daemon.socket, "--", *command],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert re.search(r"\), cgroup /edgewatt/run-\d+$", done.stderr, re.M), done.stderr
    summary = the_run_target(daemon)
    assert (summary["membership"], summary["state"]) == ("cgroup", "exited")
    assert summary["exit_status"] == status
    listed = subprocess.run(
        [*edgewatt, "status", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    row = next(
        line.split() for line in listed.stdout.splitlines() if line.startswith(summary["id"])
    )
    after = row.index("UTC") + 1  # its name, the command line, takes words of its own
    assert row[after : after + 1 + len(shown)] == ["exited", *shown], listed.stdout


def test_a_cgroup_without_a_held_root_has_no_exit_status(
    daemon_factory: Any, spawn: Any, cgroup_dir: Path
) -> None:
    """A cgroup registered by its path whose one process was not a fork held before its
    exec (a service's, a container's): it has no root of the target's own, so none."""
    daemon = daemon_factory()
    member = spawn(
        "import sys, time; sys.stdin.read(1); raise SystemExit(3)", stdin=subprocess.PIPE
    )
    (cgroup_dir / "cgroup.procs").write_text(str(member.pid))
    path = "/" + str(cgroup_dir.relative_to(WHERE.v2 or "/"))
    status, target = daemon.call("POST", "/v1/targets", {"cgroup": path})
    assert status in (200, 201), target
    summary_path = f"/v1/targets/{target['id']}/summary"
    wait_for(lambda: daemon.call("GET", summary_path)[1]["samples"] >= 2)  # read while it runs
    member.communicate(b"x", timeout=30)
    assert member.returncode == 3
    cgroup_dir.rmdir()  # the target ends with its cgroup
    wait_for(lambda: daemon.call("GET", f"/v1/targets/{target['id']}")[1]["state"] == "exited")
    summary = daemon.call("GET", summary_path)[1]
    assert summary["membership"] == "cgroup" and summary["exit_status"] is None
