"""A cgroup's traffic from real nftables counters (facts/cgroup_traffic.py): short
connections and UDP counted, loopback between members not, and no rule or table
left behind (at forget, at close, and after a kill -9 at the next start)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.core.facts.cgroup_traffic import CgroupTraffic, Counts
from edgewatt.core.kernel import nftables
from edgewatt.core.kernel.nftables import Nft
from tests.conftest import assert_tcp_ip_bytes

WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)
UDP_HEADERS = 20 + 8  # IPv4 and UDP, once per datagram


def tables() -> list[str]:
    answer = Nft().run("list tables") or {}
    return [
        f"{t['table']['family']} {t['table']['name']}" for t in answer["nftables"] if "table" in t
    ]


def member(cgroup: Path, code: str, stdout: int | None = None) -> subprocess.Popen:
    """A Python process inside ``cgroup`` from its first instruction, that runs
    ``code`` once a line arrives on its stdin (so the rules are in place first);
    ``stdout``: as Popen's (subprocess.PIPE: communicate() returns what it printed)."""

    def join() -> None:
        with open(cgroup / "cgroup.procs", "w") as f:
            f.write("0")

    return subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdin.readline()\n{code}"],
        stdin=subprocess.PIPE,
        stdout=stdout,
        preexec_fn=join,
    )


