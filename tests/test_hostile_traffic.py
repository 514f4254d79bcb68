"""Cgroup targets' traffic counters attacked as a local user would: a daemon
without CAP_NET_ADMIN, other programs' packet marks, nested targets, two targets on
one cgroup, and namespaces and counters a user controls. Real daemon, real nftables,
real cgroups, real network namespaces."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroup_traffic, cgroups
from edgewatt.core.facts.cgroup_traffic import CgroupTraffic, Counts
from edgewatt.core.kernel import nftables
from edgewatt.core.kernel.nftables import Nft
from tests.conftest import PRINT_TCP_SENT, ROOT, assert_tcp_ip_bytes, tcp_sent, wait_for
from tests.machine import WITHOUT_NET_ADMIN
from tests.test_cgroup_traffic import UDP_HEADERS, member, stop_server, tcp_server

WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)


def joining(cgroup: Path) -> Callable[[], None]:
    """A preexec_fn: the child enters ``cgroup`` before its first instruction."""

    def join() -> None:
        with open(cgroup / "cgroup.procs", "w") as f:
            f.write("0")

    return join


def send_each(port: int, size: int) -> str:
    """A member's code: one connection to ``port`` carrying ``size`` bytes; at the end
    it prints what the kernel sent on it (PRINT_TCP_SENT)."""
    return (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}))\n"
        f"s.sendall(b'x' * {size}); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
    ) + PRINT_TCP_SENT


def test_without_net_admin_the_traffic_figure_is_absent_and_says_why(
    daemon_factory: Any, cgroup_dir: Path
) -> None:
    daemon = daemon_factory(interval=0.2, prefix=WITHOUT_NET_ADMIN)
    why = daemon.call("GET", "/healthz")[1]["cgroup_traffic"]
    assert why is not None and "CAP_NET_ADMIN" in why, why
    status, target = daemon.call("POST", "/v1/targets", {"cgroup": f"/{cgroup_dir.name}"})
    assert status == 201, target
    port, counts, thread = tcp_server(replies=0)
    senders = [member(cgroup_dir, send_each(port, 60_000)) for _ in range(5)]
    for proc in senders:
        proc.communicate(b"go\n")
        assert proc.returncode == 0
    stop_server(port, thread)
    assert counts["received"] == 5 * 60_000
    summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary?fresh=1")[1]
    assert summary["network_transmit_bytes"] is None, summary
    assert summary["network_receive_bytes"] is None
    assert summary["network_counts"] is None
    assert "CAP_NET_ADMIN" in summary["network_unknown"], summary
    assert summary["cpu_user_s"] is not None  # the cgroup's other figures are there
    assert daemon.series("process_network_io_bytes_total", edgewatt_target_id=target["id"]) == []
    assert daemon.series("process_cpu_time_seconds_total", edgewatt_target_id=target["id"])
    # One line at the start, not one per member process.
    assert len(re.findall("network bytes unavailable", daemon.log())) == 1, daemon.log()
    assert "cannot count the traffic" not in daemon.log()
    doctor = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    line = next(x for x in doctor.stdout.splitlines() if "cgroup targets" in x)
    assert line.startswith("warn") and "no network figures" in line, doctor.stdout
    assert "CAP_NET_ADMIN" in line
    shown = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "summary", target["id"], "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert re.search(r"network +unknown: .*CAP_NET_ADMIN", shown.stdout), shown.stdout


def test_run_cgroup_without_net_admin_says_ip_bytes_are_unknown(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(interval=0.2, prefix=WITHOUT_NET_ADMIN)
    port, counts, thread = tcp_server(replies=0)
    output = tmp_path / "run.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--cgroup", "--interval", "1",
         "--output", str(output), "--", sys.executable, "-c", send_each(port, 300_000)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
    )  # fmt: skip
    stop_server(port, thread)
    assert done.returncode == 0, done.stderr
    assert counts["received"] == 300_000
    assert not re.search(r"^  network +sent 0", done.stderr, re.M)  # the host's are apart
    unknown = r"network +sent and received unknown: .*CAP_NET_ADMIN"
    assert re.search(unknown, done.stderr), done.stderr
    assert '"network_transmit_bytes"' not in output.read_text().splitlines()[-1]


MARK = 0x10000  # Tailscale's and Calico's bits are in 0x00ff0000 too


def marked_table(port: int) -> str:
    """A second table, as another program's: it counts the loopback UDP datagrams to
    ``port`` that reach its input hook with mark MARK, after edgewatt's (priority 0)."""
    name = f"inet ewmark_{os.getpid()}"
    Nft().run(
        "\n".join(
            [
                f"add table {name}",
                f"add chain {name} input {{ type filter hook input priority 0; policy accept; }}",
                f"add counter {name} marked",
                f'add rule {name} input iif "lo" udp dport {port} meta mark {MARK:#x} '
                'counter name "marked"',
            ]
        )
    )
    return name


