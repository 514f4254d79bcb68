"""`edgewatt run` of a command no pass sees alive: its largest process's peak RSS is the
kernel's record at that process's exit (taskstats, else wait4's ru_maxrss), with a daemon
and in-process, in a cgroup of its own or not; the command's own figure, never the
peak of `edgewatt run`'s fork before the exec; "not measured" only with the reason.

Each figure is checked against the kernel's own count, as the command read it: the
peak its child reached, from the command's wait4 of that child (ru_maxrss, read at the
same instant of the exit as the taskstats record: /proc's VmHWM sums the per-CPU
counters, and differs from both by a few pages)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.status import human_bytes
from tests.conftest import ROOT, SYSTEM_PYTHON
from tests.test_api import NOBODY

# A child that touches argv[1] MiB and exits (the command's largest process); the
# command prints the child's peak RSS (KiB) as its wait4 read it.
PEAK = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    x = bytearray(int(sys.argv[1]) << 20)\n"
    "    x[::4096] = b'1' * len(x[::4096])\n"
    "    os._exit(0)\n"
    "print('peak', os.wait4(pid, 0)[2].ru_maxrss, flush=True)\n"
)


SOURCES = {
    "cgroup": "at exit: the kernel's exit records (taskstats)",
    "process": "at exit: the daemon's exit records (taskstats)",
    "in-process": "at exit: the kernel's exit records (taskstats)",
}


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    argv = kwargs.pop("python", sys.executable)
    return subprocess.run(
        [argv, "-m", "edgewatt.cli", "run", *args],
        capture_output=True, text=True, timeout=60, **{"cwd": ROOT, **kwargs},
    )  # fmt: skip


def _peaks(stdout: str) -> list[int]:
    return [int(kib) * 1024 for kib in re.findall(r"^peak (\d+)$", stdout, re.M)]


def _summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().splitlines()[-1])


@pytest.mark.parametrize("where", ["cgroup", "process", "in-process"])
def test_a_short_runs_largest_peak_rss_is_its_exit_records(
    where: str, daemon_factory: Any, tmp_path: Path
) -> None:
    """A one-process command, a shell's 300 children and an orphan that outlives the
    shell: the largest peak is the largest process's own, to the byte."""
    sock = daemon_factory(interval=5.0).socket if where != "in-process" else str(tmp_path / "x")
    mode = ["--no-cgroup"] if where == "process" else []
    commands = {
        "one": [sys.executable, "-c", PEAK, "24"],
        "tree": ["sh", "-c", 'for i in $(seq 300); do /bin/true; done; "$0" -c "$1" 20',
                 sys.executable, PEAK],
        "orphan": ["sh", "-c", '"$0" -c "$1" 28 &', sys.executable, PEAK],
    }  # fmt: skip
    for name, command in commands.items():
        out = tmp_path / f"{name}.jsonl"
        result = _run([*mode, "--socket", sock, "--output", str(out), "--", *command])
        assert result.returncode == 0, result.stderr
        (peak,) = _peaks(result.stdout)
        summary = _summary(out)
        assert summary["memory_rss_largest_peak_bytes"] == peak, (name, result.stderr)
        # The daemon's where it heard every process's (a process target's members);
        # its cgroup's records are its root's alone: there wait4 of the root, whose
        # reaped children hold the largest.
        assert summary["memory_rss_largest_source"] == SOURCES[where], summary
        shown = f"peak RSS {peak / 2**20:.1f} MiB (of the largest process; "
        assert shown in result.stderr, result.stderr


