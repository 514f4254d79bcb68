"""ProcessTree against live processes: members that did not run are not read again
(their io, descriptors and sockets are carried over), and any run brings a full read."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgewatt.core.facts import procfs
from edgewatt.core.facts.cpu_rate import cpu_shares
from edgewatt.core.facts.network import NetworkAccounting
from edgewatt.core.facts.process import RECHECK_EVERY, ProcessTree, TreeReading
from tests.conftest import wait_for

# A single-threaded process that waits on stdin; each line it reads makes it open
# one more descriptor: a file ("file") or a TCP connection to a port ("connect PORT").
WAITER = """
import socket, sys
kept = []
for line in sys.stdin:
    if line.startswith("connect"):
        kept.append(socket.create_connection(("127.0.0.1", int(line.split()[1]))))
    else:
        kept.append(open(sys.executable, "rb"))
    print("done", flush=True)
"""


@pytest.fixture
def waiter() -> Iterator[subprocess.Popen]:
    child = subprocess.Popen(
        [sys.executable, "-c", WAITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield child
    child.kill()
    child.wait()


def command(child: subprocess.Popen, line: str) -> None:
    """Have the child open a descriptor; returns once it waits on stdin again."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()
    assert child.stdout.readline() == "done\n"
    handle = procfs.ProcHandle(child.pid)
    wait_for(lambda: handle.stat().state == "S", step=0.005)
    handle.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """How often each pid's io and descriptor count were read."""
    counts: Counter = Counter()
    io, fd_count = procfs.ProcHandle.io, procfs.ProcHandle.fd_count

    def counted_io(self: procfs.ProcHandle) -> tuple[int, int] | None:
        counts["io", self.pid] += 1
        return io(self)

    def counted_fd_count(self: procfs.ProcHandle) -> int | None:
        counts["fds", self.pid] += 1
        return fd_count(self)

    monkeypatch.setattr(procfs.ProcHandle, "io", counted_io)
    monkeypatch.setattr(procfs.ProcHandle, "fd_count", counted_fd_count)
    return counts


def tree_of(pid: int) -> ProcessTree:
    return ProcessTree(procfs.ProcHandle(pid), children=True, logical_cpus=1)


def no_children(pid: int) -> list[int]:
    return []


def test_a_waiting_member_is_read_once_then_carried_over(
    waiter: subprocess.Popen, reads: Counter
) -> None:
    command(waiter, "file")  # started and settled: from here it only waits
    tree = tree_of(waiter.pid)
    first = tree.sample(no_children)
    assert first.idle_pids == frozenset()
    later = [tree.sample(no_children) for _ in range(RECHECK_EVERY - 2)]
    assert all(r.idle_pids == {waiter.pid} for r in later)
    assert reads["io", waiter.pid] == reads["fds", waiter.pid] == 1
    assert [r.open_fds for r in later] == [first.open_fds] * len(later)
    # The safety net: every RECHECK_EVERY-th reading reads everything all the same.
    assert tree.sample(no_children).idle_pids == frozenset()
    assert reads["io", waiter.pid] == reads["fds", waiter.pid] == 2
    tree.close()


