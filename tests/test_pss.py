"""Memory that means what it says: a tree's PSS, its largest
process's RSS and its RSS summed, each under its own name, checked against the
kernel's smaps_rollup read here; never `edgewatt run`'s own fork before the exec."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import procfs
from edgewatt.core.facts.held_fork import HeldFork
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.sampling.contributors import UNCHANGED
from edgewatt.core.sampling.pss import REFRESH_EVERY, ProportionalMemory, parse_rollup
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from edgewatt.core.targets.history import History
from edgewatt.core.targets.row import SAMPLE_FIELDS, SampleRow
from tests.conftest import ROOT, DaemonProcess, free_port, settled, table_with, wait_for

MIB = 2**20
EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]

# A parent touches 200 MiB, then forks 3 children that only read it: every page is
# mapped by 4 processes, copy-on-write, never copied.
SHARED_TREE = """
import os, sys, time
block = bytearray(200 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        total = sum(block[i] for i in range(0, len(block), 4096))  # reads only
        os.write(1, b"ready %d\\n" % total)
        time.sleep(120)
        os._exit(0)
    children.append(pid)
print(" ".join(map(str, children)), flush=True)
time.sleep(120)
"""


def rollup(pid: int) -> tuple[int, int]:
    """(Rss, Pss) bytes as the kernel gives them in /proc/PID/smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        r = parse_rollup(f.read())
    return r.rss, r.pss


def test_a_forked_trees_pss_is_what_smaps_rollup_says_not_the_rss_sum(
    daemon: DaemonProcess, spawn: Any
) -> None:
    parent = spawn(SHARED_TREE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    lines = [parent.stdout.readline() for _ in range(4)]
    children = [int(p) for p in next(x for x in lines if not x.startswith("ready")).split()]
    assert sum(x.startswith("ready 51200") for x in lines) == 3, lines
    members = [parent.pid, *children]
    tid = daemon.register(parent.pid)["id"]
    wait_for(lambda: daemon.value("edgewatt_process_members", edgewatt_target_id=tid) == 4)
    daemon.wait_passes(tid, 3)  # a pass with all four, read whole
    pss = daemon.value("edgewatt_process_memory_pss_bytes", edgewatt_target_id=tid)
    largest = daemon.value("edgewatt_process_memory_rss_largest_bytes", edgewatt_target_id=tid)
    summed = daemon.value("process_memory_usage_bytes", edgewatt_target_id=tid)
    kernel = [rollup(pid) for pid in members]
    kernel_pss = sum(p for _, p in kernel)
    kernel_rss = sum(r for r, _ in kernel)
    # The kernel's own figures first: 4 x ~210 MiB of RSS, ~200 MiB + 4 interpreters held.
    assert kernel_rss > 800 * MIB and 200 * MIB < kernel_pss < 300 * MIB, (kernel_rss, kernel_pss)
    assert pss == pytest.approx(kernel_pss, rel=0.02)
    assert largest == pytest.approx(max(r for r, _ in kernel), rel=0.02)
    assert summed == pytest.approx(kernel_rss, rel=0.02)
    summary = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
    assert summary["memory_pss_peak_bytes"] == pytest.approx(kernel_pss, rel=0.02)
    assert summary["memory_rss_largest_peak_bytes"] == pytest.approx(
        max(r for r, _ in kernel), rel=0.02
    )
    assert summary["memory_rss_peak_bytes"] == pytest.approx(kernel_rss, rel=0.02)
    latest = daemon.call("GET", f"/v1/targets/{tid}")[1]["latest"]
    assert latest["memory_pss_bytes"] == pytest.approx(kernel_pss, rel=0.02)
    # How old the figures are (a dear read waits: tests/test_budgets.py), in both.
    assert 0 <= latest["memory_pss_age_s"] <= latest["time"] - latest["memory_pss_read_at"] + 1e-3
    assert 0 <= summary["memory_pss_age_s"] < 30 * daemon.interval + 1


def _row(rss: int, pss: int | None = None, largest: int | None = None, n: int = 1) -> SampleRow:
    row = dict.fromkeys(SAMPLE_FIELDS, 0)
    row.update(memory_rss_bytes=rss, memory_pss_bytes=pss, memory_rss_largest_bytes=largest)
    return SampleRow(**{**row, "processes": n}, monotonic=0.0)


def _peaks(history: History) -> tuple[Any, ...]:
    """The run's peaks: RSS summed, PSS summed, the largest process's RSS."""
    memory = history.memory
    return memory.rss.high, memory.pss_peak, memory.rss_largest_peak


def test_memory_before_the_roots_exec_is_not_a_peak() -> None:
    """Under `edgewatt run` the samples before the command's exec are its own fork
    (16 MiB of Python): peaks count the samples since that fork's exec, and the
    kernel's high-water mark at exit; an exit's row (no member left) adds none."""
    history = History(capacity=10)
    history.add(_row(16 * MIB, 8 * MIB, 16 * MIB))
    # A process registered while it runs: its memory then is its own.
    assert _peaks(history) == (16 * MIB, 8 * MIB, 16 * MIB)
    history.add(_row(3 * MIB, 2 * MIB, 3 * MIB), execs=1)
    assert _peaks(history) == (3 * MIB, 2 * MIB, 3 * MIB)
    history.add(_row(40 * MIB, 30 * MIB, 40 * MIB, n=0), execs=1)  # the exit's row
    assert _peaks(history) == (3 * MIB, 2 * MIB, 3 * MIB)
    history.end(10.0, rss_peak_bytes=5 * MIB)  # the exec'd program's own high-water mark
    assert _peaks(history) == (5 * MIB, 2 * MIB, 5 * MIB)


def test_an_exec_between_passes_is_seen_at_the_exit(tmp_path: Path) -> None:
    """`true` exec'd and exited between two passes: no live reading after its exec,
    yet the zombie's comm tells the tree its root ran another program."""
    from edgewatt.core.platforms.linux import LinuxPlatform

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        os.read(read, 1)
        os.execv("/bin/true", ["true"])
    os.close(read)
    platform = LinuxPlatform()
    tree = platform.process_tree(
        procfs.ProcHandle(pid), children=True, logical_cpus=platform.logical_cpus()
    )
    try:
        first = tree.sample(procfs.child_pids)
        assert first.root_execs == 0
        os.close(write)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie, as edgewatt run holds it
        with contextlib.suppress(procfs.NoSuchProcess):  # a member still, or departed
            tree.sample(procfs.child_pids)
        assert tree.root_execs == 1
    finally:
        os.waitpid(pid, 0)
        tree.close()


class _State:
    def __init__(self, tid: str, pids: tuple[int, ...], rss: int, at: float = 0.0) -> None:
        self.target = type("T", (), {"id": tid})()
        self.reading = type("R", (), {"pids": pids, "rss_bytes": rss, "time": at})()


def test_smaps_rollup_is_read_again_only_when_the_tree_moved(tmp_path: Path) -> None:
    """Its cost (benchmarks/pss_cost.py): members' rollups are read again when the
    members change, their RSS summed moves by more than 2 %, or every REFRESH_EVERY-th pass."""
    proc = tmp_path / "proc"
    for pid in (11, 12):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "smaps_rollup").write_text(
            f"00-ff ---p 0 00:00 0 [rollup]\nRss:  {pid * 1000} kB\nPss:  {pid * 100} kB\n"
        )
    memory = ProportionalMemory(str(proc))
    first = memory.contribute([_State("t", (11, 12), 23_000_000)])
    assert first == {
        "t": {
            "memory_pss_bytes": 2300 * 1024,
            "memory_rss_largest_bytes": 12_288_000,
            "memory_pss_read_at": 0.0,
        }
    }
    assert memory.reads == 2
    # Moved 1.7 %: kept, and handed out as such (the sampler keeps the last figures).
    assert memory.contribute([_State("t", (11, 12), 23_400_000, 1.0)]) == {"t": UNCHANGED}
    assert memory.reads == 2
    again = memory.contribute([_State("t", (11, 12), 23_500_000, 2.0)])  # 2.2 %: read again
    assert memory.reads == 4
    assert again == {"t": {**first["t"], "memory_pss_read_at": 2.0}}
    assert again["t"] is not first["t"]  # a new mapping for new figures
    memory.contribute([_State("t", (11,), 23_500_000)])  # a member left
    assert memory.reads == 5
    for _ in range(REFRESH_EVERY - 1):  # the passes after the read: kept
        memory.contribute([_State("t", (11,), 23_500_000)])
    assert memory.reads == 5
    memory.contribute([_State("t", (11,), 23_500_000)])  # the REFRESH_EVERY-th pass since
    assert memory.reads == 6


def _fast_daemon(tmp_path: Path) -> DaemonProcess:
    """A daemon of the test's own, passing every 0.2 s (started; the caller stops it)."""
    return DaemonProcess(
        socket=str(tmp_path / "ew.sock"),
        port=free_port(),
        state_dir=tmp_path / "state",
        interval=0.2,
        log_path=tmp_path / "daemon.log",
    ).start()


@pytest.mark.parametrize("placement", ["--no-cgroup", "own cgroup"])
def test_edgewatt_run_true_reports_trues_memory_not_its_own_fork(
    tmp_path: Path, placement: str
) -> None:
    """`edgewatt run -- true` said 16.3 MiB (its own Python fork before the exec, by
    wait4's ru_maxrss and the registration's sample); GNU time says ~1 MiB. In a cgroup
    of its own (the default as root) no pass may see `true` at all: then no figure,
    never the fork's."""
    daemon = _fast_daemon(tmp_path)
    flags = ["--no-cgroup"] if placement == "--no-cgroup" else []
    try:
        out = tmp_path / "run.jsonl"
        result = subprocess.run(
            [*EDGEWATT, "run", "--socket", daemon.socket, "--output", str(out), *flags,
             "--", "true"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    gnu = subprocess.run(["/usr/bin/time", "-f", "%M", "true"], capture_output=True, text=True)
    gnu_kib = int(gnu.stderr.split()[-1])
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    peak = summary["memory_rss_peak_bytes"]
    if not flags:
        assert ", cgroup /" in result.stderr, result.stderr  # it had one
        assert peak is None or peak < 4 * MIB, (peak, gnu_kib)
        return
    # The kernel's high-water mark of `true` itself (taskstats), near GNU time's.
    assert peak is not None and peak < 4 * MIB, (peak, gnu_kib)
    assert abs(peak / 1024 - gnu_kib) < 1024, (peak, gnu_kib)
    assert re.search(r"RSS sum +peak \d", result.stderr), result.stderr
    assert "16." not in re.search(r"RSS sum.*", result.stderr)[0]  # type: ignore[index]


# Touches 300 MiB, then execs itself into a sleeper: the 300 MiB were the command's.
REEXEC = (
    "import os, sys, time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
    "time.sleep(1.5); "
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1)'])"
)


def _run_summary(daemon: DaemonProcess, out: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--output", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    return summary


def test_only_the_wrappers_own_memory_is_left_out_not_a_later_execs(tmp_path: Path) -> None:
    """Memory counts from the first exec of `edgewatt run`'s held fork, not from the
    command's own later exec (which left 10.6 MiB of a 310 MiB run), and a cgroup
    run's held fork is not its memory (`--cgroup -- true` said 17 MiB)."""
    daemon = _fast_daemon(tmp_path)
    try:
        reexec = _run_summary(daemon, tmp_path / "a.jsonl", "--", sys.executable, "-c", REEXEC)
        cgroup = _run_summary(daemon, tmp_path / "b.jsonl", "--cgroup", "--", "true")
    finally:
        daemon.stop()
    assert reexec["memory_rss_peak_bytes"] > 300 * MIB, reexec
    assert reexec["memory_pss_peak_bytes"] > 300 * MIB, reexec
    # true ran between two passes: no sample of its own, and no fork's 17 MiB either.
    peak = cgroup.get("memory_rss_peak_bytes")
    assert peak is None or peak < 4 * MIB, cgroup


def _held_child(*argv: str) -> tuple[int, int]:
    """A fork held before it execs ``argv`` (as `edgewatt run` holds it): its pid and
    the pipe end whose close releases it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        os.read(read, 1)
        os.execv(argv[0], list(argv))
    os.close(read)
    return pid, write


def _settled(pid: int, comm: str) -> None:
    wait_for(lambda: procfs.ProcHandle(pid).stat().comm == comm)


def test_a_held_fork_counts_its_first_exec_only_and_an_execd_process_none() -> None:
    # A held fork that execs a shell, which execs a sleeper: one exec counts.
    pid, release = _held_child("/bin/sh", "-c", "exec sleep 30")
    held = HeldFork(pid)
    try:
        held.note()
        assert held.execs == 0
        os.close(release)
        _settled(pid, "sleep")
        held.note()
        assert held.execs == 1
        held.note()
        assert held.execs == 1
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    # A process that had exec'd when first read (a pid registered, a script's own
    # register()): its later exec is its own program's, and counts none.
    code = "import os, sys; sys.stdin.read(1); os.execv('/bin/sleep', ['sleep', '30'])"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        _settled(proc.pid, os.path.basename(sys.executable)[:15])
        seen = HeldFork(proc.pid)
        seen.note()
        proc.stdin.write(b"x")
        proc.stdin.flush()
        _settled(proc.pid, "sleep")
        seen.note()
        assert seen.execs == 0
    finally:
        proc.kill()
        proc.wait()


def test_an_edge_reads_pss_only_for_a_target_never_read(spawn: Any) -> None:
    """A reread waits for the regular passes, which REFRESH_EVERY counts: edges past
    that many read nothing more; the target's figures are its first read's."""
    child = spawn("import time; time.sleep(60)")
    settled(child.pid)  # its memory as it will stay
    table = table_with(child.pid)
    (target,) = table.running()
    pss = ProportionalMemory()
    parts = Parts(ProcessTrees(LinuxPlatform()), (pss,))
    sampler = Sampler(table, interval=0.1, host_name="h", parts=parts)
    first = sampler.sample_now(target.id)  # its first pass is an edge: read there
    assert pss.reads == 1 and first.processes[0].memory_pss_bytes
    edges = [sampler.sample_now(target.id) for _ in range(REFRESH_EVERY + 5)]
    assert pss.reads == 1
    read_at = first.processes[0].memory_pss_read_at
    assert {e.processes[0].memory_pss_read_at for e in edges} == {read_at}
    for _ in range(REFRESH_EVERY):  # the regular passes reread it at the last
        sampler.sample_once()
    assert pss.reads == 2
    sampler.close()
