"""What one local user can make the daemon hold, and what she may read of others'
targets. Labels are counted against their person in bytes
(core/labels.py, access.label_room), so /metrics and every answer that lists them are
bounded; a scraper that does not read holds a bounded buffer (scrape_server.py); a
target's labels, PSS and disk bytes are its registrant's and root's to read
(exporter/read_rules.py). Real daemon, real sockets, real users (as test_hostile*.py).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.labels import MAX_PERSON_LABEL_BYTES, MAX_USERS_LABEL_BYTES, label_bytes
from edgewatt.core.targets import History, Identity, Target
from edgewatt.core.targets.access import hold, label_room
from edgewatt.core.targets.history import MAX_PERSON_PHASES
from edgewatt.core.uids import alone
from edgewatt.exporter import scrape_server
from edgewatt.exporter.scrape_server import Answer, Request, ScrapeServer
from tests.conftest import SYSTEM_PYTHON, call_as, wait_for
from tests.test_hostile import NOBODY, STRANGER, run_as
from tests.test_hostile_persons import ALICE_RANGE, subuid_file

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")

SLEEPER = "import time; time.sleep(120)"
# ~4 KiB of labels, every byte a '"' (escaped on /metrics, doubled: the worst case).
QUOTED = {f"q{i}": '"' * 1000 for i in range(4)}


def register_many(uid: int, public: Path, sock: str, count: int, labels: dict[str, str]) -> Any:
    """``count`` sleepers of ``uid``, each registered by ``uid`` with ``labels``: the
    statuses and answers, the sleepers left running until stdin closes."""
    code = f"""
import json, subprocess, sys
from edgewatt.core import transport
answers, children = [], []
for n in range({count}):
    child = subprocess.Popen(["sleep", "120"])
    children.append(child)
    answers.append(transport.call({sock!r}, "POST", "/v1/targets",
                                  {{"pid": child.pid, "labels": {labels!r}}}))
print(json.dumps(answers), flush=True)
sys.stdin.read()
for child in children:
    child.kill()