def marked_packets(table: str) -> int:
    answer = Nft().run(f"list counter {table} marked")["nftables"]
    return next(item["counter"]["packets"] for item in answer if "counter" in item)


SEND_MARKED = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    f"s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, {MARK})\n"
    "for _ in range(20):\n"
    "    s.sendto(b'm' * 100, ('127.0.0.1', int(sys.argv[1])))\n"
)


def test_other_programs_marks_are_kept(cgroup_dir: Path, traffic: CgroupTraffic) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    port = receiver.getsockname()[1]
    table = marked_table(port)
    killed = None
    try:
        # A user's cgroup is counted; its member sends marked datagrams of its own.
        proc = member(cgroup_dir, SEND_MARKED.replace("int(sys.argv[1])", str(port)))
        traffic.watch("t1", "/" + cgroup_dir.name, 1, [proc.pid])
        proc.communicate(b"go\n")
        assert marked_packets(table) == 20
        # Root's marked loopback packets, from outside any target, keep their mark.
        subprocess.run([sys.executable, "-c", SEND_MARKED, str(port)], check=True)
        assert marked_packets(table) == 40
        assert traffic.sample()["t1"].sent_packets == 20  # the member's, counted
        # The rules a daemon killed with -9 leaves behind touch no mark either.
        code = (
            "import os\n"
            "from edgewatt.core.facts.cgroup_traffic import CgroupTraffic\n"
            f"t = CgroupTraffic({WHERE.v2!r})\n"
            f"t.watch('t1', '/{cgroup_dir.name}', 1, [os.getpid()])\n"
            "os.kill(os.getpid(), 9)\n"
        )
        killed = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
        assert killed.wait() == -9
        subprocess.run([sys.executable, "-c", SEND_MARKED, str(port)], check=True)
        assert marked_packets(table) == 60
        for _ in range(60):
            receiver.recv(2048)
    finally:
        Nft().run(f"delete table {table}")
        receiver.close()
        if killed is not None:
            Nft().run(f"delete table inet edgewatt_{killed.pid}")