def tcp_server(replies: int) -> tuple[int, dict[str, int], threading.Thread]:
    """A server outside the cgroup: per connection it reads until EOF, answers
    ``replies`` bytes; ``counts`` holds the payload it received and sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    counts = {"received": 0, "sent": 0, "connections": 0}

    def serve() -> None:
        with listener:
            while True:
                conn, _ = listener.accept()
                with conn:
                    if conn.recv(1) == b"q":
                        return
                    counts["received"] += 1
                    while chunk := conn.recv(65536):
                        counts["received"] += len(chunk)
                    conn.sendall(b"r" * replies)
                    counts["sent"] += replies
                    counts["connections"] += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], counts, thread


def stop_server(port: int, thread: threading.Thread) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"q")
    thread.join(5)


def test_every_short_connection_is_counted(cgroup_dir: Path, traffic: CgroupTraffic) -> None:
    port, counts, thread = tcp_server(replies=50_000)
    code = (
        "import socket\n"
        "for _ in range(40):\n"  # a new connection each, none alive at any pass
        f"    s = socket.create_connection(('127.0.0.1', {port}))\n"
        "    s.sendall(b'x' * 10_000)\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "    while s.recv(65536): pass\n"
        "    s.close()\n"
    )
    proc = member(cgroup_dir, code)
    path, level = "/" + cgroup_dir.name, 1
    traffic.watch("t1", path, level, [proc.pid])
    assert traffic.sample() == {"t1": Counts()}
    proc.communicate(b"go\n")
    assert proc.returncode == 0
    stop_server(port, thread)
    counted = traffic.sample()["t1"]
    assert counts["connections"] == 40
    assert counts["received"] == 40 * 10_000
    # The payload the server counted, plus each packet's headers.
    assert_tcp_ip_bytes(counted.sent_bytes, counts["received"], counted.sent_packets)
    assert_tcp_ip_bytes(counted.received_bytes, counts["sent"], counted.received_packets)
    assert counted.sent_packets >= 40 * 4  # SYN, ACK, data, FIN at least
    # The members are gone: the next pass carries the counts and lets the rules go.
    traffic.watch("t1", path, level, [])
    assert traffic.sample()["t1"] == counted
    assert traffic.table not in tables()


def test_udp_is_counted_to_the_byte(cgroup_dir: Path, traffic: CgroupTraffic) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for n in range(20):\n"
        f"    s.sendto(b'q' * (100 + n), ('127.0.0.1', {port}))\n"
        "    s.recv(2048)\n"
    )
    proc = member(cgroup_dir, code)
    traffic.watch("t1", "/" + cgroup_dir.name, 1, [proc.pid])
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    asked = answered = 0
    for _ in range(20):
        data, peer = server.recvfrom(2048)
        asked += len(data)
        answered += server.sendto(b"a" * 500, peer)
    proc.communicate()
    server.close()
    counted = traffic.sample()["t1"]
    assert counted == Counts(asked + 20 * UDP_HEADERS, answered + 20 * UDP_HEADERS, 20, 20)
    assert asked == sum(100 + n for n in range(20))


def test_loopback_between_two_members_is_not_the_targets(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    port, counts, thread = tcp_server(replies=0)
    code = (
        "import socket, threading\n"
        "inner = socket.socket(); inner.bind(('127.0.0.1', 0)); inner.listen()\n"
        "def drain():\n"
        "    c, _ = inner.accept()\n"
        "    while c.recv(65536): pass\n"
        "t = threading.Thread(target=drain); t.start()\n"
        "s = socket.create_connection(inner.getsockname())\n"  # member to member
        "s.sendall(b'i' * 3_000_000); s.close(); t.join()\n"
        f"s = socket.create_connection(('127.0.0.1', {port}))\n"  # to the outside
        "s.sendall(b'o' * 200_000); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
    )
    proc = member(cgroup_dir, code)
    traffic.watch("t1", "/" + cgroup_dir.name, 1, [proc.pid])
    proc.communicate(b"go\n")
    stop_server(port, thread)
    counted = traffic.sample()["t1"]
    assert counts["received"] == 200_000
    # Only the connection to the outside: its payload and headers, not the 3 MB.
    assert_tcp_ip_bytes(counted.sent_bytes, 200_000, counted.sent_packets)
    assert_tcp_ip_bytes(counted.received_bytes, 0, counted.received_packets)
    assert counted.sent_packets < 50 and counted.received_packets < 50


def counters(traffic: CgroupTraffic) -> list[str]:
    answer = Nft().run(f"list counters table {traffic.table}")["nftables"]
    return sorted(item["counter"]["name"] for item in answer if "counter" in item)


def test_rules_go_with_their_target_and_the_table_with_the_last(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    (cgroup_dir / "a").mkdir()
    (cgroup_dir / "b").mkdir()
    proc = member(cgroup_dir / "a", "")
    try:
        traffic.watch("a", f"/{cgroup_dir.name}/a", 2, [proc.pid])
        traffic.watch("b", f"/{cgroup_dir.name}/b", 2, [proc.pid])
        kinds = ("internal", "lotx", "rx", "tx")
        assert counters(traffic) == sorted(f"{k}_{n}" for n in ("w1", "w2") for k in kinds)
        traffic.forget("a")
        assert counters(traffic) == sorted(f"{k}_w2" for k in kinds)
        traffic.forget("b")
        assert traffic.table not in tables()
    finally:
        proc.communicate(b"\n")
        (cgroup_dir / "a").rmdir()
        (cgroup_dir / "b").rmdir()


def test_a_target_whose_cgroup_is_gone_leaves_the_others_counted(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    for name in ("gone", "stays"):
        (cgroup_dir / name).mkdir()
    port, counts, thread = tcp_server(replies=0)
    send = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}))\n"
        "s.sendall(b'x' * 5000)"
    )
    traffic.watch("gone", f"/{cgroup_dir.name}/gone", 2, [os.getpid()])
    traffic.watch("stays", f"/{cgroup_dir.name}/stays", 2, [os.getpid()])
    (cgroup_dir / "gone").rmdir()  # its map entries can no longer be named by path
    traffic.forget("gone")
    proc = member(cgroup_dir / "stays", send)
    proc.communicate(b"go\n")
    stop_server(port, thread)
    counted = traffic.sample()["stays"]
    assert counts["received"] == 5000
    assert_tcp_ip_bytes(counted.sent_bytes, 5000, counted.sent_packets)
    (cgroup_dir / "stays").rmdir()


def test_a_table_left_by_a_killed_daemon_is_removed_at_the_next_start(cgroup_dir: Path) -> None:
    live_code = (
        "import os, sys\n"
        "from edgewatt.core.facts.cgroup_traffic import CgroupTraffic, Counts\n"
        f"t = CgroupTraffic({WHERE.v2!r})\n"
        f"t.watch('t2', '/{cgroup_dir.name}', 1, [os.getpid()])\n"
        "print(t.table, flush=True); sys.stdin.read(); t.close()\n"
    )
    code = (
        "import os, sys\n"
        "from edgewatt.core.facts.cgroup_traffic import CgroupTraffic, Counts\n"
        f"t = CgroupTraffic({WHERE.v2!r})\n"
        f"t.watch('t1', '/{cgroup_dir.name}', 1, [os.getpid()])\n"
        "os.kill(os.getpid(), 9)\n"  # as kill -9: nothing cleaned up
    )
    killed = subprocess.Popen([sys.executable, "-c", code])
    assert killed.wait() == -9
    assert f"inet edgewatt_{killed.pid}" in tables()
    assert WHERE.v2 is not None
    live = subprocess.Popen(  # a live daemon's table is left alone
        [sys.executable, "-c", live_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    live_table = live.stdout.readline().decode().strip()
    assert CgroupTraffic(WHERE.v2).clean_stale() >= 1
    # Ours alone: other daemons (parallel test runs) may hold tables of their own.
    now = tables()
    assert f"inet edgewatt_{killed.pid}" not in now and live_table in now, now
    live.communicate(b"")
    assert live_table not in tables()
