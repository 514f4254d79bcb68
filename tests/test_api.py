"""The registration API against the real daemon over its real socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import procfs
from tests.conftest import ROOT, DaemonProcess, call_as, post, raw

NOBODY = 65534


def unused_pid() -> int:
    for pid in range(30000, 2, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no free pid")


MALFORMED = [
    ("bad json", post("/v1/targets", b"{not json"), 400, "invalid JSON"),
    ("array body", post("/v1/targets", b"[1, 2]"), 400, "invalid body"),
    ("pid string", post("/v1/targets", b'{"pid": "12"}'), 400, "invalid pid"),
    ("pid bool", post("/v1/targets", b'{"pid": true}'), 400, "invalid pid"),
    ("pid zero", post("/v1/targets", b'{"pid": 0}'), 400, "invalid pid"),
    ("pid negative", post("/v1/targets", b'{"pid": -5}'), 400, "invalid pid"),
    ("pid huge", post("/v1/targets", b'{"pid": 1099511627776}'), 400, "invalid pid"),
    ("pid float", post("/v1/targets", b'{"pid": 1.5}'), 400, "invalid pid"),
    ("children not bool", post("/v1/targets", b'{"children": "yes"}'), 400, "invalid children"),
    ("unknown field", post("/v1/targets", b'{"pidd": 1}'), 400, "unknown field"),
    ("label job", post("/v1/targets", b'{"labels": {"job": "x"}}'), 400, "invalid labels"),
    (
        "label instance",
        post("/v1/targets", b'{"labels": {"instance": "x"}}'),
        400,
        "invalid labels",
    ),
    (
        "label __name__",
        post("/v1/targets", b'{"labels": {"__name__": "x"}}'),
        400,
        "invalid labels",
    ),
    ("label dash", post("/v1/targets", b'{"labels": {"bad-name": "x"}}'), 400, "invalid labels"),
    ("label digit", post("/v1/targets", b'{"labels": {"1x": "x"}}'), 400, "invalid labels"),
    (
        "label own attr",
        post("/v1/targets", b'{"labels": {"process.pid": "1"}}'),
        400,
        "invalid labels",
    ),
    ("label int value", post("/v1/targets", b'{"labels": {"run": 1}}'), 400, "invalid labels"),
    ("labels list", post("/v1/targets", b'{"labels": ["a"]}'), 400, "invalid labels"),
    (
        "65 labels",
        post("/v1/targets", json.dumps({"labels": {f"l{i}": "v" for i in range(65)}}).encode()),
        400,
        "invalid labels",
    ),
    (
        "label value over 1 KiB",
        post("/v1/targets", json.dumps({"labels": {"run": "x" * 1025}}).encode()),
        400,
        "invalid labels",
    ),
    (
        "body over 64 KiB",
        post("/v1/targets", b'{"labels": {"a": "' + b"x" * 70000 + b'"}}'),
        413,
        "body too large",
    ),
    ("unknown path", b"GET /v2/things HTTP/1.1\r\n\r\n", 404, "not found"),
    ("unknown subpath", b"GET /v1/targets/abc/energy HTTP/1.1\r\n\r\n", 404, "not found"),
    ("unknown target", b"GET /v1/targets/abcdef012345 HTTP/1.1\r\n\r\n", 404, "no such target"),
    ("bad target id", b"GET /v1/targets/a.b HTTP/1.1\r\n\r\n", 404, "no such target"),
    ("wrong method", b"PUT /v1/targets HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "method"),
    ("invented method", b"BREW /v1/targets HTTP/1.1\r\n\r\n", 405, "method not allowed"),
    ("dot dot", b"GET /v1/targets/../healthz HTTP/1.1\r\n\r\n", 400, "invalid path"),
    ("double slash", b"GET /v1//targets HTTP/1.1\r\n\r\n", 400, "invalid path"),
    ("encoded dots", b"GET /v1/targets/%2e%2e/healthz HTTP/1.1\r\n\r\n", 400, "invalid path"),
    ("garbage line", b"GARBAGE\r\n\r\n", 400, "bad request"),
    ("chunked", post("/v1/targets", b"", "Transfer-Encoding: chunked\r\n"), 400, "chunked"),
    (
        "bad length",
        b"POST /v1/targets HTTP/1.1\r\nContent-Length: ab\r\n\r\n",
        400,
        "Content-Length",
    ),
    ("since not a number", b"GET /v1/targets/abc/samples?since=x HTTP/1.1\r\n\r\n", 400, "since"),
]


@pytest.mark.parametrize(
    ("request_bytes", "status", "error"),
    [pytest.param(r, s, e, id=name) for name, r, s, e in MALFORMED],
)
def test_malformed_requests_get_json_4xx(
    daemon: DaemonProcess, request_bytes: bytes, status: int, error: str
) -> None:
    got_status, body = raw(daemon.socket, request_bytes)
    assert got_status == status, body
    assert error.lower() in body["error"].lower() + " " + body["detail"].lower()
    assert "Traceback" not in json.dumps(body)
    assert daemon.call("GET", "/healthz")[0] == 200  # the daemon keeps serving


def test_unknown_pid_is_named(daemon: DaemonProcess) -> None:
    pid = unused_pid()
    status, body = daemon.call("POST", "/v1/targets", {"pid": pid})
    assert status == 400
    assert body == {"error": "no such process", "detail": f"pid {pid} does not exist"}


def test_registration_defaults_to_the_caller(daemon: DaemonProcess, spawn: Any) -> None:
    code = (
        "import json, sys; from edgewatt.core import transport;"
        f"print(json.dumps(transport.call({daemon.socket!r}, 'POST', '/v1/targets', {{}})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    status, body = json.loads(out.stdout)
    assert status == 201
    # The caller has exited by now; its pid was taken from SO_PEERCRED, not the body.
    assert body["pid"] > 0
    assert set(body) == {
        "id", "kind", "pid", "cgroup", "start_time", "labels", "children", "min_interval_s",
        "conflicts",
    }  # fmt: skip


def test_same_process_twice_same_id(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    first = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": {"run": "a"}})
    second = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": {"run": "a"}})
    assert first[0] == 201 and second[0] == 200
    assert first[1]["id"] == second[1]["id"]
    # Two registrations hold it (`edgewatt run` and the script itself): the first to
    # unregister leaves it to the other, the second ends it (kept to read: other labels
    # joining, and what is kept: tests/test_one_target.py).
    tid = first[1]["id"]
    assert daemon.call("DELETE", f"/v1/targets/{tid}")[0] == 200
    assert daemon.call("GET", f"/v1/targets/{tid}")[1]["state"] == "running"
    assert daemon.call("DELETE", f"/v1/targets/{tid}")[0] == 200
    assert daemon.call("GET", f"/v1/targets/{tid}")[1]["state"] == "unregistered"


def test_list_get_delete_summary_samples_phase(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    target = daemon.register(child.pid, labels={"run": "r1"})
    tid = target["id"]
    daemon.wait_passes(tid, 3)
    assert daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "epoch-1"})[0] == 201
    daemon.wait_passes(tid, 3)
    status, listing = daemon.call("GET", "/v1/targets")
    assert status == 200 and [t["id"] for t in listing["targets"]] == [tid]
    status, one = daemon.call("GET", f"/v1/targets/{tid}")
    assert one["labels"] == {"run": "r1"} and one["state"] == "running"
    assert one["latest"]["memory_rss_bytes"] > 0
    status, samples = daemon.call("GET", f"/v1/targets/{tid}/samples")
    assert status == 200 and len(samples["samples"]) >= 4
    assert samples["units"]["memory_rss_bytes"] == "bytes"
    times = [s["time"] for s in samples["samples"]]
    assert times == sorted(times)
    since = daemon.call("GET", f"/v1/targets/{tid}/samples?since={times[1]}")[1]["samples"]
    assert [s["time"] for s in since] == times[2 : 2 + len(since)]
    status, summary = daemon.call("GET", f"/v1/targets/{tid}/summary")
    assert status == 200 and summary["samples"] >= 4
    assert [p["name"] for p in summary["phases"]] == ["epoch-1"]
    assert summary["phases"][0]["duration_s"] > 0
    assert summary["memory_rss_peak_bytes"] >= summary["memory_rss_avg_bytes"] > 0
    assert daemon.call("DELETE", f"/v1/targets/{tid}")[0] == 200
    status, ended = daemon.call("GET", f"/v1/targets/{tid}")
    assert status == 200 and ended["state"] == "unregistered"  # kept for exited_retention
    assert daemon.call("GET", "/v1/targets?member=" + str(child.pid))[1]["targets"] == []


def settled(daemon: DaemonProcess, target_id: str) -> None:
    """Until every pass begun has ended (an edge's rest follows its answer): a pass of
    ``target_id`` alone runs after them."""
    assert daemon.call("GET", f"/v1/targets/{target_id}/summary?fresh=1")[0] == 200


def test_a_member_is_found_by_reading_only_the_targets_that_may_hold_it(
    daemon_factory: Any, spawn: Any
) -> None:
    # A Flower ClientApp's first call a round: its SuperNode's target is read (it is
    # one of the process's ancestors), not every target. One forked and re-parented
    # since the last pass (its parent gone) has no registered ancestor: a pass of
    # every target looks for it, as the table's membership can learn it.
    daemon = daemon_factory(interval=60.0)  # no regular pass in between
    parent = spawn(
        "import os, subprocess, sys, time\n"
        "for line in sys.stdin:\n"
        "    if line == 'fork\\n':\n"
        "        c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "        print(c.pid, flush=True)\n"
        "    else:\n"
        "        r, w = os.pipe()\n"
        "        if os.fork() == 0:\n"
        "            if os.fork() == 0:\n"
        "                os.write(w, str(os.getpid()).encode()); time.sleep(60)\n"
        "            os._exit(0)\n"
        "        os.wait()\n"
        "        print(os.read(r, 20).decode(), flush=True)\n",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    other = spawn("import time; time.sleep(60)")
    holder = daemon.register(parent.pid)["id"]
    unrelated = daemon.register(other.pid)["id"]
    # Each registration's row is written just after its answer (reference.md).
    settled(daemon, holder)
    taken = {unrelated: daemon.samples_taken(unrelated)}

    def member(command: str) -> tuple[int, list[str]]:
        parent.stdin.write(command)  # type: ignore[union-attr]
        parent.stdin.flush()  # type: ignore[union-attr]
        pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        status, found = daemon.call("GET", f"/v1/targets?member={pid}")
        assert status == 200, found
        return pid, [t["id"] for t in found["targets"]]

    child, found = member("fork\n")
    assert found == [holder]
    settled(daemon, holder)
    assert daemon.samples_taken(unrelated) == taken[unrelated]  # not read
    orphan, found = member("double fork\n")
    assert parent.pid not in procfs.ancestors(orphan)  # re-parented
    lineage = daemon.call("GET", "/healthz")[1]["membership"] == "lineage"
    # The kernel's fork events tell it; parent links alone cannot (membership.py).
    assert found == ([holder] if lineage else [])
    settled(daemon, holder)
    assert daemon.samples_taken(unrelated) == taken[unrelated] + 1  # every target read
    if lineage:  # a member now, as the holder's last reading says: read alone again
        again = daemon.call("GET", f"/v1/targets?member={orphan}")[1]["targets"]
        assert [t["id"] for t in again] == [holder]
        settled(daemon, holder)
        assert daemon.samples_taken(unrelated) == taken[unrelated] + 1
    for pid in (child, orphan):  # neither is spawn's to kill
        os.kill(pid, signal.SIGKILL)
    assert daemon.call("GET", "/v1/targets?member=1")[1]["targets"] == []
    for bad in ("abc", "-1", "1&member=2", "12345678901"):
        status, body = daemon.call("GET", f"/v1/targets?member={bad}")
        assert status == 400 and body["error"] == "invalid member", (bad, body)


def test_a_phase_starts_on_the_widest_target_holding_a_process(
    daemon_factory: Any, spawn: Any
) -> None:
    # A Flower ClientApp's round start: POST /v1/members/PID/phase finds the target
    # holding it (the SuperNode's, not the ClientApp's own) and starts the phase there,
    # reading that target alone.
    daemon = daemon_factory(interval=60.0)
    parent = spawn(
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(c.pid, flush=True); c.wait()",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    other = spawn("import time; time.sleep(60)")
    try:
        supernode = daemon.register(parent.pid)["id"]
        own = daemon.register(child, children=False)["id"]
        unrelated = daemon.register(other.pid)["id"]
        settled(daemon, supernode)
        assert daemon.samples_taken(unrelated) == 1
        assert daemon.call("POST", f"/v1/targets/{supernode}/phase", {"name": "epoch"})[0] == 201
        body = {"name": "round-1/train", "inside": True}
        status, started = daemon.call("POST", f"/v1/members/{child}/phase", body)
        assert status == 201, started
        assert started["target"] == supernode and started["pid"] == parent.pid
        assert (started["name"], started["depth"]) == ("round-1/train", 1)  # inside the epoch
        phases = daemon.call("GET", f"/v1/targets/{supernode}/summary")[1]["phases"]
        assert [(p["name"], p["ended_at"]) for p in phases] == [
            ("epoch", None), ("round-1/train", None)
        ]  # fmt: skip
        assert daemon.call("GET", f"/v1/targets/{own}/summary")[1]["phases"] == []
        settled(daemon, supernode)
        assert daemon.samples_taken(unrelated) == 1  # not read
        status, alone = daemon.call("POST", f"/v1/members/{other.pid}/phase", {"name": "x"})
        assert (status, alone["target"], alone["pid"]) == (201, unrelated, other.pid)
        status, refused = daemon.call("POST", "/v1/members/1/phase", {"name": "x"})
        assert (status, refused["error"]) == (404, "not held")
        status, refused = daemon.call("POST", "/v1/members/x1/phase", {"name": "x"})
        assert (status, refused["error"]) == (400, "invalid member")
    finally:
        os.kill(child, signal.SIGKILL)


def test_stalled_client_does_not_block_others(daemon: DaemonProcess, spawn: Any) -> None:
    stalled = []
    for _ in range(8):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(daemon.socket)
        s.sendall(b"POST /v1/targets HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        stalled.append(s)
    try:
        child = spawn("import time; time.sleep(60)")
        started = time.monotonic()
        status, body = daemon.call("POST", "/v1/targets", {"pid": child.pid}, timeout=2)
        assert status == 201, body
        assert time.monotonic() - started < 1.0
    finally:
        for s in stalled:
            s.close()


def test_stalled_client_is_cut_off_with_a_timeout(daemon: DaemonProcess) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(daemon.socket)
        s.sendall(b"POST /v1/targets HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        s.settimeout(15)
        started = time.monotonic()
        leftover = s.recv(4096)
        waited = time.monotonic() - started
        while chunk := s.recv(4096):  # the body may come in a second read; then EOF
            leftover += chunk
    # The daemon gives up after its request timeout (5 s), answers 408 and closes.
    assert 4 < waited < 10
    assert leftover.startswith(b"HTTP/1.1 408")
    assert b'"error": "request timed out"' in leftover


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_ownership_enforced_with_peer_credentials(
    daemon_factory: Any, spawn: Any, public_dir: Path
) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    roots = spawn("import time; time.sleep(60)")
    status, body = call_as(
        NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", {"pid": roots.pid}
    )
    assert status == 403 and body["error"] == "not your process"
    assert body["detail"] == f"pid {roots.pid} belongs to uid 0, you are uid {NOBODY}"

    own = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY)
    try:
        status, body = call_as(
            NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", {"pid": own.pid}
        )
        assert status == 201 and body["pid"] == own.pid
    finally:
        own.kill()
        own.wait()

    root_target = daemon.register(roots.pid)
    tid = root_target["id"]
    status, body = call_as(NOBODY, public_dir, daemon.socket, "DELETE", f"/v1/targets/{tid}")
    assert status == 403 and body["error"] == "not your target"
    status, body = call_as(
        NOBODY, public_dir, daemon.socket, "POST", f"/v1/targets/{tid}/phase", {"name": "x"}
    )
    assert status == 403
    # Root may manage anyone's target.
    assert daemon.call("DELETE", f"/v1/targets/{tid}")[0] == 200


def test_socket_is_world_writable(daemon: DaemonProcess) -> None:
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o666


def test_concurrent_registrations(daemon: DaemonProcess, spawn: Any) -> None:
    children = [spawn("import time; time.sleep(60)") for _ in range(20)]
    results: list[tuple[int, Any]] = []

    def register(pid: int) -> None:
        results.append(daemon.call("POST", "/v1/targets", {"pid": pid}))

    threads = [threading.Thread(target=register, args=(c.pid,)) for c in children]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s for s, _ in results) == [201] * 20
    assert len({b["id"] for _, b in results}) == 20