def sink(cgroup: Path) -> tuple[subprocess.Popen, int]:
    """A member of ``cgroup`` that reads one connection to EOF: its process, port."""
    code = (
        "import socket, sys\n"
        "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n"
        "print(l.getsockname()[1], flush=True)\n"
        "c, _ = l.accept()\n"
        "n = 0\n"
        "while chunk := c.recv(65536): n += len(chunk)\n"
        "print(n, flush=True)\n"
    )

    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=joining(cgroup)
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_nested_targets_count_as_if_each_were_alone(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    outer, inner, sibling = (
        cgroup_dir / "outer",
        cgroup_dir / "outer/inner",
        cgroup_dir / "outer/sib",
    )
    for made in (outer, inner, sibling):
        made.mkdir()
    base = f"/{cgroup_dir.name}"
    port, counts, thread = tcp_server(replies=0)
    # 1 MB from the inner cgroup to a process outside both.
    proc = member(inner, send_each(port, 1_000_000), stdout=subprocess.PIPE)
    traffic.watch("outer", f"{base}/outer", 2, [proc.pid])
    traffic.watch("inner", f"{base}/outer/inner", 3, [proc.pid])
    sent = tcp_sent(proc.communicate(b"go\n")[0], 1_000_000)  # and what TCP sent again
    stop_server(port, thread)
    assert counts["received"] == 1_000_000
    first = traffic.sample()
    for name in ("inner", "outer"):
        assert_tcp_ip_bytes(first[name].sent_bytes, sent, first[name].sent_packets)
        assert first[name].received_packets == first["inner"].received_packets
    assert first["outer"] == first["inner"]
    # 1 MB from the inner cgroup to a sibling inside the outer: the inner's alone.
    receiver, sink_port = sink(sibling)
    proc = member(inner, send_each(sink_port, 1_000_000), stdout=subprocess.PIPE)
    traffic.watch("outer", f"{base}/outer", 2, [proc.pid, receiver.pid])
    traffic.watch("inner", f"{base}/outer/inner", 3, [proc.pid])
    sent = tcp_sent(proc.communicate(b"go\n")[0], 1_000_000)
    assert receiver.communicate()[0].strip() == "1000000"
    second = traffic.sample()
    # Internal to the outer: nothing of the 1 MB. The handshake's SYN-ACK and last ACK
    # pass through a request socket, which has no cgroup: one packet each way at most.
    outer_delta = second["outer"].since(first["outer"])
    assert outer_delta.sent_packets <= 1 and outer_delta.received_packets <= 1, outer_delta
    assert outer_delta.sent_bytes <= 80 and outer_delta.received_bytes <= 80, outer_delta
    inner_sent = second["inner"].since(first["inner"])
    assert_tcp_ip_bytes(inner_sent.sent_bytes, sent, inner_sent.sent_packets)


def test_a_segment_tcp_sends_again_counts_again(cgroup_dir: Path, traffic: CgroupTraffic) -> None:
    """A busy host's loopback reorders packets (a sender moved to another CPU has its
    packets queued there), and TCP resends what it takes for lost: 1 MB then crossed
    loopback as 1,095,232 bytes of payload (a CI reading). Here a table of
    another program's drops one segment after edgewatt's input hook counted it, so
    the resend is certain: both copies are the target's, as in the sender's books."""
    port, counts, thread = tcp_server(replies=0)
    table = f"inet ewdrop_{os.getpid()}"
    # The 4th segment over 1,000 bytes to the server, once (numgen counts to 1,000).
    Nft().run(
        "\n".join(
            [
                f"add table {table}",
                f"add chain {table} input {{ type filter hook input priority 0; policy accept; }}",
                f'add rule {table} input iif "lo" tcp dport {port} meta length > 1000 '
                "numgen inc mod 1000 == 3 counter drop",
            ]
        )
    )
    try:
        proc = member(cgroup_dir, send_each(port, 300_000), stdout=subprocess.PIPE)
        traffic.watch("t1", "/" + cgroup_dir.name, 1, [proc.pid])
        printed = proc.communicate(b"go\n")[0]
        dropped = Nft().run(f"list chain {table} input")["nftables"]
    finally:
        Nft().run(f"delete table {table}")
    stop_server(port, thread)
    assert counts["received"] == 300_000
    rule = next(item["rule"] for item in dropped if "rule" in item)
    lost = next(e["counter"] for e in rule["expr"] if "counter" in e)
    assert lost["packets"] == 1, rule
    sent = tcp_sent(printed, 300_000)
    assert sent - 300_000 >= lost["bytes"] - 80  # the dropped segment's payload, again
    counted = traffic.sample()["t1"]
    assert_tcp_ip_bytes(counted.sent_bytes, sent, counted.sent_packets)


def test_two_targets_on_one_cgroup_both_get_figures(
    cgroup_dir: Path, traffic: CgroupTraffic, caplog: pytest.LogCaptureFixture
) -> None:
    port, counts, thread = tcp_server(replies=0)
    path = "/" + cgroup_dir.name
    proc = member(cgroup_dir, send_each(port, 50_000), stdout=subprocess.PIPE)
    traffic.watch("a", path, 1, [proc.pid])
    sent = tcp_sent(proc.communicate(b"go\n")[0], 50_000)
    first = traffic.sample()
    assert_tcp_ip_bytes(first["a"].sent_bytes, sent, first["a"].sent_packets)
    # The second target joins while a member is there: counted from then on.
    proc = member(cgroup_dir, send_each(port, 70_000), stdout=subprocess.PIPE)
    traffic.watch("a", path, 1, [proc.pid])
    traffic.watch("b", path, 1, [proc.pid])
    sent = tcp_sent(proc.communicate(b"go\n")[0], 70_000)
    stop_server(port, thread)
    second = traffic.sample()
    assert counts["received"] == 120_000
    b = second["b"]
    assert_tcp_ip_bytes(b.sent_bytes, sent, b.sent_packets)
    a = second["a"].since(first["a"])
    assert a == b
    assert traffic.problem("b") is None
    assert "File exists" not in caplog.text
    traffic.forget("a")  # b's rules stay
    proc = member(cgroup_dir, "")
    traffic.watch("b", path, 1, [proc.pid])
    assert traffic.sample()["b"] == b
    proc.communicate(b"\n")


HERS = """
import socket, subprocess, sys
sys.stdin.readline()
run = lambda script: subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)
# Root in her own namespace: she makes the daemon's table there herself, with a counter
# of its naming that says 1e15 bytes, and 2,000 more.
table = "inet " + sys.argv[1]
run("\\n".join(
    ["add table " + table, "add counter " + table + " tx_w1 { packets 1 bytes 1000000000000000 }"]
    + ["add counter " + table + " c" + str(n) for n in range(2000)]
))
for step in [
    "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
    "ip link add v0 type veth peer name v1",
    "ip addr add 10.9.9.1/24 dev v0",
    "ip neigh add 10.9.9.2 lladdr 02:00:00:00:00:02 dev v0",  # no ARP
    "ip link set v1 up",
    "ip link set v0 up",
]:
    subprocess.run(step.split(), check=True)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(20):
    s.sendto(b"u" * 100, ("10.9.9.2", 9))  # out of v0 into v1
print("done", flush=True)
sys.stdin.readline()
"""


def netns_tables(pid: int) -> str:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "nft", "list", "tables"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_a_users_own_namespace_is_counted_by_its_interfaces_never_her_table(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    her = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-rn",
         "python3", "-c", HERS, traffic.table.split()[1]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=joining(cgroup_dir),
    )  # fmt: skip
    assert her.stdin is not None and her.stdout is not None
    host = os.stat("/proc/self/ns/net").st_ino
    try:
        wait_for(lambda: os.stat(f"/proc/{her.pid}/ns/net").st_ino != host)
        traffic.watch("t", "/" + cgroup_dir.name, 1, [her.pid], uid=65534)
        assert netns_tables(her.pid) == ""  # no table of the daemon's where she is root
        assert traffic.kind("t") == "interface-bytes"
        her.stdin.write("go\n")
        her.stdin.flush()
        assert her.stdout.readline() == "done\n"
        assert "edgewatt_" in netns_tables(her.pid)  # hers, forged
        traffic.watch("t", "/" + cgroup_dir.name, 1, [her.pid], uid=65534)
        # 20 datagrams of 100 bytes, 28 of IPv4 and UDP headers and 14 of Ethernet
        # each, out of one end of her veth pair and into the other: the forged counter
        # is never read.
        assert traffic.sample()["t"] == Counts(20 * 142, 20 * 142, 20, 20)
    finally:
        her.kill()
        her.wait()


def test_namespaces_are_bounded_and_their_contexts_given_back(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def rss_mib() -> float:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024  # type: ignore[index]

    path = "/" + cgroup_dir.name
    traffic.watch("t", path, 1, [])
    before_fds, before_rss = fds(), rss_mib()
    # 100 members, each in a network namespace of its own (root's: trusted, entered).
    members = [
        subprocess.Popen(["unshare", "-n", "sleep", "600"], preexec_fn=joining(cgroup_dir))
        for _ in range(100)
    ]
    try:
        wait_for(lambda: all(os.path.exists(f"/proc/{p.pid}/ns/net") for p in members))
        wait_for(lambda: len((cgroup_dir / "cgroup.procs").read_text().split()) == 100)
        traffic.watch("t", path, 1, [p.pid for p in members], uid=0)
        problem = traffic.problem("t")
        bound = cgroup_traffic.MAX_NAMESPACES_PER_TARGET
        assert problem is not None and f"more than {bound}" in problem
        assert "t" not in traffic.sample()  # absent, not the part it could count
        opened = fds() - before_fds
        assert opened <= 2 * bound, opened  # two netlink sockets each: commands, counters
    finally:
        for p in members:
            p.kill()
            p.wait()
    traffic.watch("t", path, 1, [])
    assert traffic.problem("t") is None
    assert traffic.sample()["t"] == Counts()
    assert fds() == before_fds
    assert rss_mib() < before_rss + 4, (before_rss, rss_mib())  # given back


def test_a_table_deleted_under_the_daemon_warns_once(
    cgroup_dir: Path, traffic: CgroupTraffic, caplog: pytest.LogCaptureFixture
) -> None:
    proc = member(cgroup_dir, "")
    try:
        traffic.watch("t", "/" + cgroup_dir.name, 1, [proc.pid])
        Nft().run(f"delete table {traffic.table}")
        for _ in range(5):
            traffic.watch("t", "/" + cgroup_dir.name, 1, [proc.pid])
            assert "t" not in traffic.sample()
        assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1, caplog.text
        assert "counters unreadable" in (traffic.problem("t") or "")
    finally:
        proc.communicate(b"\n")


def test_a_port_another_cgroup_used_before_is_counted_for_the_new_sender_alone(
    cgroup_dir: Path, traffic: CgroupTraffic
) -> None:
    # The loopback sender is known by its flow, kept FLOW_TIMEOUT (0.5 s) after its
    # last packet: a later socket of another cgroup on the same port and peer (TCP
    # gives a closed connection's port again after 1 s) is not the first's.
    for name in ("a", "b"):
        (cgroup_dir / name).mkdir()
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\n"
        "for _ in range(20):\n"
        f"    s.sendto(b'p' * 200, {server.getsockname()!r})\n"
    )
    senders = {name: member(cgroup_dir / name, code) for name in ("a", "b")}
    for name, proc in senders.items():
        traffic.watch(name, f"/{cgroup_dir.name}/{name}", 2, [proc.pid])
    senders["a"].communicate(b"go\n")
    time.sleep(0.6)  # past the flow's timeout: the port is free to be anyone's
    senders["b"].communicate(b"go\n")
    for _ in range(40):
        server.recv(2048)
    server.close()
    counted = traffic.sample()
    assert counted["a"] == Counts(20 * (200 + UDP_HEADERS), 0, 20, 0)
    assert counted["b"] == Counts(20 * (200 + UDP_HEADERS), 0, 20, 0)
