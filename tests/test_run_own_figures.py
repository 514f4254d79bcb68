"""`edgewatt run`'s table and --output hold the command's own figures: its disk bytes
as the kernel counted them, however short the run; its network bytes under one name,
the host's apart under "host"; memory "not measured" only with the reason."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from edgewatt.cli.report import summary_table
from tests.conftest import ROOT, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]

# Writes 3 MiB to a file (whole pages: the kernel counts the pages it dirties), then
# prints its own /proc/self/io, the kernel's count, on stdout (a pipe: no disk write),
# and exits at once: an interpreter's shutdown may read from storage after the print
# (a module loaded late, its pages evicted from the cache).
WRITES = (
    "import os, sys\n"
    "with open(sys.argv[1], 'wb') as f: f.write(b'x' * (3 << 20))\n"
    "print(open('/proc/self/io').read(), flush=True)\n"
    "os._exit(0)\n"
)

# Sends 2 MiB to the peer on port argv[1], then holds the connection until the peer
# closes it (the test closes it once the daemon has counted the bytes).
SENDS = (
    "import socket, sys\n"
    "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
    "s.sendall(b'y' * (2 << 20))\n"
    "while s.recv(4096): pass\n"
)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGEWATT, "run", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def _rows(stderr: str) -> dict[str, str]:
    """The table's rows by label (the first of each), its title and the host part left out."""
    rows: dict[str, str] = {}
    for line in stderr.splitlines():
        match = re.match(r"  (\S[\w ]*?\S)  +(\S.*)$", line)
        if match and not line.startswith("    "):
            rows.setdefault(match[1], match[2])
    return rows


