"""One test per /proc fact: captured text where the format matters, the live kernel
where the behaviour does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgewatt.core.facts import procfs, system
from tests.conftest import wait_for

# Real /proc/PID/stat of a process whose comm holds a space and a parenthesis.
STAT = (
    "4242 (tricky) name) S 4000 4242 4000 34816 4242 4194304 1200 0 3 0 "
    "350 120 40 15 20 0 7 0 987654 123456789 2500 18446744073709551615 1 1 0 0 0 0 0 "
    "16781312 16386 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
)

IO = (
    "rchar: 9999\nwchar: 8888\nsyscr: 10\nsyscw: 11\n"
    "read_bytes: 4096\nwrite_bytes: 12288\ncancelled_write_bytes: 0\n"
)


def test_parse_stat_fields() -> None:
    s = procfs.parse_stat(STAT)
    assert s.comm == "tricky) name"
    assert (s.state, s.ppid) == ("S", 4000)
    assert (s.utime, s.stime, s.cutime, s.cstime) == (350, 120, 40, 15)
    assert s.num_threads == 7
    assert s.start_ticks == 987654
    assert s.vsize == 123456789
    assert s.rss_pages == 2500


def test_parse_io_uses_storage_bytes() -> None:
    assert procfs.parse_io(IO) == (4096, 12288)


def _fake_proc(tmp_path: Path, pid: int, stat: str) -> Path:
    (tmp_path / str(pid)).mkdir(parents=True)
    (tmp_path / str(pid) / "stat").write_text(stat)
    (tmp_path / str(pid) / "io").write_text(IO)
    return tmp_path


def test_handle_refuses_a_pid_with_another_start_time(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 4242, STAT)
    handle = procfs.ProcHandle(4242, str(proc), expect_start=987654)
    assert handle.start_ticks == 987654 and handle.io() == (4096, 12288)
    handle.close()
    with pytest.raises(procfs.NoSuchProcess, match="pid reused"):
        procfs.ProcHandle(4242, str(proc), expect_start=111)


def test_open_handle_fails_after_exit_even_if_pid_reused() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    handle = procfs.ProcHandle(child.pid)
    assert handle.stat().ppid == os.getpid()
    child.kill()
    child.wait()
    with pytest.raises(procfs.NoSuchProcess):
        handle.stat()
    handle.close()


def test_executable_name_and_owner_of_self() -> None:
    handle = procfs.ProcHandle(os.getpid())
    exe = procfs.executable_name(os.getpid(), handle.stat().comm)
    assert exe == os.path.basename(os.path.realpath(sys.executable))
    assert handle.refuses(os.getuid()) is None
    assert handle.refuses(12345) == (
        f"pid {os.getpid()} belongs to uid {os.getuid()}, you are uid 12345"
    )
    handle.close()


def test_an_executable_name_that_is_not_utf8_is_replaced_not_kept_as_surrogates(
    tmp_path: Path,
) -> None:
    # The kernel keeps 15 bytes of the name in comm; the invalid byte comes after.
    exe = os.path.join(os.fsencode(tmp_path), b"a-long-program-name-\xff")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    child = subprocess.Popen([exe, "30"])
    try:
        handle = procfs.ProcHandle(child.pid)
        name = handle.executable
        handle.close()
        assert name == "a-long-program-name-\ufffd"  # never a lone surrogate
    finally:
        child.kill()
        child.wait()


def test_fd_count_follows_open_descriptors() -> None:
    before = procfs.fd_count(os.getpid())
    r, w = os.pipe()
    try:
        assert procfs.fd_count(os.getpid()) == before + 2
    finally:
        os.close(r)
        os.close(w)
    assert procfs.fd_count(os.getpid()) == before


@pytest.mark.skipif(not procfs.has_children_files(), reason="kernel without CONFIG_PROC_CHILDREN")
def test_children_files_list_direct_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in procfs.child_pids(os.getpid())
        assert procfs.child_pids(child.pid) == []
    finally:
        child.kill()
        child.wait()


def _fake_process(root: Path, pid: int, ppid: int) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text(f"{pid} (p{pid}) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0\n")


def test_parent_index_lists_only_after_a_process_was_created(tmp_path: Path) -> None:
    (tmp_path / "loadavg").write_text("0.00 0.00 0.00 1/80 101\n")
    _fake_process(tmp_path, 1, 0)
    _fake_process(tmp_path, 100, 1)
    _fake_process(tmp_path, 101, 100)
    index = procfs.ParentIndex(str(tmp_path))
    assert index.children() == {0: [1], 1: [100], 100: [101]}
    assert (index.listings, index.stat_reads) == (1, 3)
    # No new pid handed out: the last listing stands.
    assert index.children() == {0: [1], 1: [100], 100: [101]}
    assert index.listings == 1
    # 100 exits and its pid is reused at once by a child of 1; 101 is re-parented to 1.
    # Only the new entry (new inode) and the orphan (its parent's entry changed) are read.
    _fake_process(tmp_path, 99999, 1)  # made while the old one exists: a new inode
    shutil.rmtree(tmp_path / "100")
    (tmp_path / "99999" / "stat").write_text("100 (p100) S 1 1 1 0 -1 0 0 0 0 0 0 0 0\n")
    (tmp_path / "99999").rename(tmp_path / "100")
    (tmp_path / "101" / "stat").write_text("101 (p101) S 1 1 1 0 -1 0 0 0 0 0 0 0 0\n")
    (tmp_path / "loadavg").write_text("0.00 0.00 0.00 1/80 100\n")
    assert index.children() == {0: [1], 1: [100, 101]}
    assert (index.listings, index.stat_reads) == (2, 5)
    # Asked for a fresh listing (a tree lost a member): listed, nothing re-read.
    assert index.children(fresh=True) == {0: [1], 1: [100, 101]}
    assert (index.listings, index.stat_reads) == (3, 5)


def test_parent_index_follows_reparenting_on_the_live_kernel() -> None:
    index = procfs.ParentIndex()
    # A child whose own child outlives it: the grandchild is re-parented to init (or a
    # subreaper) when the middle process exits.
    middle = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time;"
         "p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    grandchild = int(middle.stdout.readline())  # type: ignore[union-attr]
    try:
        first = index.children()
        assert middle.pid in first[os.getpid()]
        assert first[middle.pid] == [grandchild]
        middle.kill()
        middle.wait()

        def new_parent() -> int | None:
            listing = index.children(fresh=True)
            return next((p for p, c in listing.items() if grandchild in c), None)

        assert wait_for(new_parent) != middle.pid
        assert middle.pid not in index.children(fresh=True)
    finally:
        middle.kill()
        middle.wait()
        os.kill(grandchild, signal.SIGKILL)


def test_boot_facts() -> None:
    assert len(procfs.boot_id()) == 36
    assert 0 < procfs.boot_time() < os.path.getmtime("/proc/self/stat") + 1e9
    assert procfs.pid_max() >= 32768


# -- host figures from captured files ---------------------------------------------

PROC_STAT = (
    "cpu  1000 50 300 8000 100 20 30 5 0 0\n"
    "cpu0 500 25 150 4000 50 10 15 2 0 0\n"
    "cpu1 500 25 150 4000 50 10 15 3 0 0\n"
    "intr 12345\nbtime 1700000000\n"
)
MEMINFO = (
    "MemTotal:       16000000 kB\nMemFree:         4000000 kB\n"
    "MemAvailable:    9000000 kB\nBuffers:          500000 kB\n"
    "Cached:          3000000 kB\nSReclaimable:     200000 kB\n"
)
NET_DEV = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
    "    lo:  123456     100    0    0    0     0          0         0   123456     100    0 "
    "   0    0     0       0          0\n"
    "  eth0: 987654321  5000    0    0    0     0          0         0 12345678    4000    0 "
    "   0    0     0       0          0\n"
)


@pytest.fixture
def host_proc(tmp_path: Path) -> str:
    (tmp_path / "stat").write_text(PROC_STAT)
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "dev").write_text(NET_DEV)
    return str(tmp_path)


def test_host_cpu_seconds_by_mode(host_proc: str) -> None:
    cpu = system.read_cpu(host_proc)
    hz = procfs.CLOCK_TICKS
    assert cpu.logical_cpus == 2
    assert cpu.seconds_by_mode == {
        "user": 1000 / hz,
        "nice": 50 / hz,
        "system": 300 / hz,
        "idle": 8000 / hz,
        "iowait": 100 / hz,
        "interrupt": 50 / hz,
        "steal": 5 / hz,
    }
    assert cpu.busy_seconds == pytest.approx(1405 / hz)


def test_host_memory_states_add_up(host_proc: str) -> None:
    mem = system.read_memory(host_proc)
    assert mem.total_bytes == 16_000_000 * 1024
    assert mem.bytes_by_state == {
        "used": 8_300_000 * 1024,
        "free": 4_000_000 * 1024,
        "buffers": 500_000 * 1024,
        "cached": 3_200_000 * 1024,
    }
    assert sum(mem.bytes_by_state.values()) == mem.total_bytes


def test_host_network_bytes(host_proc: str) -> None:
    net = system.read_network(host_proc)
    assert net == {
        "lo": system.InterfaceBytes(receive=123456, transmit=123456),
        "eth0": system.InterfaceBytes(receive=987654321, transmit=12345678),
    }


def test_live_host_figures_agree_with_psutil() -> None:
    psutil = pytest.importorskip("psutil")
    assert system.read_cpu().logical_cpus == psutil.cpu_count()
    assert system.read_memory().total_bytes == psutil.virtual_memory().total
    live = system.read_network()
    assert set(live) == set(psutil.net_io_counters(pernic=True))


def test_the_held_host_files_read_what_the_functions_read(host_proc: str) -> None:
    files = system.HostFiles(host_proc)
    try:
        cpu, memory, network = files.read()
        assert cpu == system.read_cpu(host_proc)
        assert memory == system.read_memory(host_proc)
        assert network == system.read_network(host_proc)
        # Read anew each time, also past one buffer (a host of many interfaces).
        names = [f"veth{i:05}" for i in range(2000)]
        rows = "".join(
            f"{n}: {i} 0 0 0 0 0 0 0 {2 * i} 0 0 0 0 0 0 0\n" for i, n in enumerate(names)
        )
        head = "".join(NET_DEV.splitlines(keepends=True)[:2])
        Path(host_proc, "net", "dev").write_text(head + rows)
        assert len(head + rows) > system.HostFiles.SIZE
        network = files.read()[2]
        assert list(network) == names
        assert network["veth01999"] == system.InterfaceBytes(receive=1999, transmit=3998)
    finally:
        files.close()


def test_a_processs_ancestors_are_its_parent_chain_to_the_first_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; g = subprocess.Popen(['sleep', '30']); print(g.pid, flush=True);"
         " g.wait()"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        chain = procfs.ancestors(grandchild)
        assert chain[:2] == [child.pid, os.getpid()]
        assert chain == [child.pid, os.getpid(), *procfs.ancestors(os.getpid())]
        assert chain[-1] == 1 and procfs.ppid(1) == 0
    finally:
        child.kill()
        child.wait()
    assert procfs.ancestors(child.pid) == [] and procfs.ppid(child.pid) is None  # exited


def test_ancestors_stop_at_a_loop_and_at_their_bound(tmp_path: Path) -> None:
    # A stand-in /proc: 2 -> 3 -> 2 (a loop no kernel makes), and a chain deeper than
    # MAX_ANCESTORS; neither is followed for ever.
    def process(pid: int, parent: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a b) S {parent} {pid} 0 0\n")

    process(2, 3)
    process(3, 2)
    assert procfs.ancestors(2, str(tmp_path)) == [3, 2]
    for pid in range(100, 200):
        process(pid, pid + 1)
    chain = procfs.ancestors(100, str(tmp_path))
    assert chain == list(range(101, 101 + procfs.MAX_ANCESTORS))
