"""Commands made of short processes: every process's teardown counted, as the kernel's
own wait4 counts it.

A process's exit record is sent before it tears down its address space: a
``/bin/true`` spends most of its CPU (0.5-1.4 ms here) after its record. Measured
against the kernel's count for the whole tree (a driver that wait4s the workload and
adds its own getrusage), through `edgewatt run` (its table, its --output file) and
through the daemon's own summary of the target `edgewatt run` registered (as root); and
the ledger that counts them (core/facts/teardowns.py) in exact ticks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts.teardowns import Teardowns
from tests.conftest import ROOT, wait_for

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's events need root")

# The command edgewatt run starts: says it is ready (the test then holds the target
# too), runs the workload as its child and prints what the kernel counted for both
# (its own CPU and the workload's wait4, every teardown included).
DRIVER = """
import os, resource, sys
print("ready", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, child = os.wait4(pid, 0)
own = resource.getrusage(resource.RUSAGE_SELF)
print("kernel", child.ru_utime + child.ru_stime + own.ru_utime + own.ru_stime, flush=True)
os._exit(os.waitstatus_to_exitcode(status))
"""
FORKS = """
import os
for _ in range(2000):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"""
WORKLOADS = {
    "python-2000-forks": [sys.executable, "-c", FORKS],
    "sh-1000-true": ["sh", "-c", "for i in $(seq 1000); do /bin/true; done"],
    "sh-400-true-at-once": ["sh", "-c", "for i in $(seq 400); do /bin/true & done; wait"],
}


def _cpu(summary: dict[str, Any]) -> float:
    return summary["cpu_user_s"] + summary["cpu_system_s"]


def _close_to(figure: float, kernel: float) -> bool:
    """Within /proc's 10 ms ticks (user and system floored at the last reading) and the
    driver's own exit after its figure (a ms), whatever the load."""
    return abs(figure - kernel) <= 0.03 + 0.01 * kernel


@root_only
@pytest.mark.parametrize("interval", [0.2, 2.0])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_short_processes_are_counted_to_the_kernels_wait4(
    daemon_factory: Any, tmp_path: Path, workload: str, interval: float
) -> None:
    daemon = daemon_factory(interval=interval)
    out = tmp_path / "run.jsonl"
    run = subprocess.Popen(  # a process target: its members found by lineage
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket, "--no-cgroup",
         "--interval", str(interval), "--output", str(out), "--",
         sys.executable, "-c", DRIVER, *WORKLOADS[workload]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert run.stdin is not None and run.stdout is not None
    assert run.stdout.readline() == "ready\n"
    # A second hold on the target edgewatt run registered (the same id): its summary
    # stays readable after edgewatt run lets go of its own.
    header = json.loads(out.read_text().splitlines()[0])
    tid = daemon.register(header["pid"])["id"]
    stdout, stderr = run.communicate("go\n", timeout=120)
    assert run.returncode == 0, stderr
    kernel = float(re.search(r"^kernel (\S+)$", stdout, re.M)[1])  # type: ignore[index]
    table = float(re.search(r"CPU time\s+([\d.]+) s", stderr)[1])  # type: ignore[index]
    written = json.loads(out.read_text().splitlines()[-1])
    api = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
    figures = {"table": table, "file": written["cpu_time_s"], "daemon": _cpu(api)}
    assert api["exit"] == "exact" and api["membership"] == "lineage", api
    assert all(_close_to(f, kernel) for f in figures.values()), (figures, kernel, stderr)
    # The table says which count it shows, and the file keeps both.
    assert written["cpu_wait4_s"] >= kernel - 0.005, written  # the driver's print after it
    assert written["cpu_daemon_s"] == pytest.approx(_cpu(api)), written
    assert written["cpu_time_s"] == max(written["cpu_wait4_s"], written["cpu_daemon_s"])
    source = "daemon" if written["cpu_daemon_s"] >= written["cpu_wait4_s"] else "kernel"
    assert written["cpu_source"].startswith(source), written
    assert re.search(r"^  counted by\s+" + source, stderr, re.M), stderr
    assert "exact" not in stderr


@root_only
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_a_registered_target_is_called_exact_only_with_every_teardown(
    daemon_factory: Any, workload: str
) -> None:
    # Registered by its pid, reaped by this test as soon as it exits: its children's
    # teardowns after its last reading are in no counter the daemon can read.
    daemon = daemon_factory(interval=2.0)
    command = WORKLOADS[workload]
    if command[0] == "sh":
        command = ["sh", "-c", "read go; " + command[2]]
    else:
        command = [*command[:2], "import sys; sys.stdin.readline()\n" + command[2]]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    tid = daemon.register(proc.pid)["id"]
    proc.stdin.write("go\n")
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    kernel = usage.ru_utime + usage.ru_stime

    def ask() -> dict[str, Any]:  # a pass at each ask: it finds the exit
        return daemon.call("GET", f"/v1/targets/{tid}/summary?fresh=1")[1]

    assert wait_for(lambda: ask()["state"] == "exited", timeout=30)
    summary = ask()
    assert summary["exit"] in ("exact", "exit-records"), summary
    if summary["exit"] == "exact":
        assert _close_to(_cpu(summary), kernel), (summary, kernel)
    else:  # what the exit records gave, a lower bound
        assert _cpu(summary) <= kernel + 0.03, (summary, kernel)


# The ledger itself, in /proc's ticks, as departures.py drives it: each pass reads the
# live members' reaped-children counters, then the exits it drained (depart), then
# after_pass.


def test_a_reaper_inside_the_target_shows_its_childrens_teardowns() -> None:
    t = Teardowns()
    t.read(1, 100.0, existing=True)  # the root had reaped 100 ticks before: not the target's
    t.read(2, 0.0, existing=False)  # its child, forked since
    t.after_pass({1, 2}, {1, 2})
    assert t.missed() == 0.0
    # 2 reaps a child 3 the passes never read: its record says 4 ticks, 2's counters
    # show 5 (1 tick of teardown). Expected before shown: nothing counted below zero.
    t.depart(3, 4.0, 2, inside=True, unseen=False, final=False)
    assert t.missed() == 0.0
    t.read(2, 5.0, existing=False)
    assert t.missed() == 1.0
    t.after_pass({1, 2}, {1, 2})
    # 2 exits (10 ticks its own) and 1 reaps it: 1's counters will gain 10 + 5; they
    # gain 17 (2 ticks of 2's teardown).
    t.depart(2, 10.0, 1, inside=True, unseen=False, final=False)
    assert t.missed() == 0.0  # 1 is expected 15 ticks its counters do not show yet
    t.read(1, 117.0, existing=True)
    assert t.missed() == 3.0
    t.after_pass({1}, {1})
    assert t.missed() == 3.0 and t.complete
    # Counters are read whole: one read lower than at the start shows nothing, not less.
    t.read(1, 99.0, existing=True)
    assert t.missed() == 0.0


def test_a_member_of_the_target_at_registration_hands_its_reaper_all_it_had_reaped() -> None:
    t = Teardowns()
    t.read(1, 100.0, existing=True)
    t.read(2, 7.0, existing=True)  # had reaped 7 ticks before: not the target's
    t.after_pass({1, 2}, {1, 2})
    t.depart(3, 4.0, 2, inside=True, unseen=False, final=False)
    t.read(2, 12.0, existing=True)
    t.after_pass({1, 2}, {1, 2})
    assert t.missed() == 1.0
    # 2 exits (10 ticks) and 1 reaps it: 1's counters gain 2's own and everything 2
    # reaped, the 7 ticks before registration too (10 + 7 + 5), and 2 of teardown.
    t.depart(2, 10.0, 1, inside=True, unseen=False, final=False)
    t.read(1, 124.0, existing=True)
    assert t.missed() == 3.0


def test_a_root_reaped_outside_is_checked_against_what_it_was_expected_at_its_reading() -> None:
    t = Teardowns()
    t.read(1, 50.0, existing=True)
    t.after_pass({1}, {1})
    t.depart(2, 6.0, 1, inside=True, unseen=False, final=False)
    t.read(1, 58.0, existing=True)  # 2's 6 ticks and 2 of teardown
    t.after_pass({1}, {1})
    assert t.missed() == 2.0
    # A pass reads 1 after it reaped 3 (4 ticks, 1 of teardown), 3's exit event after:
    # the reading showed it (unseen). Then 1 exits, reaped outside the target.
    t.read(1, 63.0, existing=True)
    t.depart(3, 4.0, 1, inside=True, unseen=True, final=False)
    t.depart(1, 20.0, 0, inside=False, unseen=False, final=False)
    t.after_pass(set(), set())
    assert t.missed() == 3.0 and t.complete


def test_a_member_reaped_outside_with_nothing_expected_of_it_changes_nothing() -> None:
    t = Teardowns()
    t.read(1, 0.0, existing=False)
    t.read(2, 0.0, existing=False)
    t.after_pass({1, 2}, {1, 2})
    t.depart(3, 4.0, 1, inside=True, unseen=False, final=False)
    t.read(1, 6.0, existing=False)
    t.read(2, 0.0, existing=False)
    t.after_pass({1, 2}, {1, 2})
    assert t.missed() == 2.0
    t.depart(2, 5.0, 999, inside=False, unseen=False, final=False)  # re-parented, reaped
    assert t.missed() == 2.0 and t.complete


def test_an_unseen_child_of_a_reaper_read_once_is_shown_at_that_reading() -> None:
    # The reaper's first reading (forked since) already shows the child it reaped; the
    # child's event, then the reaper's own exit (reaped outside), come in that pass.
    t = Teardowns()
    t.read(1, 5.0, existing=False)
    t.depart(3, 4.0, 1, inside=True, unseen=True, final=False)
    t.depart(1, 20.0, 999, inside=False, unseen=False, final=False)
    assert t.missed() == 1.0 and t.complete


def test_children_reaped_after_a_roots_last_reading_leave_the_figure_incomplete() -> None:
    t = Teardowns()
    t.read(1, 50.0, existing=True)
    t.depart(2, 6.0, 1, inside=True, unseen=False, final=False)
    t.read(1, 58.0, existing=True)
    t.after_pass({1}, {1})
    # 1 reaps 3 after the pass read it, then exits, reaped outside: 3's teardown is in
    # no counter the daemon read.
    t.depart(3, 4.0, 1, inside=True, unseen=False, final=False)
    t.depart(1, 20.0, 0, inside=False, unseen=False, final=False)
    assert t.missed() == 2.0
    assert t.complete is False


def test_a_reaper_read_as_a_zombie_settles_its_children_whose_events_come_late() -> None:
    t = Teardowns()
    t.read(1, 50.0, existing=True)
    t.after_pass({1}, {1})
    assert t.quiet
    # 1 reaps 4 (3 ticks, 1 of teardown) and exits; read as a zombie (its counters
    # final), then reaped outside. 4's exit event comes a pass later.
    t.read(1, 54.0, existing=True)
    t.depart(1, 20.0, 0, inside=False, unseen=False, final=True)
    assert t.missed() == 4.0 and not t.quiet
    t.after_pass(set(), set())
    t.depart(4, 3.0, 1, inside=False, unseen=False, final=False)
    assert t.missed() == 1.0 and t.complete
    # Late events are awaited through two passes after the one their reaper left in:
    # 4 left in the pass after 1's, and is forgotten a pass after it.
    quiet = []
    for _ in range(4):
        t.after_pass(set(), set())
        quiet.append(t.quiet)
    assert quiet == [False, False, True, True]
    assert t.missed() == 1.0


def test_an_exit_event_long_after_its_reaper_left_is_no_longer_late() -> None:
    t = Teardowns()
    t.read(1, 50.0, existing=True)
    t.read(1, 54.0, existing=True)
    t.depart(1, 20.0, 0, inside=False, unseen=False, final=True)
    for _ in range(3):
        t.after_pass(set(), set())
    assert t.quiet
    # Its reaper is forgotten: a member reaped outside, as expected as it was read
    # (nothing), its 3 ticks not taken off.
    t.depart(4, 3.0, 1, inside=False, unseen=False, final=False)
    assert t.missed() == 4.0


def test_a_reaper_gone_from_the_tree_without_an_exit_event_is_expected_nothing() -> None:
    t = Teardowns()
    t.read(1, 0.0, existing=False)
    t.depart(2, 4.0, 1, inside=True, unseen=False, final=False)
    t.read(1, 3.0, existing=False)  # a figure below the record: a child not reaped yet
    t.after_pass({1}, {1})
    assert t.missed() == 0.0
    t.after_pass(set(), {1})  # still a member, not read this pass
    assert t.missed() == 0.0
    t.after_pass(set(), set())  # left the tree, its exit event lost
    assert t.missed() == 3.0
