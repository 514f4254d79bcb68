"""The real daemon, real processes, figures compared with what the kernel says."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.measure import rss_bytes
from edgewatt.exporter.daemon import MAX_OPEN_FILES
from edgewatt.exporter.statefile import StateFile
from edgewatt.exporter.write_budget import WriteBudget
from tests.conftest import ROOT, DaemonProcess, kernel_cpu_seconds, wait_for

BURN = "import time\nwhile True: pass"


def cpu_total(daemon: DaemonProcess, target_id: str) -> float | None:
    values = [
        v for _, v in daemon.series("process_cpu_time_seconds_total", edgewatt_target_id=target_id)
    ]
    return sum(values) if values else None


def test_cpu_time_never_exceeds_kernel_and_lags_at_most_one_interval(
    daemon: DaemonProcess, spawn: Any
) -> None:
    child = spawn(BURN)
    tid = daemon.register(child.pid)["id"]
    wait_for(lambda: cpu_total(daemon, tid))
    for _ in range(8):
        before = kernel_cpu_seconds(child.pid)
        exported = cpu_total(daemon, tid)
        after = kernel_cpu_seconds(child.pid)
        assert exported is not None
        assert exported <= after + 1e-9
        # Busy on one core: one interval (plus a tick of rounding) is the most it can lag.
        assert exported >= before - daemon.interval - 0.02, (before, exported)
        time.sleep(0.13)
    labels = daemon.series("process_cpu_time_seconds_total", edgewatt_target_id=tid)
    assert {lbl["cpu_mode"] for lbl, _ in labels} == {"user", "system"}
    # By mode, as the conventions require (cpu.mode): the modes add up to the target's
    # share of all cores. A single-threaded burner holds at most one of os.cpu_count()
    # (a tick of rounding over the pass), and more than nothing; how much of the core the
    # scheduler gave it is not the daemon's figure to promise.
    shares = {
        lbl["cpu_mode"]: v
        for lbl, v in daemon.series("process_cpu_utilization", edgewatt_target_id=tid)
    }
    assert set(shares) == {"user", "system"}
    assert 0 < sum(shares.values()) <= (1 + 0.02 / daemon.interval) / os.cpu_count()


def test_cpu_utilization_by_mode_follows_where_the_kernel_counted_the_time(
    daemon: DaemonProcess, spawn: Any
) -> None:
    # One child spins in user space, one in read(2) of /dev/zero (the kernel's copy):
    # each one's larger share is in the mode the kernel counted its time in.
    user = daemon.register(spawn(BURN).pid)["id"]
    kernel = spawn(
        "import os\nf = os.open('/dev/zero', os.O_RDONLY)\nwhile True: os.read(f, 1 << 22)"
    )
    system = daemon.register(kernel.pid)["id"]

    def shares(tid: str) -> dict[str, float]:
        found = daemon.series("process_cpu_utilization", edgewatt_target_id=tid)
        return {lbl["cpu_mode"]: v for lbl, v in found}

    wait_for(lambda: shares(user).get("user", 0) > shares(user).get("system", 1), timeout=20)
    wait_for(lambda: shares(system).get("system", 0) > shares(system).get("user", 1), timeout=20)


def test_rss_of_a_200_mb_child_within_5_percent(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn(
        "import sys, time\nblock = bytearray(200 * 1024 * 1024)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "print('ready', flush=True)\ntime.sleep(60)",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    tid = daemon.register(child.pid)["id"]
    wait_for(lambda: daemon.value("process_memory_usage_bytes", edgewatt_target_id=tid))
    daemon.wait_passes(tid, 2)
    exported = daemon.value("process_memory_usage_bytes", edgewatt_target_id=tid)
    assert exported == pytest.approx(rss_bytes(child.pid), rel=0.05)
    assert exported > 200 * 1024 * 1024
    virtual = daemon.value("process_memory_virtual_bytes", edgewatt_target_id=tid)
    assert virtual is not None and virtual >= exported


GRANDCHILD = """
import os, sys, time
pid = os.fork()
if pid == 0:
    grand = os.fork()
    if grand == 0:
        end = time.process_time() + 1.5
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(grand, 0)
    os._exit(0)
