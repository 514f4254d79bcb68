"""Containers and commands as cgroup targets, end to end: a real podman (Debian's
package) runs an image built here from Debian's busybox-static, the real daemon
registers it by name, and the figures are checked against the cgroup's own files and
what a server outside the container counted. `edgewatt run --cgroup` gets the same."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.core.kernel import nftables
from tests.conftest import (
    ROOT,
    WITHOUT_SYS_ADMIN,
    DaemonProcess,
    assert_tcp_ip_bytes,
    tcp_sent,
    wait_for,
)

WHERE = cgroups.mounts()
BUSYBOX = "/bin/busybox"
AVAILABLE = (
    os.geteuid() == 0
    and WHERE.v2 is not None
    and shutil.which("podman") is not None
    and os.path.exists(BUSYBOX)
    and nftables.available() is None
)
pytestmark = pytest.mark.skipif(
    not AVAILABLE,
    reason="needs root, cgroup v2, nftables, podman and busybox-static (.ci/run installs them)",
)
IMAGE = "localhost/edgewatt-test-busybox:1"
# The limits a container gets by default cannot be set in this VM.
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
UDP_HEADERS = 20 + 8


def podman(*args: str, check: bool = True) -> str:
    """podman as this VM needs it: runc (crun refuses the hybrid cgroup layout) and
    cgroupfs (no systemd here)."""
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    done = subprocess.run(
        ["podman", *runtime, "--cgroup-manager=cgroupfs", *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def build_image(into: Path) -> Path:
    """A root file system of Debian's static busybox, as a tar for `podman import`."""
    root = into / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for tool in ("sh", "sleep", "wget", "tftp", "cat", "seq", "dd"):
        (root / "bin" / tool).symlink_to("busybox")
    tar = into / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    return tar


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    podman("import", str(build_image(tmp_path_factory.mktemp("image"))), IMAGE)
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"edgewatt-test-{os.getpid()}"
    podman("rm", "-f", name, check=False)
    podman("run", "-d", "--name", name, *LIMITS, image, "/bin/sleep", "600")
    yield name
    podman("rm", "-f", "-t", "0", name, check=False)


def main_pid(name: str) -> int:
    return int(podman("inspect", "--format", "{{.State.Pid}}", name))


def gateway(name: str) -> str:
    return podman("inspect", "--format", "{{.NetworkSettings.Gateway}}", name)


def cgroup_cpu(name: str) -> float:
    path = cgroups.cgroup_of(main_pid(name))
    user, system = cgroups.parse_cpu_stat(Path(f"{WHERE.v2}{path}/cpu.stat").read_text())
    return user + system


def tables_in(pid: int) -> list[str]:
    listing = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "nft", "list", "tables"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line.split()[-1] for line in listing.splitlines() if "edgewatt_" in line]


class HttpServer:
    """Outside the container: answers every request with ``body`` bytes and closes;
    counts the payload it received and sent, per connection."""

    def __init__(self, host: str, body: int) -> None:
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.body = body
        self.received = self.sent = self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request and (chunk := conn.recv(4096)):
                    request += chunk
                answer = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % self.body
                conn.sendall(answer + b"b" * self.body)
                self.received += len(request)
                self.sent += len(answer) + self.body
                self.connections += 1

    def close(self) -> None:
        self.listener.close()