def _io(stdout: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^(\w+): (\d+)$", stdout, re.M)}


def _summary(path: Path) -> dict[str, Any]:
    return [json.loads(line) for line in path.read_text().splitlines()][-1]


def test_a_short_runs_disk_bytes_are_the_kernels_with_or_without_a_daemon(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """A command that lives a few ms: no pass sees it, wait4 (and the exit records)
    count its bytes; the table and the file hold them, a process target's too."""
    daemon = daemon_factory(interval=1.0)
    sockets = {"daemon": daemon.socket, "none": str(tmp_path / "none.sock")}
    for name, path in sockets.items():
        out = tmp_path / f"{name}.jsonl"
        result = _run(["--no-cgroup", "--socket", path, "--output", str(out), "--",
                       sys.executable, "-c", WRITES, str(tmp_path / f"{name}.bin")])  # fmt: skip
        assert result.returncode == 0, result.stderr
        io = _io(result.stdout)
        summary = _summary(out)
        assert summary["disk_write_bytes"] == io["write_bytes"] - io["cancelled_write_bytes"]
        assert summary["disk_read_bytes"] == io["read_bytes"]
        assert io["write_bytes"] >= 3 << 20
        assert _rows(result.stderr)["disk"].startswith(
            f"read {_human(io['read_bytes'])}, written 3.0 MiB (to and from storage"
        ), result.stderr


def _human(n: int) -> str:
    from edgewatt.cli.status import human_bytes

    return human_bytes(n)


def test_the_commands_network_row_is_its_own_and_the_hosts_is_apart(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """The bytes a peer received from the command, in the row named network; the host's
    only under "host", after the command's figures."""
    daemon = daemon_factory(interval=0.2)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = []

    def peer() -> None:
        conn, _ = server.accept()
        total = 0
        while total < 2 << 20 and (chunk := conn.recv(65536)):
            total += len(chunk)
        received.append(total)
        # Open until the daemon has counted the bytes (a pass sees the connection).
        wait_for(lambda: _target_sent(daemon) >= total, timeout=30)
        conn.close()

    thread = threading.Thread(target=peer)
    thread.start()
    out = tmp_path / "net.jsonl"
    result = _run(["--no-cgroup", "--socket", daemon.socket, "--interval", "0.2", "--output",
                   str(out), "--", sys.executable, "-c", SENDS, str(port)])  # fmt: skip
    thread.join()
    server.close()
    assert result.returncode == 0, result.stderr
    assert received == [2 << 20]
    summary = _summary(out)
    # The bytes the peer received, with the SYN's and the FIN's sequence numbers (the
    # kernel's bytes_acked counts them).
    assert summary["network_transmit_bytes"] - (2 << 20) in (0, 1, 2)
    assert "total_network_bytes_sent" not in summary  # the host's, named as such
    assert "host_network_bytes_sent" in summary
    # Each sample row: the command's own bytes under network_, the host's under host_.
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    units = lines[0]["units"]
    assert "the command's own" in units["network_bytes_sent"]
    assert "host-wide" in units["host_network_bytes_sent"]
    samples = [row for row in lines if row["type"] == "sample"]
    assert all("host_network_bytes_sent" in row for row in samples), samples
    assert sum(row.get("network_bytes_sent", 0) for row in samples) - (2 << 20) in (0, 1, 2)
    rows = _rows(result.stderr)
    # A process target's: at least (a connection between two passes would escape it).
    assert re.match(
        r"sent at least 2\.0 MiB, received at least [012] B \(TCP bytes, the command's",
        rows["network"],
    )
    lines = result.stderr.splitlines()
    host = lines.index("  host (every process on the device, not the command's figures):")
    assert re.match(r"    network  sent .*, received .* \(every interface but loopback\)$",
                    lines[host + 1])  # fmt: skip
    assert all("host" not in line for line in lines[1:host] if "  network" in line)


def _target_sent(daemon: Any) -> int:
    """The most any target of the daemon has sent, as its summary counts it now."""
    _, listed = daemon.call("GET", "/v1/targets")
    sent = [
        daemon.call("GET", f"/v1/targets/{t['id']}/summary")[1].get("network_transmit_bytes")
        for t in listed["targets"]
    ]
    return max((s or 0 for s in sent), default=0)


def test_a_monitors_host_bytes_are_never_in_the_commands_rows() -> None:
    """A summary with the host's bytes and the command's: one row named network (the
    command's), the host's apart; a run sampled in-process says why it has no own."""
    both = {
        "network_transmit_bytes": 1024,
        "network_receive_bytes": 0,
        "network_counts": "ip-bytes",
        "host_network_bytes_sent": 4096,
        "host_network_bytes_recv": 1 << 20,
    }
    lines = summary_table(both, "t").splitlines()
    assert "  network  sent 1.0 KiB, received 0 B (IP bytes of every connection, headers " \
        "included, across its boundary)" in lines  # fmt: skip
    assert lines[-2:] == [
        "  host (every process on the device, not the command's figures):",
        "    network  sent 4.0 KiB, received 1.0 MiB (every interface but loopback)",
    ]
    alone = summary_table({"host_network_bytes_sent": 1, "host_network_bytes_recv": 2}, "t")
    assert "  network  not measured: the daemon counts a command's own bytes" in alone


def test_a_memory_figure_not_measured_says_why(daemon_factory: Any, tmp_path: Path) -> None:
    """A command no pass saw alive (/bin/true): its memory rows are a figure or "not
    measured" with the reason, never bare; a process target's peak
    RSS is the kernel's exit record's."""
    daemon = daemon_factory(interval=1.0)
    for mode in ([], ["--no-cgroup"]):
        result = _run([*mode, "--socket", daemon.socket, "--", "/bin/true"])
        assert result.returncode == 0, result.stderr
        rows = _rows(result.stderr)
        for label in ("peak PSS", "RSS sum"):
            shown = rows.get(label, "")
            assert not re.fullmatch(r"-|not measured", shown), result.stderr
            if shown.startswith("not measured"):
                assert shown.startswith("not measured: no pass saw a process of it alive (it "
                                        "ran "), result.stderr  # fmt: skip
        if mode:  # the exit record's peak RSS of its one process
            assert re.match(r"peak RSS [\d.]+ (KiB|MiB) \(of the largest", rows["largest"])
