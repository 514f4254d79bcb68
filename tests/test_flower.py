"""A real Flower 1.42 deployment (SuperLink, two SuperNodes under `edgewatt run`,
`flwr run` of tests/flower_app: a 4 MB NumPy model, 3 rounds), in Flower's own venv
(tests/bin/fetch-flower; its pins clash with ours). Flower starts one short-lived
ClientApp process per round and re-parents its SuperExec out of the SuperNode's tree
at the end: the SuperNode's target must hold all of it, once, and its bytes must be
the model bytes it exchanged with the SuperLink, not those it passed to its own
ClientApps over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.core.kernel import nftables
from tests.conftest import ROOT, DaemonProcess, fetched, free_port, wait_for

FLOWER = ROOT / ".cache" / "flower"  # tests/bin/fetch-flower
APP = ROOT / "tests" / "flower_app"
ROUNDS = 3

# Runs a command as a child subreaper, so everything the command leaves is reaped
# here; prints the command's pid, then the CPU the kernel counted for the command's
# tree apart from the command itself (edgewatt run's own time, read from its zombie).
SUBREAPER = """
import ctypes, json, os, resource, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
print(pid, flush=True)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
try:
    while True:
        os.wait()
except ChildProcessError:
    pass
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"tree_cpu_s": usage.ru_utime + usage.ru_stime - own}), flush=True)
"""


def flower_bin(name: str) -> str:
    return fetched(FLOWER, f"bin/{name}", "Flower 1.42", "fetch-flower")


def _flower_env(home: Path) -> dict[str, str]:
    # Flower's own venv first: the SuperNode starts flower-superexec by name.
    return {**os.environ, "PATH": f"{FLOWER / 'bin'}:{os.environ['PATH']}", "FLWR_HOME": str(home)}


@pytest.fixture
def superlink(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    flower_bin("flower-superlink")
    port = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "edge"\n\n[superlink.edge]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = _flower_env(home)
    log = open(tmp_path / "superlink.log", "wb")  # noqa: SIM115 - closed below
    link = subprocess.Popen(
        [flower_bin("flower-superlink"), "--insecure", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: b"Uvicorn running" in (tmp_path / "superlink.log").read_bytes(), 60)
        yield port, env
    finally:
        os.killpg(link.pid, signal.SIGKILL)  # its SuperExec too
        link.wait()
        log.close()


def _supernode(
    daemon: DaemonProcess,
    tmp_path: Path,
    n: int,
    link_port: int,
    env: dict[str, str],
    cgroup: bool,
) -> tuple[subprocess.Popen[str], Path, Path]:
    """`edgewatt run --cgroup|--no-cgroup -- flower-supernode` under a measuring
    subreaper (a cgroup target, or a process target)."""
    out, log = tmp_path / f"node{n}.jsonl", tmp_path / f"clientapp{n}.jsonl"
    command = [
        sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket,
        "--interval", str(daemon.interval), "--output", str(out),
        "--cgroup" if cgroup else "--no-cgroup", "--",
        flower_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link_port}",
        "--port", str(free_port()), "--node-config", f"log='{log}'",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER, *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        start_new_session=True,  # a failing test kills the whole node at the end
    )  # fmt: skip
    return proc, out, log


CGROUPS = cgroups.mounts()
# A cgroup of its own needs root, cgroup v2 and nftables (CI has them).
CGROUP_RUN = os.geteuid() == 0 and CGROUPS.v2 is not None and nftables.available() is None


@pytest.mark.parametrize(
    "cgroup",
    [
        False,
        pytest.param(
            True, marks=pytest.mark.skipif(not CGROUP_RUN, reason="needs root and nftables")
        ),
    ],
    ids=["process", "cgroup"],
)
def test_a_supernode_holds_its_clientapps_and_the_model_bytes(
    daemon_factory: Any, superlink: tuple[int, dict[str, str]], tmp_path: Path, cgroup: bool
) -> None:
    port, env = superlink
    daemon = daemon_factory(interval=1.0)
    nodes = [_supernode(daemon, tmp_path, n, port, env, cgroup) for n in range(2)]
    try:
        run_pids, targets = [], []
        for proc, out, _ in nodes:
            assert proc.stdout is not None
            run_pids.append(int(proc.stdout.readline()))
            wait_for(lambda out=out: out.exists() and out.read_text(), 30)
            # A second hold on the SuperNode's target: its summary stays readable
            # after edgewatt run lets go of its own.
            if cgroup:
                body = {"cgroup": f"{cgroups.RUN_PARENT}/run-{run_pids[-1]}"}
                status, held = daemon.call("POST", "/v1/targets", body)
                assert status == 200 and held["kind"] == "cgroup", held  # the same target
                targets.append(held["id"])
            else:
                pid = json.loads(out.read_text().splitlines()[0])["pid"]
                targets.append(daemon.register(pid)["id"])
        fl_log = tmp_path / "fl.jsonl"
        flwr = subprocess.run(
            [flower_bin("flwr"), "run", str(APP), "edge", "--stream",
             "--run-config", f"fl-log='{fl_log}'"],
            capture_output=True, text=True, env=env, timeout=240,
        )  # fmt: skip
        assert flwr.returncode == 0, flwr.stdout + flwr.stderr
        for pid in run_pids:  # the user's Ctrl-C: forwarded to the SuperNode
            os.kill(pid, signal.SIGINT)
        results = []
        for proc, _, _ in nodes:
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
            results.append((json.loads(stdout.splitlines()[-1]), stderr))
    finally:
        for proc, _, _ in nodes:  # everything of a node left by a failure
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    records = [json.loads(line) for line in fl_log.read_text().splitlines()]
    assert len(records) == 2 * ROUNDS  # the collector: one per client per round
    for (measured, table), (_, out, log), tid in zip(results, nodes, targets):
        rounds = [json.loads(line) for line in log.read_text().splitlines()]
        # The mod's figures of each message, on the SuperNode's own target.
        mine = {r["round"]: r for r in records if r["target"] == tid}
        assert sorted(mine) == [1, 2, 3], ([(r["target"], r["source"]) for r in records], tid)
        for work in rounds:
            record = mine[work["round"]]
            assert record["kind"] == "train" and record["phase"] == f"round-{work['round']}/train"
            assert record["source"] == "daemon" and record["exact"] is True
            # The ClientApp's work as its own getrusage counted it, and the SuperNode's
            # few ms of polling beside it in the same window.
            assert record["cpu_s"] == pytest.approx(
                work["cpu_s"], abs=max(0.05, 0.05 * work["cpu_s"])
            ), (record, work)
            assert record["duration_s"] == pytest.approx(work["wall_s"], abs=0.05)
            for key, app in (("bytes_received", "received_bytes"), ("bytes_sent", "sent_bytes")):
                assert work[app] <= record[key] <= work[app] * 1.1 + 64 * 1024, (record, work)
        assert sorted(r["round"] for r in rounds) == [1, 2, 3]
        assert len({r["pid"] for r in rounds}) == ROUNDS  # one ClientApp process each
        # The end is found by the next pass (a cgroup: edgewatt run removed it).
        wait_for(lambda tid=tid: daemon.call("GET", f"/v1/targets/{tid}/summary?fresh=1")[
            1]["state"] == "exited")  # fmt: skip
        summary = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
        # "exit-records" where the SuperNode reaped a ClientApp after the last pass that
        # read it (a busy machine): the CPU below is then checked against wait4 all the same.
        assert summary["state"] == "exited", summary
        assert summary["exit"] in ("exact", "exit-records"), summary
        cpu = summary["cpu_user_s"] + summary["cpu_system_s"]
        # Everything the SuperNode started, once: its SuperExec and every ClientApp.
        # What the records miss is each process's address-space teardown after its
        # exit record (a few ms for a Python process of ~130 MiB).
        assert cpu == pytest.approx(measured["tree_cpu_s"], abs=0.15, rel=0.02), (
            summary, measured, table)  # fmt: skip
        written = json.loads(out.read_text().splitlines()[-1])
        # The daemon's figure kept beside the kernel's wait4; the larger one shown.
        assert written["cpu_daemon_s"] == cpu
        assert written["cpu_time_s"] == max(cpu, written["cpu_wait4_s"])
        # Bytes: the SuperNode passes each model to its ClientApp and back over
        # loopback, inside the target: not counted (with it, twice the model or more).
        # Its HTTP requests to the SuperLink open and close within a pass, which a
        # process target cannot see (docs/reference.md): a cgroup target's kernel
        # counters hold every one of them, so only there is a lower bound asserted.
        received = sum(r["received_bytes"] for r in rounds)
        sent = sum(r["sent_bytes"] for r in rounds)
        for got, model in ((summary["network_receive_bytes"], received),
                           (summary["network_transmit_bytes"], sent)):  # fmt: skip
            assert got <= model * 1.1 + 256 * 1024, (summary, received, sent)
            if cgroup:
                assert got >= model, (summary, received, sent)


def test_the_mod_on_a_legacy_app_the_round_from_group_id_and_the_aggregation_untouched(
    tmp_path: Path,
) -> None:
    """tests/flower_app/check_mod.py, in Flower's venv, with no daemon (in-process)."""
    collected = tmp_path / "fl.jsonl"
    done = subprocess.run(
        [str(FLOWER / "bin" / "python"), str(APP / "check_mod.py"), str(collected)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "EDGEWATT_SOCKET": str(tmp_path / "none.sock")},
    )  # fmt: skip
    flower_bin("flwr")  # says how to fetch Flower where it is absent
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["round_from_config"] == 3  # server-round of the config record
    assert out["round_from_group_id"] == 7  # a legacy strategy's message: group_id only
    native, legacy = out["native"]["record"], out["legacy"]["record"]
    assert set(native) == set(legacy)  # the same record for both kinds of app
    for record in (native, legacy):
        assert record["phase"] == "round-2/train"
        assert record["source"] == "local" and record["exact"] is True
        assert record["cpu_s"] == pytest.approx(0.2, abs=0.05)  # the 0.2 s burn
        # The 1 MiB model as Flower serialises it (the array and its 128-byte header).
        assert record["bytes_received"] == record["bytes_sent"] == 1_048_704
    # The legacy strategy reads its FitRes as the client returned it.
    assert out["legacy"]["fitres"] == {"num_examples": 10, "metrics": {"loss": 0.5},
                                       "sum": 262144.0}  # fmt: skip
    assert out["legacy"]["arrays"] == ["fitres.parameters"]
    # FedAvg aggregates the same with the mod's record in the replies as without it.
    aggregate = out["aggregate"]
    assert aggregate["metrics_with_mod"] == aggregate["metrics_plain"] == {"loss": 0.5}
    assert aggregate["arrays_equal"] is True
    lines = [json.loads(line) for line in collected.read_text().splitlines()]
    assert [(r["round"], r["kind"]) for r in lines] == [(1, "train"), (1, "train")]
    # A 0.5 s request to open the phase is not the ClientApp's time: the record's
    # duration is its call (within Flower's dispatch to it), not the mod's requests.
    slow = out["slow_open"]
    assert slow["record"]["phase"] == "round-4/train"
    assert slow["own_s"] <= slow["record"]["duration_s"] <= slow["own_s"] + 0.25, slow