print(pid, flush=True)
os.waitpid(pid, 0)
print("reaped", flush=True)
time.sleep(60)
"""


def test_forked_grandchild_cpu_counted_in_ancestor_and_kept_after_exit(
    daemon: DaemonProcess, spawn: Any
) -> None:
    parent = spawn(GRANDCHILD, stdout=subprocess.PIPE, text=True)
    tid = daemon.register(parent.pid)["id"]
    assert parent.stdout is not None
    parent.stdout.readline()  # the child's pid: the tree is running
    seen: list[float] = []
    processes: list[float] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        value = cpu_total(daemon, tid)
        if value is not None:
            seen.append(value)
            processes.append(daemon.value("edgewatt_process_members", edgewatt_target_id=tid) or 0)
        if value and value >= 1.4 and seen[-1] == seen[-2 if len(seen) > 1 else -1]:
            break
        time.sleep(0.1)
    assert parent.stdout.readline() == "reaped\n"
    daemon.wait_passes(tid, 3)
    final = cpu_total(daemon, tid)
    seen.append(final)  # type: ignore[arg-type]
    assert seen == sorted(seen), "the counter went backwards"
    assert max(processes) == 3  # target, child and grandchild were all counted live
    # No more than the kernel counted: /proc floors user and system time to 10 ms ticks
    # each, the exit records count to the microsecond.
    assert final is not None and 1.4 <= final <= kernel_cpu_seconds(parent.pid) + 0.02
    assert daemon.value("edgewatt_process_members", edgewatt_target_id=tid) == 1


ORPHAN = """
import os, time
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
        time.sleep(30)
        os._exit(0)
    time.sleep(0.6)
    os._exit(0)  # the grandchild is re-parented outside the tree