"""
    process = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", code], user=uid, group=uid, cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


# -- labels: a person's bytes, all users' ---------------------------------------------


@as_root
def test_a_persons_label_bytes_are_bounded_and_the_refusal_names_the_bound(
    daemon_factory: Any, public_dir: Path, tmp_path: Path
) -> None:
    env = subuid_file(tmp_path, "nobody:100000:65536\n")
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    fits = MAX_PERSON_LABEL_BYTES // label_bytes(QUOTED)  # 16
    first, answers = register_many(NOBODY, public_dir, daemon.socket, fits, QUOTED)
    second = None
    try:
        assert [status for status, _ in answers] == [201] * fits
        # Her next, from one of her subordinate uids: over her person's bytes.
        second, answers = register_many(ALICE_RANGE + 1, public_dir, daemon.socket, 1, QUOTED)
        status, body = answers[0]
        assert status == 429, body
        assert body["error"] == "too many label bytes"
        assert f"at most {MAX_PERSON_LABEL_BYTES} bytes of labels per user" in body["detail"]
        # Another user's are his own share.
        sleeper = run_as(STRANGER, SLEEPER)
        try:
            answer = call_as(STRANGER, public_dir, daemon.socket, "POST", "/v1/targets",
                             {"pid": sleeper.pid, "labels": QUOTED})  # fmt: skip
            assert answer[0] == 201, answer
        finally:
            sleeper.kill()
            sleeper.wait()
    finally:
        for process in (first, second):
            if process is not None:
                process.communicate("", timeout=20)


def test_labels_a_joining_registration_adds_count_against_the_registrant() -> None:
    def target(name: str, uid: int, labels: dict[str, str]) -> Target:
        return Target(Identity(name, 1, 1, 0.0, labels, False, uid, 0.0), History(1))

    mine = target("a", NOBODY, {f"l{i:02d}": "v" * 1000 for i in range(14)})  # 14,042 B
    table = [mine, target("b", STRANGER, {"x": "y" * 10_000})]
    room = label_room(table, NOBODY, alone)
    assert room is not None and room.left == MAX_PERSON_LABEL_BYTES - label_bytes(mine.labels)
    asked = {f"m{i}": "é" * 1000 for i in range(4)}  # 2,002 bytes each: one fits
    refused = hold(mine, NOBODY, asked, False, room)
    assert set(mine.labels) - {f"l{i:02d}" for i in range(14)} == {"m0"}
    assert label_bytes(mine.labels) <= MAX_PERSON_LABEL_BYTES
    assert [r["why"] for r in refused] == [room.bound] * 3
    assert label_room(table, 0, alone) is None  # root's: the administrator's


@as_root
def test_the_worst_metrics_answer_users_can_make_is_bounded(
    daemon_factory: Any, public_dir: Path
) -> None:
    """Users at every label bound (all users' bytes, each byte escaped to two): the
    answer stays under 2 x 26 series x MAX_USERS_LABEL_BYTES plus each series' own
    names, where one user's 100 fat targets made ~90 MB."""
    daemon = daemon_factory(socket_dir=public_dir, env={"EDGEWATT_MAX_TARGETS": "200"})
    uids = [NOBODY, STRANGER, 4343, 4344, 4345]  # five persons: four fill all users' share
    processes = []
    try:
        refused = []
        for uid in uids:
            process, answers = register_many(uid, public_dir, daemon.socket, 17, QUOTED)
            processes.append(process)
            refused += [body for status, body in answers if status != 201]
        assert all(b["error"] == "too many label bytes" for b in refused), refused
        users = f"at most {MAX_USERS_LABEL_BYTES} bytes of labels for all users together"
        assert any(users in b["detail"] for b in refused), refused
        registered = 17 * len(uids) - len(refused)
        assert registered * label_bytes(QUOTED) <= MAX_USERS_LABEL_BYTES
        wait_for(lambda: daemon.call("GET", "/healthz")[1]["targets"] == registered, 30)
        size = len(daemon.metrics_text().encode())
        # Each series: its labels escaped, and ~400 bytes of its own (names, pid, id).
        bound = 26 * (2 * MAX_USERS_LABEL_BYTES + 400 * registered) + (1 << 20)
        assert size < bound, (size, bound)
        assert size < 16 << 20  # the figure docs/reference.md states
    finally:
        for process in processes:
            process.communicate("", timeout=20)


# -- a scraper that does not read ----------------------------------------------------


def test_scrapers_that_never_read_hold_a_bounded_share_of_the_renders() -> None:
    """Each request gets a render of its own (a new pass each time, 4 MiB of text):
    16 scrapers that never read kept all 16 alive (64 MiB); now the renders older
    than the newest are held to MAX_HELD_BYTES, the oldest readers closed."""
    size = 4 << 20
    answered = threading.Semaphore(0)

    def respond(request: Request) -> Answer:
        answered.release()
        return Answer(200, "OK", os.urandom(16) + bytes(size))  # a new object each time

    tracemalloc.start()
    server = ScrapeServer("127.0.0.1", 0, respond)
    server.serve()
    clients = []
    try:
        for _ in range(16):
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", server.port))
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(client)
            assert answered.acquire(timeout=10)
        time.sleep(0.5)  # the last answer's first send
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.close()
        for client in clients:
            client.close()
    assert held < scrape_server.MAX_HELD_BYTES + 2 * size, held / 2**20


# -- read rules ----------------------------------------------------------------------


def reads(uid: int, public: Path, sock: str, target_id: str) -> dict[str, Any]:
    paths = {
        "list": "/v1/targets",
        "one": f"/v1/targets/{target_id}",
        "summary": f"/v1/targets/{target_id}/summary",
        "samples": f"/v1/targets/{target_id}/samples",
        "top": "/v1/top",
    }
    answers = {}
    for name, path in paths.items():
        if uid == 0:
            from edgewatt.core import transport

            status, body = transport.call(sock, "GET", path)
        else:
            status, body = call_as(uid, public, sock, "GET", path)
        assert status == 200, (name, body)
        if name in ("list", "top"):
            body = next(t for t in body["targets"] if t["id"] == target_id)
        answers[name] = body
    return answers


def owner_only(document: Any) -> list[Any]:
    """The owner-only figures' values anywhere in ``document``."""
    if isinstance(document, dict):
        document = {k: v for k, v in document.items() if k != "units"}  # their names
        found = [v for k, v in document.items() if "pss" in k or k.startswith("disk_")]
        return found + [x for v in document.values() for x in owner_only(v)]
    if isinstance(document, list):
        return [x for v in document for x in owner_only(v)]
    return []


@as_root
def test_another_user_reads_no_labels_pss_or_disk_bytes_the_owner_and_root_do(
    daemon_factory: Any, public_dir: Path, tmp_path: Path
) -> None:
    env = subuid_file(tmp_path, "nobody:100000:65536\n")
    daemon = daemon_factory(socket_dir=public_dir, env=env)
    process, answers = register_many(NOBODY, public_dir, daemon.socket, 1, {"secret": "s3"})
    try:
        status, body = answers[0]
        assert status == 201, body
        target_id = body["id"]
        wait_for(lambda: daemon.call("GET", f"/v1/targets/{target_id}")[1]["latest"], 10)
        for reader in (NOBODY, 0):  # the registrant and root: everything
            for name, document in reads(reader, public_dir, daemon.socket, target_id).items():
                assert "redacted" not in document, (reader, name)
                if name != "samples":
                    assert document["labels"] == {"secret": "s3"}, (reader, name)
            latest = daemon.call("GET", f"/v1/targets/{target_id}")[1]["latest"]
            assert latest["disk_read_bytes"] is not None
        # Another user, and the registrant's own subordinate uid (another user to the
        # kernel): what /proc shows anyone (name, CPU, RSS), no labels, PSS or disk bytes.
        for reader in (STRANGER, ALICE_RANGE + 1):
            for name, document in reads(reader, public_dir, daemon.socket, target_id).items():
                assert document["redacted"] == ["labels", "pss", "disk"], (reader, name)
                assert "labels" not in document, (reader, name)
                assert "s3" not in json.dumps(document), (reader, name)
                figures = owner_only(document)
                assert figures and all(v is None for v in figures), (reader, name, figures)
            one = reads(reader, public_dir, daemon.socket, target_id)["one"]
            assert one["executable"] == "sleep" and one["latest"]["memory_rss_bytes"]
        # `edgewatt status` and `top` as another user: the target, '-' where she may not read.
        for command in (["status"], ["top", "--once"]):
            shown = subprocess.run(
                [SYSTEM_PYTHON, "-c", "from edgewatt.cli.main import main; main()", *command,
                 "--socket", daemon.socket],
                capture_output=True, text=True, user=STRANGER, group=STRANGER, cwd="/",
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir), "COLUMNS": "200"},
                timeout=30,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            assert target_id in shown.stdout and "s3" not in shown.stdout, shown.stdout
    finally:
        process.communicate("", timeout=20)


