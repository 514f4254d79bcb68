"""One process is one target, whoever registers it (a second registration joins it),
and a finished target stays visible: `edgewatt status`, `edgewatt summary` by id or
label, for exited_retention. Against the real daemon over its socket."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.status import human_bytes, render
from tests.conftest import ROOT, DaemonProcess, call_as, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
NOBODY = 65534


def edgewatt(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGEWATT, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, **kw
    )


# The phases the README's script opens, in order.
README_PHASES = ["epoch-1", "eval-1", "epoch-2", "eval-2", "epoch-3", "eval-3"]


def readme_script() -> str:
    """The README's training script, exactly as "Measure a training script" gives it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Measure a training script", 1)[1]
    script = re.search(r"```python\n(.*?)```", section, re.S)
    assert script is not None and 'client.register(labels={"run": "demo"})' in script[1]
    return script[1]


def test_a_second_registration_joins_the_target(daemon_factory: Any, spawn: Any) -> None:
    daemon = daemon_factory()
    child = spawn("import time; time.sleep(60)")
    status, first = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": {"run": "a"}})
    assert status == 201 and first["conflicts"] == []
    tid = first["id"]
    status, same = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": {"run": "a"}})
    assert (status, same["id"], same["conflicts"]) == (200, tid, [])
    # Other labels and flag: joined, the new name added, the target's value and flag
    # kept, and what was not taken said in the answer.
    asked = {"pid": child.pid, "labels": {"run": "b", "script": "train"}, "children": False}
    status, joined = daemon.call("POST", "/v1/targets", asked)
    assert status == 200 and joined["id"] == tid
    assert joined["labels"] == {"run": "a", "script": "train"} and joined["children"] is True
    assert joined["conflicts"] == [
        {"field": "labels.run", "asked": "b", "kept": "a", "why": "the target has run='a'"},
        {"field": "children", "asked": False, "kept": True,
         "why": "the target counts its children"},
    ]  # fmt: skip
    # The bound holds on the joined labels: 2 + 62 = 64, the 63rd new one refused.
    many = {f"l{i:02d}": str(i) for i in range(63)}
    status, full = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": many})
    assert status == 200 and len(full["labels"]) == 64 and "l62" not in full["labels"]
    assert full["conflicts"] == [
        {"field": "labels.l62", "asked": "62", "kept": None,
         "why": "the target has 64 labels, the most it may"},
    ]  # fmt: skip
    # A reserved name is refused as in any registration, and nothing is added.
    status, body = daemon.call("POST", "/v1/targets", {"pid": child.pid, "labels": {"job": "x"}})
    assert status == 400 and body["error"] == "invalid labels"
    # What a join added and the holders are saved: a daemon killed and started again
    # has them all.
    daemon.stop(signal.SIGKILL)
    daemon = daemon_factory(state_dir=daemon.state_dir)
    assert daemon.call("GET", f"/v1/targets/{tid}")[1]["labels"] == full["labels"]
    # One target, its series under the joined labels, its phases the holders' phases.
    assert [t["id"] for t in daemon.call("GET", "/v1/targets")[1]["targets"]] == [tid]
    assert daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "epoch-1"})[0] == 201
    series = wait_for(lambda: daemon.series("edgewatt_process_phase", script="train", run="a"))
    assert [(s["edgewatt_phase"], v) for s, v in series] == [("epoch-1", 1.0)]
    # Four registrations hold it: the fourth DELETE ends it (kept to read), a fifth is
    # refused, and registering the live process again makes a new target.
    for _ in range(3):
        assert daemon.call("DELETE", f"/v1/targets/{tid}")[0] == 200
        assert daemon.call("GET", f"/v1/targets/{tid}")[1]["state"] == "running"
    status, ended = daemon.call("DELETE", f"/v1/targets/{tid}")
    assert status == 200 and ended["state"] == "unregistered" and ended["exited_at"] > 0
    assert daemon.call("DELETE", f"/v1/targets/{tid}")[:1] == (409,)
    status, again = daemon.call("POST", "/v1/targets", {"pid": child.pid})
    assert status == 201 and again["id"] != tid and again["labels"] == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_joining_is_the_registrants_or_roots(
    daemon_factory: Any, spawn: Any, public_dir: Path
) -> None:
    daemon = daemon_factory(socket_dir=public_dir)
    roots = spawn("import time; time.sleep(60)")
    tid = daemon.register(roots.pid, labels={"run": "root"})["id"]
    # Another user's target: refused exactly as registering that process is.
    body = {"pid": roots.pid, "labels": {"run": "mine", "x": "y"}}
    status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
    assert (status, answer["error"]) == (403, "not your process")
    # Her own process that root registered: she may watch it, but the target is root's
    # registration: she may not add to it (nor end it, nor start its phases).
    own = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY)
    try:
        theirs = daemon.register(own.pid, labels={"run": "admin"})["id"]
        body = {"pid": own.pid, "labels": {"run": "mine", "x": "y"}}
        status, answer = call_as(NOBODY, public_dir, daemon.socket, "POST", "/v1/targets", body)
        assert (status, answer["error"]) == (403, "not your target")
        assert answer["detail"] == f"target {theirs} belongs to uid 0"
        assert daemon.call("GET", f"/v1/targets/{theirs}")[1]["labels"] == {"run": "admin"}
        # Root joins anyone's.
        status, answer = daemon.call("POST", "/v1/targets", {"pid": own.pid, "labels": {"x": "y"}})
        assert status == 200 and answer["labels"] == {"run": "admin", "x": "y"}
    finally:
        own.kill()
        own.wait()
    assert daemon.call("GET", f"/v1/targets/{tid}")[1]["labels"] == {"run": "root"}