os.waitpid(pid, 0)
time.sleep(0.5)
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
print("done", flush=True)
time.sleep(60)
"""


def test_counters_never_go_backwards_when_a_descendant_leaves_the_tree(
    daemon: DaemonProcess, spawn: Any
) -> None:
    parent = spawn(ORPHAN, stdout=subprocess.PIPE, text=True)
    tid = daemon.register(parent.pid)["id"]
    assert parent.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    # Until the parent has burnt its own 0.5 s, however long a busy machine takes.
    while not select.select([parent.stdout], [], [], 0.1)[0]:
        value = cpu_total(daemon, tid)
        if value is not None:
            seen.append(value)
        assert time.monotonic() < deadline, seen
    assert parent.stdout.readline() == "done\n"
    daemon.wait_passes(tid, 3)
    seen.append(cpu_total(daemon, tid))
    assert len(seen) > 5 and seen == sorted(seen)
    # What the orphan spent while it was a descendant is kept on top of the parent's
    # own: the total exceeds what the kernel still counts in the tree.
    assert seen[-1] > kernel_cpu_seconds(parent.pid) + 0.02


def test_exited_target_series_vanish_within_two_intervals_summary_stays(
    daemon_factory: Any, spawn: Any
) -> None:
    daemon = daemon_factory(interval=0.5)
    child = spawn("import time; time.sleep(60)")
    tid = daemon.register(child.pid, labels={"run": "gone"})["id"]
    wait_for(lambda: daemon.series("process_memory_usage_bytes", edgewatt_target_id=tid))
    child.kill()
    child.wait()
    killed = time.monotonic()
    wait_for(lambda: not daemon.series("process_memory_usage_bytes", edgewatt_target_id=tid))
    assert time.monotonic() - killed <= 2 * daemon.interval + 0.1
    assert 'run="gone"' not in daemon.metrics_text()
    status, summary = daemon.call("GET", f"/v1/targets/{tid}/summary")
    assert status == 200 and summary["state"] == "exited" and summary["exited_at"] > 0
    assert summary["samples"] >= 1


def _spawn_with_pid(pid: int) -> subprocess.Popen | None:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    proc = subprocess.Popen([sys.executable, "-c", BURN])
    if proc.pid == pid:
        return proc
    proc.kill()
    proc.wait()
    return None


@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="choosing a pid needs root"
)
def test_pid_reuse_never_confuses_identity(daemon_factory: Any, spawn: Any) -> None:
    daemon = daemon_factory(interval=1.0)
    old = spawn("import time; time.sleep(60)")
    pid = old.pid
    old_id = daemon.register(pid, labels={"who": "old"})["id"]
    wait_for(lambda: daemon.series("process_memory_usage_bytes", edgewatt_target_id=old_id))
    # Kill the target and hand its pid to a CPU burner before the daemon samples again.
    old.kill()
    old.wait()
    new = None
    for _ in range(20):
        new = _spawn_with_pid(pid)
        if new is not None:
            break
    assert new is not None, "could not reuse the pid"
    try:
        wait_for(lambda: daemon.call("GET", f"/v1/targets/{old_id}")[1]["state"] == "exited")
        assert not daemon.series("process_cpu_time_seconds_total", edgewatt_target_id=old_id)
        assert not daemon.series("process_cpu_time_seconds_total", who="old")
        status, body = daemon.call("POST", "/v1/targets", {"pid": pid, "labels": {"who": "new"}})
        assert status == 201 and body["id"] != old_id
        summary = daemon.call("GET", f"/v1/targets/{old_id}/summary")[1]
        assert summary["cpu_user_s"] < 0.5  # the sleeper's, not the burner's
    finally:
        new.kill()
        new.wait()


def test_restart_restores_live_registrations_and_drops_dead_ones(
    daemon_factory: Any, spawn: Any, tmp_path: Any
) -> None:
    state = tmp_path / "persist"
    first = daemon_factory(state_dir=state)
    alive = spawn("import time; time.sleep(60)")
    doomed = spawn("import time; time.sleep(60)")
    alive_id = first.register(alive.pid, labels={"run": "keep"})["id"]
    doomed_id = first.register(doomed.pid)["id"]
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    saved = StateFile(state, boot_id, WriteBudget(1 << 20)).load()
    assert {t["id"] for t in saved} == {alive_id, doomed_id}
    assert first.stop() < 2.0
    doomed.kill()
    doomed.wait()

    second = daemon_factory(state_dir=state)
    listing = second.call("GET", "/v1/targets")[1]["targets"]
    assert [(t["id"], t["labels"]) for t in listing] == [(alive_id, {"run": "keep"})]
    wait_for(lambda: second.series("process_memory_usage_bytes", edgewatt_target_id=alive_id))
    assert "not restoring registration " + doomed_id in second.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly_within_two_seconds(daemon_factory: Any, sig: int) -> None:
    daemon = daemon_factory()
    assert daemon.stop(sig) < 2.0
    assert daemon.proc is not None and daemon.proc.returncode == 0
    assert not os.path.exists(daemon.socket)
    assert "edgewatt stopped" in daemon.log()


def test_a_sigterm_while_starting_is_a_clean_stop(tmp_path: Path) -> None:
    # systemd may stop the service while it starts: the signal lands as soon as the
    # API socket exists, before the power readers, the first pass and the log line.
    sock = tmp_path / "ew.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgewatt.cli", "serve", "--socket", str(sock),
         "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert "received SIGTERM, stopping" in out and "edgewatt stopped" in out
    assert not sock.exists()


def test_open_files_limit_lifted_to_the_hard_limit(daemon_factory: Any) -> None:
    # A few /proc files per target: max_targets of them need more than the usual 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        daemon = daemon_factory()  # max_targets 1000 by default
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert daemon.proc is not None
    with open(f"/proc/{daemon.proc.pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    soft_now, hard_now = line.split()[3:5]
    assert hard_now == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard))
    assert soft_now == (str(MAX_OPEN_FILES) if hard == resource.RLIM_INFINITY else str(hard))
    assert "open files limit" not in daemon.log()


def test_children_false_counts_only_the_process(daemon: DaemonProcess, spawn: Any) -> None:
    parent = spawn(
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "print(c.pid, flush=True); time.sleep(60)",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    burner = int(parent.stdout.readline())
    try:
        alone = daemon.register(parent.pid, children=False)["id"]
        daemon.wait_passes(alone, 5)  # a second of passes: counted, the burner would show
        assert cpu_total(daemon, alone) < 0.3
        assert daemon.value("edgewatt_process_members", edgewatt_target_id=alone) == 1
    finally:
        os.kill(burner, signal.SIGKILL)


def test_status_command_prints_a_table_and_json(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    tid = daemon.register(child.pid, labels={"run": "table"})["id"]
    daemon.wait_passes(tid, 3)
    cmd = [sys.executable, "-m", "edgewatt.cli", "status", "--socket", daemon.socket]
    table = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "ID", "PID", "NAME", "STATE", "CPU%", "PSS", "READ", "WRITE", "PROCS", "LABELS"
    ]  # fmt: skip
    cells = row.split()
    # NAME: what runs, its command line, cut at 80 characters.
    command = f"{os.path.basename(sys.executable)} -c import time; time.sleep(60)"
    assert cells[:2] == [tid, str(child.pid)] and row.split("  ")[2].strip() == command
    assert cells[2 + len(command.split())] == "running"
    assert cells[-1] == "run=table" and "MiB" in row
    as_json = json.loads(
        subprocess.run(
            [*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout
    )
    assert as_json[0]["id"] == tid and as_json[0]["latest"]["memory_rss_bytes"] > 0
    # The PSS column is the target's PSS, never the RSS summed.
    pss = as_json[0]["latest"]["memory_pss_bytes"]
    assert 0 < pss <= as_json[0]["latest"]["memory_rss_bytes"]


def test_status_without_daemon_says_so(tmp_path: Any) -> None:
    missing = str(tmp_path / "none.sock")
    out = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "status", "--socket", missing],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert f"no daemon answering; looked at {missing} (given): no such socket" in out.stderr