# -- phases: the names and figures a person keeps ------------------------------------


@as_root
def test_a_persons_phases_are_bounded_her_oldest_forgotten(
    daemon_factory: Any, public_dir: Path
) -> None:
    """A phase kept costs ~1.1 KiB and ~850 bytes of every summary and /v1/top: her 3
    targets' 2,100 phases keep her newest MAX_PERSON_PHASES, the rest counted dropped
    (before: 1,000 a target, so 100 MiB and an 85 MB /v1/top for one user's 100)."""
    daemon = daemon_factory(socket_dir=public_dir)
    process, answers = register_many(NOBODY, public_dir, daemon.socket, 3, {"run": "p"})
    try:
        ids = [body["id"] for status, body in answers]
        code = f"""
from edgewatt.core import transport
for n in range(2100):
    path = "/v1/targets/" + {ids!r}[n % 3] + "/phase"
    status, body = transport.call({daemon.socket!r}, "POST", path, {{"name": f"p{{n}}"}})
    assert status == 201, body
"""
        subprocess.run(
            [SYSTEM_PYTHON, "-c", code], user=NOBODY, group=NOBODY, cwd="/", check=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)}, timeout=120,
        )  # fmt: skip
        summaries = [daemon.call("GET", f"/v1/targets/{i}/summary")[1] for i in ids]
        kept = sum(len(s["phases"]) for s in summaries)
        assert kept == MAX_PERSON_PHASES, kept
        assert sum(s["phases_dropped"] for s in summaries) == 2100 - kept
        newest = {p["name"] for s in summaries for p in s["phases"]}
        assert "p2099" in newest and "p0" not in newest
    finally:
        process.communicate("", timeout=20)


# A user's own process monitored in-process (no daemon): its labels are its own, with
# nobody's to share the daemon's per-person bound with.
IN_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from edgewatt import client
labels = {f"k{i}": "v" * 1000 for i in range(20)}  # ~20 KiB: over a person's daemon share
reg = client.register(labels=labels, socket=sys.argv[2])
print(json.dumps({"mode": reg.mode, "labels": len(reg.summary().get("labels") or {})}))
reg.close()
"""


def test_in_process_monitoring_holds_a_users_own_labels_whatever_the_daemons_share(
    public_dir: Path,
) -> None:
    proc = run_as(
        NOBODY, IN_PROCESS.replace("sys.argv[1]", repr(str(public_dir)))
        .replace("sys.argv[2]", repr(str(public_dir / "none.sock"))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"mode": "local", "labels": 20}, err