@pytest.mark.parametrize("placement", [[], ["--no-cgroup"]], ids=["own-cgroup", "process"])
def test_the_readme_script_under_edgewatt_run_is_one_target(
    daemon: DaemonProcess, tmp_path: Path, placement: list[str]
) -> None:
    """By default (as root) the run's target is its command's cgroup, which the script's
    register() joins; with --no-cgroup the command's process, which it joins too."""
    train = tmp_path / "train.py"
    train.write_text(readme_script())
    run = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", daemon.socket, *placement, "--", sys.executable,
         str(train)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip

    def in_phase() -> Any:
        listed = daemon.call("GET", "/v1/targets")[1]["targets"]
        for target in listed:
            summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary")[1]
            if target["state"] == "running" and summary["phases"]:
                return target
        return None

    # Once its phase started the command is stopped, so /metrics is read before it ends.
    target = wait_for(in_phase, timeout=30, step=0.02)
    assert (target["pid"] == 0) == (placement == [])  # 0: a cgroup target's
    pids = [target["pid"]] if target["pid"] else list(run_members(daemon, target["id"]))
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        phase = wait_for(lambda: daemon.series("edgewatt_process_phase_duration_seconds",
                                               run="demo"))  # fmt: skip
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert [labels["edgewatt_phase"] for labels, _ in phase] == ["epoch-1"]
    # No refusal, no second sampler in the script: one target, labelled by the script.
    assert "409" not in err and "in-process" not in err and "edgewatt:" not in err
    assert "monitored via daemon" in err
    (only,) = daemon.call("GET", "/v1/targets")[1]["targets"]
    assert only["id"] == target["id"] and only["labels"] == {"run": "demo"}
    summary = daemon.call("GET", f"/v1/targets/{only['id']}/summary")[1]
    assert [p["name"] for p in summary["phases"]] == README_PHASES
    assert summary["phases"][0]["cpu_user_s"] > 0
    # The script read the same target's summary: its CPU is within the final one's.
    printed_cpu = float(out.split(" s CPU")[0])
    assert 0 < printed_cpu <= summary["cpu_user_s"] + summary["cpu_system_s"]


def run_members(daemon: DaemonProcess, target_id: str) -> tuple[int, ...]:
    """The processes in a cgroup target's cgroup now (the command edgewatt run started)."""
    from edgewatt.core.facts import cgroups

    path = daemon.call("GET", f"/v1/targets/{target_id}/summary")[1]["cgroup"]["path"]
    where = cgroups.mounts().v2
    assert where is not None and path.startswith("/edgewatt/run-"), path
    return cgroups.members(where + path)