def test_a_quiet_tree_costs_its_change_check_only(
    waiter: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone member that did not run: its scheduler counters are read (the same
    bytes), nothing else is read or derived and no reading is built; the reading it had
    is dated anew. A run brings a new reading, and every RECHECK_EVERY-th pass reads
    its stat (and all) the same."""
    command(waiter, "file")
    stats: list[int] = []
    stat = procfs.ProcHandle.stat
    monkeypatch.setattr(procfs.ProcHandle, "stat", lambda h: stats.append(h.pid) or stat(h))
    tree = tree_of(waiter.pid)
    tree.sample(no_children)
    quiet = tree.sample(no_children)
    read = len(stats)
    times = [quiet.time]
    for _ in range(RECHECK_EVERY - 3):
        assert tree.sample(no_children) is quiet
        times.append(quiet.time)
    assert times == sorted(times) and len(set(times)) == len(times)
    assert len(stats) == read  # no stat read while quiet
    assert quiet.cpu_utilization == 0.0 and quiet.idle_pids == {waiter.pid}
    rechecked = tree.sample(no_children)  # the RECHECK_EVERY-th reading
    assert rechecked is not quiet and len(stats) == read + 1
    assert tree.sample(no_children) is rechecked  # quiet again
    command(waiter, "file")
    ran = tree.sample(no_children)
    assert ran is not rechecked and ran.open_fds == rechecked.open_fds + 1
    assert ran.idle_pids == frozenset()
    tree.close()


def test_a_member_that_ran_is_read_again(waiter: subprocess.Popen, reads: Counter) -> None:
    command(waiter, "file")
    tree = tree_of(waiter.pid)
    tree.sample(no_children)
    before = tree.sample(no_children)
    assert before.idle_pids == {waiter.pid}
    command(waiter, "file")  # one more descriptor, then waiting again
    after = tree.sample(no_children)
    assert after.idle_pids == frozenset()
    assert after.open_fds == before.open_fds + 1 == procfs.fd_count(waiter.pid)
    assert reads["io", waiter.pid] == 2
    assert tree.sample(no_children).idle_pids == {waiter.pid}
    tree.close()


def test_a_threaded_member_is_always_read(reads: Counter) -> None:
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start()"
    child = subprocess.Popen([sys.executable, "-c", code])  # two threads, both waiting
    try:
        tree = tree_of(child.pid)
        wait_for(lambda: tree.sample(no_children).threads == 2, step=0.01)
        before = reads["io", child.pid]
        readings = [tree.sample(no_children) for _ in range(3)]
        assert all(r.idle_pids == frozenset() for r in readings)
        assert reads["io", child.pid] == before + 3
        tree.close()
    finally:
        child.kill()
        child.wait()


def test_sockets_of_a_waiting_member_are_found_once_it_connects(waiter: subprocess.Popen) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accounting = NetworkAccounting()
    tree = tree_of(waiter.pid)
    scans: Counter = Counter()
    listing = accounting._socket_inodes

    def counted(pid: int) -> set[int] | None:
        scans[pid] += 1
        return listing(pid)

    accounting._socket_inodes = counted  # type: ignore[method-assign]

    def account(reading: TreeReading) -> tuple[int, int] | None:
        return accounting.sample({"w": reading.pids}, idle=reading.idle_pids)["w"]

    try:
        command(waiter, "file")
        assert account(tree.sample(no_children)) == (0, 0)
        assert account(tree.sample(no_children)) == (0, 0)
        assert scans[waiter.pid] == 1  # waiting: its descriptors were not listed again
        command(waiter, f"connect {listener.getsockname()[1]}")
        peer, _ = listener.accept()
        peer.sendall(b"x" * 5000)
        reading = tree.sample(no_children)
        assert reading.idle_pids == frozenset()
        # The peer's bytes wait in the receive queue: received by the kernel, unread.
        # Sent: nothing but the SYN, which the kernel counts as one byte acked.
        assert account(reading) in ((0, 5000), (1, 5000))
        # Listed for this pass, once more before the dump its new socket asks for (only
        # inodes still held are dumped: one closed meanwhile costs none), and once more
        # as the target's members are, to see whether the other end of this new
        # loopback connection is theirs (it is this test's).
        assert scans[waiter.pid] == 4
        peer.close()
    finally:
        tree.close()
        accounting.close()
        listener.close()


def test_a_descendant_gone_between_its_reads_leaves_the_target_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = subprocess.Popen(["sleep", "60"])
    io = procfs.ProcHandle.io

    def gone_child(self: procfs.ProcHandle) -> tuple[int, int] | None:
        if self.pid == child.pid:
            raise procfs.NoSuchProcess(self.pid)
        return io(self)

    monkeypatch.setattr(procfs.ProcHandle, "activity", lambda self: None)  # read each time
    try:
        tree = tree_of(os.getpid())
        with_child = tree.sample(lambda pid: [child.pid] if pid == os.getpid() else [])
        assert child.pid in with_child.pids
        monkeypatch.setattr(procfs.ProcHandle, "io", gone_child)
        without = tree.sample(lambda pid: [child.pid] if pid == os.getpid() else [])
        assert without.pids == (os.getpid(),)
        assert tree.lost_members
        tree.close()
    finally:
        child.kill()
        child.wait()


def test_activity_is_none_where_the_kernel_keeps_no_scheduler_counters(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(
        "7 (p) S 1 7 7 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 100 4096 10 0 0 0\n"
    )
    (tmp_path / "7" / "schedstat").write_text("0 0 0\n")
    handle = procfs.ProcHandle(7, str(tmp_path))
    assert handle.activity() is None
    handle.close()
    (tmp_path / "7" / "schedstat").unlink()
    handle = procfs.ProcHandle(7, str(tmp_path))
    assert handle.activity() is None
    handle.close()


def test_activity_changes_only_when_the_thread_ran(waiter: subprocess.Popen) -> None:
    command(waiter, "file")
    handle = procfs.ProcHandle(waiter.pid)
    first = handle.activity()
    assert first is not None and int(first.split()[0]) > 0  # nanoseconds run so far
    assert handle.activity() == first
    command(waiter, "file")
    assert handle.activity() != first
    handle.close()


def test_cpu_shares_split_the_whole_by_mode_and_add_up_to_it() -> None:
    # 0.3 s user and 0.1 s system over 0.5 s on 4 CPUs: 0.2 of all cores, 3 to 1.
    assert cpu_shares((0.3, 0.1), 0.5, 4) == pytest.approx((0.15, 0.05))
    # A split moved between the reads (/proc and the exit records split a reaped
    # member's time differently): one mode goes back, the whole still went up 0.2 s.
    # Nothing negative; the whole goes to the mode that grew.
    assert cpu_shares((-0.1, 0.3), 1.0, 2) == (0.0, pytest.approx(0.1))
    assert cpu_shares((0.0, 0.0), 1.0, 2) == (0.0, 0.0)
    assert cpu_shares((-0.2, 0.1), 1.0, 2) == (0.0, 0.0)  # never below nothing


def test_the_tree_reads_its_utilization_by_mode_from_the_kernels_counters() -> None:
    # A child spending most of its time in the kernel (reads of /dev/zero): the shares
    # are in proportion to what /proc/PID/stat's utime and stime grew by between two
    # reads, and add up to the tree's utilization.
    burner = "import os\nf = os.open('/dev/zero', os.O_RDONLY)\nwhile True: os.read(f, 1 << 22)"
    child = subprocess.Popen([sys.executable, "-c", burner])
    try:
        tree = ProcessTree(procfs.ProcHandle(child.pid), children=True, logical_cpus=2)
        assert tree.sample(lambda pid: []).cpu_mode_utilization is None  # no interval yet
        first, second = wait_for(lambda: _two_reads_apart(tree), timeout=20)
        assert second.cpu_mode_utilization is not None
        user, system = second.cpu_mode_utilization
        assert user + system == pytest.approx(second.cpu_utilization)
        d_user = second.cpu_user_s - first.cpu_user_s
        d_system = second.cpu_system_s - first.cpu_system_s
        assert system / (user + system) == pytest.approx(d_system / (d_user + d_system))
    finally:
        child.kill()
        child.wait()


def _two_reads_apart(tree: ProcessTree) -> tuple[TreeReading, TreeReading] | None:
    """Two consecutive readings between which the kernel counted system time."""
    first = tree.sample(lambda pid: [])
    time.sleep(0.2)
    second = tree.sample(lambda pid: [])
    return (first, second) if second.cpu_system_s > first.cpu_system_s else None
