"""Cgroup targets' traffic counters attacked as a local user would (issue 38): a daemon
without CAP_NET_ADMIN, other programs' packet marks, nested targets, two targets on
one cgroup, and namespaces and counters a user controls. Real daemon, real nftables,
real cgroups, real network namespaces."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.sampling import cgroups, nftables
from edgewatt.core.sampling.cgroup_traffic import CgroupTraffic
from edgewatt.core.sampling.nftables import Nft
from tests.conftest import ROOT, assert_tcp_ip_bytes
from tests.test_cgroup_traffic import member, stop_server, tcp_server

WHERE = cgroups.mounts()
pytestmark = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0 or nftables.available() is not None,
    reason=f"needs root, cgroup v2 and nftables ({nftables.available()})",
)
WITHOUT_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]


def send_each(port: int, size: int) -> str:
    """A member's code: one connection to ``port`` carrying ``size`` bytes."""
    return (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}))\n"
        f"s.sendall(b'x' * {size}); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
    )


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
    assert "IP sent 0" not in done.stderr
    assert re.search(r"IP +sent and received unknown: .*CAP_NET_ADMIN", done.stderr), done.stderr
    assert '"network_transmit_bytes"' not in output.read_text().splitlines()[-1]


@pytest.fixture
def traffic() -> Iterator[CgroupTraffic]:
    assert WHERE.v2 is not None
    counted = CgroupTraffic(WHERE.v2)
    yield counted
    counted.close()


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
            "from edgewatt.core.sampling.cgroup_traffic import CgroupTraffic\n"
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

    def join() -> None:
        with open(cgroup / "cgroup.procs", "w") as f:
            f.write("0")

    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=join
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
    proc = member(inner, send_each(port, 1_000_000))
    traffic.watch("outer", f"{base}/outer", 2, [proc.pid])
    traffic.watch("inner", f"{base}/outer/inner", 3, [proc.pid])
    proc.communicate(b"go\n")
    stop_server(port, thread)
    assert counts["received"] == 1_000_000
    first = traffic.sample()
    for name in ("inner", "outer"):
        assert_tcp_ip_bytes(first[name].sent_bytes, 1_000_000, first[name].sent_packets)
        assert first[name].received_packets == first["inner"].received_packets
    assert first["outer"] == first["inner"]
    # 1 MB from the inner cgroup to a sibling inside the outer: the inner's alone.
    receiver, sink_port = sink(sibling)
    proc = member(inner, send_each(sink_port, 1_000_000))
    traffic.watch("outer", f"{base}/outer", 2, [proc.pid, receiver.pid])
    traffic.watch("inner", f"{base}/outer/inner", 3, [proc.pid])
    proc.communicate(b"go\n")
    assert receiver.communicate()[0].strip() == "1000000"
    second = traffic.sample()
    # Internal to the outer: nothing of the 1 MB. The handshake's SYN-ACK and last ACK
    # pass through a request socket, which has no cgroup: one packet each way at most.
    outer_delta = second["outer"].since(first["outer"])
    assert outer_delta.sent_packets <= 1 and outer_delta.received_packets <= 1, outer_delta
    assert outer_delta.sent_bytes <= 80 and outer_delta.received_bytes <= 80, outer_delta
    inner_sent = second["inner"].since(first["inner"])
    assert_tcp_ip_bytes(inner_sent.sent_bytes, 1_000_000, inner_sent.sent_packets)


def test_two_targets_on_one_cgroup_both_get_figures(
    cgroup_dir: Path, traffic: CgroupTraffic, caplog: pytest.LogCaptureFixture
) -> None:
    port, counts, thread = tcp_server(replies=0)
    path = "/" + cgroup_dir.name
    proc = member(cgroup_dir, send_each(port, 50_000))
    traffic.watch("a", path, 1, [proc.pid])
    proc.communicate(b"go\n")
    first = traffic.sample()
    assert_tcp_ip_bytes(first["a"].sent_bytes, 50_000, first["a"].sent_packets)
    # The second target joins while a member is there: counted from then on.
    proc = member(cgroup_dir, send_each(port, 70_000))
    traffic.watch("a", path, 1, [proc.pid])
    traffic.watch("b", path, 1, [proc.pid])
    proc.communicate(b"go\n")
    stop_server(port, thread)
    second = traffic.sample()
    assert counts["received"] == 120_000
    b = second["b"]
    assert_tcp_ip_bytes(b.sent_bytes, 70_000, b.sent_packets)
    a = second["a"].since(first["a"])
    assert a == b
    assert traffic.problem("b") is None
    assert "File exists" not in caplog.text
    traffic.forget("a")  # b's rules stay
    proc = member(cgroup_dir, "")
    traffic.watch("b", path, 1, [proc.pid])
    assert traffic.sample()["b"] == b
    proc.communicate(b"\n")