class TftpServer:
    """A TFTP server (RFC 1350, UDP) outside the container serving one file of
    ``size`` bytes; counts every datagram's payload each way."""

    def __init__(self, host: str, size: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.port = self.sock.getsockname()[1]
        self.host = host
        self.data = b"t" * size
        self.received = self.sent = self.datagrams_in = self.datagrams_out = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        request, peer = self.sock.recvfrom(2048)
        self._count_in(request)
        transfer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # its own TID
        transfer.bind((self.host, 0))
        transfer.settimeout(5)
        block = 1
        while True:
            chunk = self.data[(block - 1) * 512 : block * 512]
            self.sent += transfer.sendto(struct.pack("!HH", 3, block) + chunk, peer)
            self.datagrams_out += 1
            ack, _ = transfer.recvfrom(2048)
            self._count_in(ack)
            if len(chunk) < 512:
                break
            block += 1
        transfer.close()

    def _count_in(self, datagram: bytes) -> None:
        self.received += len(datagram)
        self.datagrams_in += 1


def summary(daemon: DaemonProcess, target_id: str) -> dict[str, Any]:
    status, body = daemon.call("GET", f"/v1/targets/{target_id}/summary?fresh=1")
    assert status == 200, body
    return body


def test_a_container_registered_by_name_is_measured_whole(
    daemon_factory: Any, container: str
) -> None:
    daemon = daemon_factory(interval=2.0)
    status, target = daemon.call(
        "POST", "/v1/targets", {"container": container, "labels": {"app": "fl-client"}}
    )
    assert status == 201, target
    assert target["kind"] == "cgroup"
    assert target["cgroup"]["runtime"] == "podman"  # the one installed, found
    assert target["cgroup"]["path"] == cgroups.cgroup_of(main_pid(container))
    cpu_before = cgroup_cpu(container)
    host = gateway(container)
    http = HttpServer(host, body=100_000)
    tftp = TftpServer(host, size=3_000)
    # 40 requests, a connection each, all inside one 2 s interval; then a UDP transfer.
    podman(
        "exec", container, "sh", "-c",
        f"for i in $(seq 40); do wget -q -O /dev/null http://{host}:{http.port}/; done; "
        f"tftp -g -r file -l /dev/null {host} {tftp.port}",
    )  # fmt: skip
    tftp.thread.join(5)
    figures = summary(daemon, target["id"])
    http.close()
    assert http.connections == 40
    assert tftp.datagrams_out == 6  # 5 full blocks and one of 440 bytes
    # Every byte both servers counted, plus each packet's headers (UDP's exactly).
    packets = figures["cgroup"]
    assert_tcp_ip_bytes(
        figures["network_transmit_bytes"] - tftp.received - tftp.datagrams_in * UDP_HEADERS,
        http.received,
        packets["network_transmit_packets"] - tftp.datagrams_in,
    )
    assert_tcp_ip_bytes(
        figures["network_receive_bytes"] - tftp.sent - tftp.datagrams_out * UDP_HEADERS,
        http.sent,
        packets["network_receive_packets"] - tftp.datagrams_out,
    )
    assert packets["network_transmit_packets"] >= 40 * 4 + tftp.datagrams_in
    assert figures["network_counts"] == "ip-bytes"
    assert figures["membership"] == "cgroup"
    cpu = figures["cpu_user_s"] + figures["cpu_system_s"]
    assert cpu == pytest.approx(cgroup_cpu(container) - cpu_before, abs=0.003)
    assert cpu > 0
    assert figures["cgroup"]["memory_current_bytes"] > 0
    assert figures["memory_rss_peak_bytes"] > 0
    # OpenTelemetry's container attributes (semantic conventions v1.44:
    # container.runtime.name; container.runtime is the deprecated name).
    labels = {"container_name": container, "container_runtime_name": "podman", "app": "fl-client"}
    exported = daemon.series("process_cpu_time_seconds_total", **labels)
    assert {series["cpu_mode"] for series, _ in exported} == {"user", "system"}
    assert not any("container_runtime" in series for series, _ in exported)
    # The series are the cgroup's counters themselves (cumulative since it was made).
    assert sum(value for _, value in exported) == pytest.approx(cgroup_cpu(container), abs=0.01)


def test_a_restarted_container_is_followed_and_nothing_is_left_behind(
    daemon_factory: Any, container: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    daemon = daemon_factory(interval=0.5, state_dir=state)
    status, target = daemon.call("POST", "/v1/targets", {"container": container})
    assert status == 201, target
    first_pid = main_pid(container)
    wait_for(lambda: tables_in(first_pid))
    assert tables_in(first_pid) == [f"edgewatt_{daemon.proc.pid}"]
    host = gateway(container)
    http = HttpServer(host, body=100_000)
    fetch = f"wget -q -O /dev/null http://{host}:{http.port}/"
    podman("exec", container, "sh", "-c", fetch)
    before = summary(daemon, target["id"])
    assert before["network_receive_bytes"] >= 100_000
    podman("restart", "-t", "0", container)  # a new cgroup, a new network namespace
    assert main_pid(container) != first_pid
    # Counted from the pass that finds it again (within one interval, the log says).
    wait_for(lambda: tables_in(main_pid(container)))
    podman("exec", container, "sh", "-c", fetch)
    after = summary(daemon, target["id"])
    assert after["state"] == "running"
    assert after["network_receive_bytes"] >= before["network_receive_bytes"] + 100_000
    assert after["cpu_user_s"] + after["cpu_system_s"] >= before["cpu_user_s"]
    # kill -9: its table stays in the container's namespace until the next start.
    pid = main_pid(container)
    wait_for(lambda: tables_in(pid))
    killed = daemon.proc.pid
    daemon.stop(signal.SIGKILL)
    assert tables_in(pid) == [f"edgewatt_{killed}"]
    again = daemon_factory(interval=0.5, state_dir=state)  # restores the registration
    wait_for(lambda: tables_in(pid) == [f"edgewatt_{again.proc.pid}"])
    assert "removed 1 nftables table(s) left by an earlier daemon" in again.log()
    again.stop()
    assert tables_in(pid) == []
    assert tables_in(os.getpid()) == []
    http.close()


def test_run_cgroup_counts_a_connection_shorter_than_one_interval(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    received = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        got = 0
        while chunk := conn.recv(65536):
            got += len(chunk)
        received.append(got)
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    # At its end it prints what the kernel sent (PRINT_TCP_SENT's two figures) and how
    # many segments (struct tcp_info's tcpi_segs_out).
    code = (
        f"import socket, struct; s = socket.create_connection(('127.0.0.1', {port}))\n"
        "s.sendall(b'x' * 6_000_000); s.shutdown(socket.SHUT_WR)\n"
        "while s.recv(65536): pass\n"
        "info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)\n"
        "print(*struct.unpack_from('QQ', info, 200), struct.unpack_from('I', info, 136)[0])\n"
    )
    output = tmp_path / "run.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--cgroup", "--interval", "2",
         "--output", str(output), "--", sys.executable, "-c", code],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
    )  # fmt: skip
    thread.join(5)
    listener.close()
    assert done.returncode == 0, done.stderr
    assert received == [6_000_000]
    final = json.loads(output.read_text().splitlines()[-1])
    assert final["type"] == "summary"
    assert final["network_counts"] == "ip-bytes"
    # What the kernel sent plus each segment's headers: on loopback TCP sends segments
    # again (392,898 bytes of 6 MB in one run here) and a slow receiver makes them small
    # (CI read 6,625,552 bytes against a bound of 6.6 MB), so the bound is the sender's
    # own count of bytes and segments.
    *payload, segments = done.stdout.split()
    sent = tcp_sent(" ".join(payload), 6_000_000)
    assert_tcp_ip_bytes(final["network_transmit_bytes"], sent, int(segments))
    made = re.search(r"\), cgroup (/edgewatt/run-\d+)$", done.stderr, re.M)
    assert made, done.stderr
    shown = re.search(r"^  network +sent ([\d.]+) MiB", done.stderr, re.M)
    assert shown and float(shown[1]) == round(final["network_transmit_bytes"] / 2**20, 1)
    # The larger of the cgroup's counters and wait4: the same processes, teardowns in both.
    assert final["cpu_source"].startswith(("daemon (the cgroup's own accounts)", "kernel (wait4"))
    assert final["cpu_daemon_s"] == pytest.approx(final["cpu_wait4_s"], abs=0.01), final
    assert not Path(f"{WHERE.v2}{made[1]}").exists()  # removed at the end


def test_the_cli_registers_a_container_by_name_and_reads_it(
    daemon: DaemonProcess, container: str
) -> None:
    def edgewatt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgewatt.cli", *args, "--socket", daemon.socket],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip

    registered = edgewatt("register", "--container", container, "--label", "app=fl")
    assert registered.returncode == 0, registered.stderr
    target_id = registered.stdout.strip()
    path = cgroups.cgroup_of(main_pid(container))
    assert f"registered cgroup {path} as target {target_id}" in registered.stderr
    shown = edgewatt("summary", target_id)
    assert shown.returncode == 0, shown.stderr
    assert (
        shown.stdout.splitlines()[0]
        == f"target {target_id}: container {container} (running, cgroup)"
    )
    assert "(IP bytes, headers included)" in shown.stdout
    status = edgewatt("status")
    assert f"{target_id}  cgroup  podman:{container}  running" in status.stdout
    missing = edgewatt("register", "--container", "no-such-container")
    assert missing.returncode == 1
    assert "no such cgroup: podman inspect" in missing.stderr
    assert edgewatt("unregister", target_id).returncode == 0
    # Let go, it stays readable for exited_retention (a finished run can be looked at).
    ended = edgewatt("summary", target_id)
    assert ended.returncode == 0, ended.stderr
    assert (
        ended.stdout.splitlines()[0]
        == f"target {target_id}: container {container} (unregistered, cgroup)"
    )


def register_with_the_cli(daemon: Any, container: str) -> str:
    """`edgewatt register --container NAME`, which asks the runtime as its user: the id."""
    registered = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "register", "--container", container,
         "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    return registered.stdout.strip()


def test_a_daemon_that_may_not_run_the_runtime_finds_the_container_by_its_id(
    daemon_factory: Any, container: str
) -> None:
    """As under the systemd unit, whose dynamic user may not ask podman: the CLI asks
    the runtime as its user for the id, the daemon finds the cgroup by the runtime's
    naming, and again after a restart."""
    daemon = daemon_factory(interval=0.5, env={"PATH": "/nonexistent"})
    body = {"container": container, "runtime": "podman"}
    status, refused = daemon.call("POST", "/v1/targets", body)
    assert status == 400 and "asks the runtime as you, for its id" in refused["detail"]
    target_id = register_with_the_cli(daemon, container)
    status, target = daemon.call("GET", f"/v1/targets/{target_id}")
    assert target["cgroup"]["path"] == cgroups.cgroup_of(main_pid(container))
    podman("restart", "-t", "0", container)
    wait_for(
        lambda: (
            daemon.call("GET", f"/v1/targets/{target_id}")[1]["cgroup"]["path"]
            == cgroups.cgroup_of(main_pid(container))
            and daemon.call("GET", f"/v1/targets/{target_id}")[1]["state"] == "running"
        )
    )


def test_under_the_units_capabilities_a_containers_own_network_is_counted_by_its_interfaces(
    daemon_factory: Any, container: str
) -> None:
    """The unit grants no CAP_SYS_ADMIN: the container's namespace cannot be entered,
    and its frames are counted from its interfaces instead."""
    daemon = daemon_factory(interval=0.5, prefix=WITHOUT_SYS_ADMIN)
    target_id = register_with_the_cli(daemon, container)
    wait_for(lambda: "cannot be entered" in daemon.log(), timeout=10)
    host = gateway(container)
    http = HttpServer(host, body=100_000)
    podman(
        "exec", container, "sh", "-c",
        f"for i in $(seq 40); do wget -q -O /dev/null http://{host}:{http.port}/; done",
    )  # fmt: skip
    figures = summary(daemon, target_id)
    http.close()
    assert http.connections == 40
    assert figures["network_counts"] == "interface-bytes"
    packets = figures["cgroup"]
    # Frames: each packet's IP bytes and its 14-byte link header, ARP beside them.
    sent_overhead = figures["network_transmit_bytes"] - http.received
    received_overhead = figures["network_receive_bytes"] - http.sent
    assert 54 * packets["network_transmit_packets"] <= sent_overhead
    assert sent_overhead <= 94 * packets["network_transmit_packets"] + 200
    assert 54 * packets["network_receive_packets"] <= received_overhead
    assert received_overhead <= 94 * packets["network_receive_packets"] + 200