def test_report_prints_the_rounds_of_a_recorded_federation(tmp_path: Path) -> None:
    # Recorded from the deployment above (tests/fixtures/fl-rounds.jsonl).
    fixture = ROOT / "tests" / "fixtures" / "fl-rounds.jsonl"
    report = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "report", str(fixture)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"edgewatt report: {fixture} (federated rounds)"
    assert lines[1].split() == [
        "round", "kind", "clients", "slowest", "client", "CPU", "energy", "down", "up"
    ]  # fmt: skip
    records = [json.loads(line) for line in fixture.read_text().splitlines()]
    for number, line in zip((1, 2, 3), lines[2:5]):
        clients = [r for r in records if r["round"] == number]
        slowest = max(clients, key=lambda r: r["duration_s"])
        gap = slowest["duration_s"] - min(r["duration_s"] for r in clients)
        cpu = sum(r["cpu_s"] for r in clients)
        assert line.split()[:3] == [str(number), "train", str(len(clients))], line
        assert f"node {slowest['node_id']} " in line
        assert f"{slowest['duration_s']:.2f} s, +{gap:.2f} s" in line
        assert f"{cpu:.2f} s" in line
    assert lines[-1].startswith("  bytes: flower payload")


def test_plot_of_the_rounds_draws_each_client_per_round(tmp_path: Path) -> None:
    from edgewatt.cli.rounds import load_rounds, rounds_layout

    fixture = ROOT / "tests" / "fixtures" / "fl-rounds.jsonl"
    records = load_rounds(str(fixture))
    drawn = rounds_layout(records, "fl")
    assert drawn.title == "fl: 3 rounds (train), 2 clients"
    assert drawn.rounds == ["1/train", "2/train", "3/train"]
    assert [label for label, _ in drawn.panels] == [  # no energy: no sensor on this VM
        "duration (s)", "CPU (s)", "received from the server (MiB)", "sent to the server (MiB)"
    ]  # fmt: skip
    durations = dict(drawn.panels)["duration (s)"]
    for record in records:
        client = f"node {record['node_id']} ({record['host_name']})"
        assert durations[client][record["round"] - 1] == record["duration_s"]
    for number, straggler in enumerate(drawn.stragglers, 1):
        slowest = max((r for r in records if r["round"] == number), key=lambda r: r["duration_s"])
        assert straggler == f"node {slowest['node_id']} ({slowest['host_name']})"
    received = dict(drawn.panels)["received from the server (MiB)"]
    assert all(v == 4000128 / 2**20 for values in received.values() for v in values)
    png = tmp_path / "rounds.png"
    report = _report(fixture, "--plot", str(png))
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[-1] == f"  plot written to {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_hostile_client_changes_only_its_own_figures_in_the_round_file(tmp_path: Path) -> None:
    """tests/flower_app/check_collect.py: FedAvg under collect() in Flower's venv, fed a
    client (node 2) whose edgewatt record claims node 1 and another file format, then
    holds bytes, a list, NaN, inf, a 1 MB string and out-of-bounds numbers."""
    collected = tmp_path / "fl.jsonl"
    done = subprocess.run(
        [str(FLOWER / "bin" / "python"), str(APP / "check_collect.py"), str(collected)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    flower_bin("flwr")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in collected.read_text().splitlines()]
    # Every client's line of every round, each with the server's own fields.
    assert [(r["type"], r["round"], r["kind"], r["node_id"]) for r in records] == [
        ("fl-round", n, "train", node) for n in (1, 2, 3) for node in (1, 2)
    ]
    per_line = ("round", "phase", "node_id")
    honest = {k: v for k, v in records[0].items() if k not in per_line}
    for record in records:
        if record["node_id"] == 1 or record["round"] != 2:  # valid figures kept as sent
            assert {k: v for k, v in record.items() if k not in per_line} == honest
    assert "evil" not in records[1]
    # Round 2: node 2's bad fields dropped, its valid ones kept.
    assert records[3] == {
        "type": "fl-round", "round": 2, "kind": "train", "node_id": 2,
        "bytes_source": honest["bytes_source"], "source": "daemon",
        "shorter_than_sensor_period": False,
    }  # fmt: skip
    # Logged once for the run, naming the client and what it sent.
    warnings = json.loads(done.stdout)["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("edgewatt: node 2 sent"), warnings
    assert "'node_id', 'type', 'evil'" in warnings[0]
    report = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "report", str(collected)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    rows = report.stdout.splitlines()[2:5]
    assert [row.split()[:3] for row in rows] == [[str(n), "train", "2"] for n in (1, 2, 3)]
    assert "node 1 (jetson-1) 3.25 s, +0.00 s" in rows[1]  # node 2 sent no duration
    assert "5.00 s" in rows[0] and "2.50 s" in rows[1]  # round 2: node 2's CPU was a list


def _report(*args: Any) -> subprocess.CompletedProcess[str]:
    """`edgewatt report ARGS...`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "report", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip


def _twelve_rounds(tmp_path: Path) -> Path:
    """The recorded fixture's two clients over 12 rounds of train and evaluate, as the
    collector appends them (each round's train, then its evaluate)."""
    fixture = ROOT / "tests" / "fixtures" / "fl-rounds.jsonl"
    clients = [json.loads(line) for line in fixture.read_text().splitlines()][:2]
    path = tmp_path / "fl12.jsonl"
    with path.open("w") as out:
        for number in range(1, 13):
            for kind in ("train", "evaluate"):
                for i, client in enumerate(clients):
                    # Round n's train: n + 0.05 + i/10 s; its evaluate: n + i/10 s.
                    duration = number + i / 10 + (0.05 if kind == "train" else 0.0)
                    record = {**client, "round": number, "kind": kind, "duration_s": duration,
                              "phase": f"round-{number}/{kind}"}  # fmt: skip
                    out.write(json.dumps(record) + "\n")
    return path


def test_twelve_rounds_are_in_numeric_order_train_before_evaluate(tmp_path: Path) -> None:
    from edgewatt.cli.rounds import load_rounds, rounds_layout

    path = _twelve_rounds(tmp_path)
    order = [(n, kind) for n in range(1, 13) for kind in ("train", "evaluate")]
    png = tmp_path / "fl12.png"
    report = _report(path, "--plot", str(png))
    assert report.returncode == 0, report.stderr
    rows = report.stdout.splitlines()[2:26]
    assert [tuple(row.split()[:2]) for row in rows] == [(str(n), k) for n, k in order]
    # Round 10's train: its slower client at 10.15 s, 0.10 s after the other.
    assert "10.15 s, +0.10 s" in rows[18]
    drawn = rounds_layout(load_rounds(str(path)), "fl")
    assert drawn.rounds == [f"{n}/{kind}" for n, kind in order]
    assert drawn.title == "fl: 12 rounds (train and evaluate), 2 clients"
    records = load_rounds(str(path))
    second = f"node {records[1]['node_id']} ({records[1]['host_name']})"
    # Its bars in the same order: 1/train, 1/evaluate, 2/train, ... 12/evaluate.
    expected = [n + 0.1 + (0.05 if kind == "train" else 0.0) for n, kind in order]
    assert dict(drawn.panels)["duration (s)"][second] == pytest.approx(expected)
    assert set(drawn.stragglers) == {second}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_help_names_the_federation_files() -> None:
    shown = _report("--help")
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "federated-learning rounds file" in text
    assert "edgewatt.client.flower.collect" in text and "fl.jsonl" in text