def test_in_process_without_taskstats_wait4_is_the_commands_or_a_bound(public_dir: Path) -> None:
    """A normal user (no CAP_NET_ADMIN: no exit records) with no daemon: wait4's peak,
    where it is above the peak of `edgewatt run`'s fork before the exec; below it, only
    a bound, said so, never the fork's figure as the command's."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)}
    out = public_dir / "big.jsonl"
    out.touch()
    out.chmod(0o666)
    nobody = {"user": NOBODY, "group": NOBODY, "env": env, "cwd": "/", "python": SYSTEM_PYTHON}
    socket = str(public_dir / "none.sock")
    result = _run(["--socket", socket, "--output", str(out), "--", SYSTEM_PYTHON, "-c", PEAK,
                   "64"], **nobody)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (peak,) = _peaks(result.stdout)
    summary = _summary(out)
    assert summary["memory_rss_largest_peak_bytes"] == peak, result.stderr
    assert summary["memory_rss_largest_source"] == (
        "at exit: wait4 (each reaped process's ru_maxrss)"
    )
    result = _run(["--socket", socket, "--", "/bin/true"], **nobody)
    assert result.returncode == 0, result.stderr
    assert "largest " not in result.stderr, result.stderr
    rss = re.search(r"^  RSS sum +(.*)$", result.stderr, re.M)
    assert rss is not None, result.stderr
    assert re.fullmatch(
        r"not measured: no pass saw a process of it alive \(it ran [\d.]+ s\); each "
        r"process's peak RSS at its exit is at most [\d.]+ MiB \(wait4, which counts "
        r"edgewatt run's fork before the exec; taskstats: Operation not permitted\)",
        rss[1],
    ), rss[1]


def test_a_process_targets_sample_rows_hold_the_commands_memory_not_the_forks(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """`--no-cgroup` with a daemon, a command shorter than a pass: the only pass that read
    a process of it alive read `edgewatt run`'s fork before the exec (17-19 MiB of
    Python). The file's sample rows, the daemon's exit sample and the summary hold the
    command's own peak RSS, its exit record's, as the table says."""
    daemon = daemon_factory(interval=5.0)
    out = tmp_path / "true.jsonl"
    result = _run(["--no-cgroup", "--socket", daemon.socket, "--output", str(out), "--",
                   "/bin/true"])  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    summary = rows[-1]
    peak = summary["memory_rss_largest_peak_bytes"]
    assert summary["memory_rss_largest_source"] == SOURCES["process"]
    # A sample row where the run's last reading was a new pass of the daemon's (a 12 ms
    # command may end within the daemon's shortest interval between forced passes of
    # its baseline: then none); the daemon's exit sample below is there either way.
    samples = [row for row in rows if row["type"] == "sample"]
    assert all(row["memory_rss_bytes"] == peak for row in samples), rows
    # No PSS was read of the command alive: none, never the fork's 9 MiB read first.
    assert all("memory_pss_bytes" not in row for row in samples), rows
    assert summary["memory_rss_peak_bytes"] == peak
    (target,) = daemon.call("GET", "/v1/targets")[1]["targets"]
    kept = daemon.call("GET", f"/v1/targets/{target['id']}/samples")[1]["samples"]
    assert kept[-1]["memory_rss_bytes"] == peak and kept[-1]["processes"] == 0
    assert kept[-1]["memory_pss_bytes"] is None, kept[-1]
    assert target["command"] == "true"
    mib = human_bytes(peak)  # as the table writes it
    assert f"peak RSS {mib} (of the largest process; " in result.stderr, result.stderr
    assert re.search(rf"^  RSS sum +peak {mib} ", result.stderr, re.M), result.stderr


# The command under /usr/bin/time -v: it counts the taskstats sockets (NETLINK_GENERIC)
# `edgewatt run`, its parent's parent, holds, and touches 40 MiB.
COUNT_SOCKETS = (
    "import os\n"
    "run = int(open(f'/proc/{os.getppid()}/stat').read().rpartition(')')[2].split()[1])\n"
    "generic = {line.split()[-1] for line in open('/proc/net/netlink').readlines()[1:]\n"
    "           if line.split()[1] == '16'}\n"
    "held = {os.readlink(f'/proc/{run}/fd/{fd}')[8:-1] for fd in os.listdir(f'/proc/{run}/fd')\n"
    "        if os.readlink(f'/proc/{run}/fd/{fd}').startswith('socket:')}\n"
    "print('taskstats sockets', len(held & generic), flush=True)\n"
    "x = bytearray(40 << 20)\n"
    "x[::4096] = b'1' * len(x[::4096])\n"
)


@pytest.mark.parametrize("where", ["cgroup", "process", "in-process"])
def test_with_a_daemon_run_opens_no_listener_and_the_peak_is_times(
    where: str, daemon_factory: Any, tmp_path: Path
) -> None:
    """The daemon hears every exit record and keeps a process target's members' peaks:
    `edgewatt run` opens a taskstats listener of its own only without one, or for a
    cgroup (an exit record does not name its cgroup: the daemon keeps the first
    process's alone), and the largest peak is /usr/bin/time -v's."""
    sock = daemon_factory(interval=5.0).socket if where != "in-process" else str(tmp_path / "x")
    mode = ["--no-cgroup"] if where == "process" else []
    out = tmp_path / "time.jsonl"
    result = _run([*mode, "--socket", sock, "--output", str(out), "--", "/usr/bin/time", "-v",
                   sys.executable, "-c", COUNT_SOCKETS])  # fmt: skip
    assert result.returncode == 0, result.stderr
    held = re.findall(r"^taskstats sockets (\d+)$", result.stdout, re.M)
    assert held == (["0"] if where == "process" else ["1"]), result.stdout
    kib = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    assert kib is not None, result.stderr
    summary = _summary(out)
    assert summary["memory_rss_largest_peak_bytes"] == int(kib[1]) * 1024, result.stderr
    assert summary["memory_rss_largest_source"] == SOURCES[where], summary