def test_a_finished_run_stays_in_status_and_summary(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("exited_retention: 20\n")
    daemon = daemon_factory(extra_args=["--config", str(config)])
    work = (
        "import time\n"
        "x = bytearray(64 * 2**20)\n"
        "for i in range(0, len(x), 4096): x[i] = 1\n"
        "end = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\n"
        "raise SystemExit(3)\n"
    )
    # As `edgewatt run` makes it (as root: a cgroup of its own), its exit status is the
    # kernel's exit record of its command, the cgroup's root.
    ran = edgewatt("run", "--label", "run=demo", "--socket", daemon.socket,
                   "--", sys.executable, "-c", work)  # fmt: skip
    assert ran.returncode == 3 and "monitored via daemon" in ran.stderr, ran.stderr
    # A target unregistered while its process lives ends there, and is kept too.
    alive = spawn("import time; time.sleep(60)")
    let_go = daemon.register(alive.pid, labels={"run": "other"})["id"]
    assert daemon.call("DELETE", f"/v1/targets/{let_go}")[0] == 200

    listed = daemon.call("GET", "/v1/targets")[1]["targets"]
    (finished,) = [t for t in listed if t["labels"] == {"run": "demo"}]
    assert finished["state"] == "exited"
    summary = daemon.call("GET", f"/v1/targets/{finished['id']}/summary")[1]
    cpu = summary["cpu_user_s"] + summary["cpu_system_s"]
    assert cpu >= 0.5 and summary["memory_rss_peak_bytes"] >= 64 * 2**20
    # Its exit status, from the kernel's exit record (read by a daemon run as root).
    exit_status = 3 if os.geteuid() == 0 else None
    assert (summary["exit"], summary["exit_status"]) == ("exact", 3) or exit_status is None

    status = edgewatt("status", "--socket", daemon.socket)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert "(no registered targets)" in lines  # none runs
    assert "finished, kept 20 s after their end:" in lines
    row = next(line.split() for line in lines if line.startswith(finished["id"]))
    ended = time.strftime("%H:%M:%S", time.gmtime(finished["exited_at"]))
    # PSS PEAK: what it held, the buffer touched included.
    assert summary["memory_pss_peak_bytes"] >= 64 * 2**20
    peak = human_bytes(summary["memory_pss_peak_bytes"]).split()
    shown_status = "-" if summary["exit_status"] is None else str(summary["exit_status"])
    pid = "cgroup" if finished["kind"] == "cgroup" else str(finished["pid"])
    name = (finished["command"] or finished["executable"]).split()  # what ran, not the registrant
    assert row == [finished["id"], pid, *name, ended, "UTC",
                   "exited", shown_status, f"{cpu:.2f}", "s", "-", *peak, "run=demo"]  # fmt: skip
    other = next(line.split() for line in lines if line.startswith(let_go))
    # After its name (its command line: words of their own), when it ended, and how.
    assert other[other.index("UTC") + 1] == "unregistered" and other[-1] == "run=other"

    by_label = edgewatt("summary", "--json", "--socket", daemon.socket, "run=demo")
    assert by_label.returncode == 0, by_label.stderr
    assert '"id": "' + finished["id"] + '"' in by_label.stdout
    by_id = edgewatt("summary", "--socket", daemon.socket, let_go)
    assert by_id.returncode == 0 and f"target {let_go}: pid {alive.pid} (unregistered" in (
        by_id.stdout
    )
    missing = edgewatt("summary", "--socket", daemon.socket, "run=none")
    assert missing.returncode == 1
    assert "no target labelled run=none" in missing.stderr
    # Killed by a signal: -N, shown as such.
    doomed = spawn("import time; time.sleep(60)")
    doomed_id = daemon.register(doomed.pid)["id"]
    doomed.kill()
    wait_for(lambda: daemon.call("GET", f"/v1/targets/{doomed_id}")[1]["state"] == "exited")
    killed = daemon.call("GET", f"/v1/targets/{doomed_id}/summary")[1]
    assert killed["exit_status"] == (-9 if os.geteuid() == 0 else None)
    killed_cpu = f"{killed['cpu_user_s'] + killed['cpu_system_s']:.2f}"
    status = edgewatt("status", "--socket", daemon.socket).stdout.splitlines()
    row = next(line.split() for line in status if line.startswith(doomed_id))
    shown = ["exited", "signal", "9"] if os.geteuid() == 0 else ["exited", "-", f"{killed_cpu}"]
    after = row.index("UTC") + 1  # its name, a command line, takes words of its own
    assert row[after : after + 3] == shown
    # Past exited_retention they go.
    wait_for(lambda: daemon.call("GET", f"/v1/targets/{let_go}")[0] == 404, timeout=40, step=0.5)


def test_status_shows_the_newest_twenty_finished_and_counts_the_rest() -> None:
    targets = [
        {"id": f"t{i:02d}", "pid": 100 + i, "state": "exited", "exited_at": 1_800_000_000.0 + i,
         "labels": {}, "executable": "python3"}
        for i in range(25)
    ]  # fmt: skip
    summaries = {
        t["id"]: {"cpu_user_s": 1.0, "cpu_system_s": 0.25, "energy_j": 12.5,
                  "memory_pss_peak_bytes": 3 * 2**20, "exit_status": -9 if t["pid"] % 2 else 0}
        for t in targets[-20:]
    }  # fmt: skip
    lines = render(targets, 2, summaries, 600.0).splitlines()
    rows = [line.split() for line in lines if line.startswith("t")]
    assert [r[0] for r in rows] == [f"t{i:02d}" for i in range(5, 25)]  # oldest first
    assert rows[0] == ["t05", "105", "python3", "08:00:05", "UTC", "exited", "signal", "9",
                       "1.25", "s", "12.5", "J", "3.0", "MiB", "-"]  # fmt: skip
    assert rows[1][5:7] == ["exited", "0"]
    assert "(5 older finished targets: edgewatt status --json)" in lines
