"""`edgewatt run` on real commands, `edgewatt report` on the files it writes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.report import (
    ESCAPES,
    Layout,
    amount,
    layout,
    load,
    summary_from_samples,
    summary_table,
)
from edgewatt.cli.status import human_bytes
from tests.conftest import ROOT, wait_for

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")

WORK = (
    "import time\n"
    "x = bytearray(80 * 2**20)\n"
    "for i in range(0, len(x), 4096): x[i] = 1\n"
    "end = time.process_time() + 1.0\n"
    "while time.process_time() < end: pass\n"
    "print('child done', flush=True)\n"
    "raise SystemExit(3)\n"
)


def run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGEWATT, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, **kw
    )


def test_run_exit_code_output_and_summary(tmp_path: Path) -> None:
    out_file = tmp_path / "run.jsonl"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run(
        ["run", "--label", "run=r1", "--output", str(out_file), "--interval", "0.2",
         "--socket", str(tmp_path / "none.sock"), "--", sys.executable, "-c", WORK]
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 3
    assert result.stdout == "child done\n"  # the command's output is untouched
    assert "(exit status 3, monitored via local)" in result.stderr
    # At least the second the command burnt; at most what the kernel counted for
    # edgewatt run and everything it reaped (a busy machine makes the interpreter's
    # start dearer, so no fixed bound holds above).
    cpu = float(re.search(r"CPU time +([\d.]+) s", result.stderr)[1])  # type: ignore[index]
    tree = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert 1.0 - 0.02 <= cpu <= tree + 0.005, (cpu, tree)
    assert re.search(r"RSS sum +peak [\d.]+ MiB", result.stderr), result.stderr
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["labels"] == {"run": "r1"}
    assert lines[-1]["type"] == "summary"
    assert lines[-1]["memory_rss_peak_bytes"] > 80 * 2**20


SLEEPER = (
    "import os, resource, time\n"
    "for _ in range(50):\n"
    "    time.sleep(0.001)\n"
    "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
    "os.write(1, f'{usage.ru_nvcsw} {usage.ru_nivcsw}'.encode())\n"
)


def _counted_run(
    mode: str, daemon_factory: Any, tmp_path: Path, command: str, row: str
) -> tuple[str, re.Match[str], dict[str, Any]]:
    """`edgewatt run` of ``command`` (python -c), by the daemon or in process: what the
    command wrote, its table's ``row`` (a pattern) and the file's summary."""
    socket_path = daemon_factory().socket if mode == "daemon" else str(tmp_path / "none.sock")
    out_file = tmp_path / "run.jsonl"
    result = run(
        ["run", "--socket", socket_path, "--interval", "0.2", "--output", str(out_file),
         "--", sys.executable, "-c", command]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"monitored via {mode}" in result.stderr
    shown = re.search(row, result.stderr)
    assert shown is not None, result.stderr
    summary = json.loads(out_file.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    return result.stdout, shown, summary


@pytest.mark.parametrize("mode", ["daemon", "local"])
def test_run_shows_the_commands_context_switches_in_its_table_and_file(
    mode: str, daemon_factory: Any, tmp_path: Path
) -> None:
    # 50 sleeps of 1 ms: the voluntary switches the command counted itself, exactly
    # (wait4's, of every process it started: it blocks nowhere after its count), and
    # the sampler's where wait4 has none.
    row = r"switches +(\d+) voluntary \(waits\), (\d+) involuntary"
    out, shown, summary = _counted_run(mode, daemon_factory, tmp_path, SLEEPER, row)
    voluntary, involuntary = (int(x) for x in out.split())
    figures = (summary["context_switches_voluntary"], summary["context_switches_involuntary"])
    assert (int(shown[1]), int(shown[2])) == figures
    # At least one more than its own count: its switch away at its exit (TASK_DEAD);
    # its teardown may wait too (munmap behind a reader of its memory map, the
    # daemon's smaps_rollup under load: 54 for 51 + 1 in one run). Counted twice
    # would be twice its own.
    assert voluntary + 1 <= figures[0] < 2 * voluntary and voluntary >= 50
    assert figures[1] >= involuntary  # a preemption may come after its count


TOUCHER = (
    "import mmap, os, resource\n"
    "area = mmap.mmap(-1, 2000 * mmap.PAGESIZE)\n"
    "for at in range(0, 2000 * mmap.PAGESIZE, mmap.PAGESIZE):\n"
    "    area[at] = 1\n"
    "line = b'%d' % resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "os.write(1, line)\n"
    "os._exit(0)\n"
)


@pytest.mark.parametrize("mode", ["daemon", "local"])
def test_run_shows_the_commands_minor_faults_in_its_table_and_file(
    mode: str, daemon_factory: Any, tmp_path: Path
) -> None:
    # 2000 fresh pages touched: the command's own count, and wait4's of the command
    # (the count and then its line's bytes are new objects, a fresh page at most for
    # each; the write and the exit touch none: 3 runs here showed wait4's equal).
    row = r"faults +(\d+) minor \(no read from storage\)"
    out, shown, summary = _counted_run(mode, daemon_factory, tmp_path, TOUCHER, row)
    own = int(out)
    assert int(shown[1]) == summary["page_faults_minor"]
    # Counted twice would be twice its own.
    assert own >= 2000 and own <= summary["page_faults_minor"] <= own + 16, (own, summary)


def test_signals_are_forwarded_and_exit_status_follows(tmp_path: Path) -> None:
    trap = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [
            *EDGEWATT,
            "run",
            "--socket",
            str(tmp_path / "none.sock"),
            "--",
            sys.executable,
            "-c",
            trap,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 7

    # SIGINT as a terminal leaves it: where the test runner has it ignored (started in
    # the background by a non-interactive shell, or by a test before), the command would
    # inherit that, and an ignored signal stays ignored across exec (nohup's rule, which
    # edgewatt run keeps, as a shell does).
    sleeper = subprocess.Popen(
        [*EDGEWATT, "run", "--socket", str(tmp_path / "none.sock"), "--", "sleep", "30"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: _running(sleeper.pid, "sleep"))  # its command runs, released
    sleeper.send_signal(signal.SIGINT)
    assert sleeper.wait(timeout=20) == 128 + signal.SIGINT  # the shell's convention
    assert sleeper.stderr is not None and "exit status 130" in sleeper.stderr.read()


def _running(pid: int, name: str) -> bool:
    """Whether a child of ``pid`` runs ``name`` (exec'd: edgewatt run holds its fork
    until the command is registered, and forwards signals from then on)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    names = []
    for child in children:
        with contextlib.suppress(FileNotFoundError):
            names.append(Path(f"/proc/{child}/comm").read_text().strip())
    return name in names


def test_command_not_found_is_127(tmp_path: Path) -> None:
    result = run(["run", "--socket", str(tmp_path / "x"), "--", "no-such-command-here"])
    assert result.returncode == 127 and "cannot start no-such-command-here" in result.stderr


def test_run_without_command_or_with_bad_label(tmp_path: Path) -> None:
    assert "no command given" in run(["run"]).stderr
    bad = run(["run", "--label", "novalue", "--", "true"])
    assert bad.returncode == 2 and "--label must be KEY=VALUE" in bad.stderr


def test_run_through_the_daemon_reports_energy(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_IDLE_POWER_W": "4"},
    )
    result = run(
        ["run", "--socket", daemon.socket, "--interval", "0.2", "--", sys.executable, "-c", WORK]
    )
    assert result.returncode == 3
    assert "monitored via daemon" in result.stderr
    energy_line = next(line for line in result.stderr.splitlines() if "device energy" in line)
    joules, wh, watts = re.search(
        r"([\d.]+) J \(([\d.]+) Wh\), avg ([\d.]+) W", energy_line
    ).groups()  # type: ignore[union-attr]
    assert float(wh) == pytest.approx(float(joules) / 3600, abs=1e-4)
    # Constant 16.802 W: energy and time over the same instants, the exit sample's
    # energy taken at the exit the kernel dates, not at the pass that found it later.
    assert float(watts) == pytest.approx(16.802, abs=0.03)
    assert "attributed energy" in result.stderr


def _monitor_file(tmp_path: Path) -> Path:
    code = (
        "import time\n"
        "from edgewatt.client.thread_monitor import FileMonitor\n"
        f"m = FileMonitor({str(tmp_path / 'm.jsonl')!r}, 0.1, records='edgewatt', "
        f"socket={str(tmp_path / 'x')!r})\n"
        "m.start()\n"
        "m.phase('load')\n"
        "x = bytearray(50 * 2**20)\n"
        "for i in range(0, len(x), 4096): x[i] = 1\n"
        "time.sleep(0.5)\n"
        "m.phase('train')\n"
        "end = time.process_time() + 0.6\n"
        "while time.process_time() < end: pass\n"
        "m.stop()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    return tmp_path / "m.jsonl"


def test_report_table_and_phases(tmp_path: Path) -> None:
    path = _monitor_file(tmp_path)
    result = run(["report", str(path)])
    assert result.returncode == 0, result.stderr
    assert "CPU time" in result.stdout and "RSS sum" in result.stdout
    # A monitor's marks: each phase's figures from the samples of the intervals that
    # begin after its mark (edged by samples, as the daemon's phases are).
    rows = {
        cells[0]: cells
        for line in result.stdout.splitlines()
        if line.startswith("    ")
        and (cells := re.split(r" {2,}", line.strip()))[0] in ("load", "train")
    }
    samples = _samples(path)
    phases = [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "phase"]
    times = [s["timestamp"] for s in samples]
    intervals = list(zip(samples[1:], times, times[1:]))
    # The train phase's CPU: its samples' own (CPU % of one core times each interval),
    # the 0.6 s it burnt but what the interval holding its mark took (the load
    # phase's); the load phase holds the 50 MiB it touched.
    cpu = sum(s["cpu_usage"] / 100 * (t1 - t0) for s, t0, t1 in intervals
              if t0 > phases[1]["timestamp"])  # fmt: skip
    assert rows["train"][2] == f"{cpu:.2f} s" and cpu >= 0.45
    assert rows["load"][7].endswith("MiB") and float(rows["load"][7].split()[0]) >= 50
    assert rows["load"][3] == "-"  # no power metric: no energy, not 0 J


def test_report_of_a_killed_run_and_of_a_bad_file(tmp_path: Path) -> None:
    path = _monitor_file(tmp_path)
    truncated = tmp_path / "cut.jsonl"
    truncated.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # no summary
    result = run(["report", str(truncated)])
    assert result.returncode == 0 and "CPU time" in result.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\nnot json\n")
    result = run(["report", str(bad)])
    assert result.returncode == 1
    assert result.stderr == (
        f"edgewatt report: {bad}:2: not a JSON record (Expecting value at column 1)\n"
    )


@pytest.mark.parametrize("variant", ["thread_monitor", "process_monitor"])
def test_heflwr_script_runs_unchanged(variant: str, tmp_path: Path) -> None:
    # heflwr's quick start, with only the import changed; no __main__ guard.
    script = tmp_path / "train.py"
    script.write_text(
        f"from edgewatt.client.{variant} import FileMonitor\n"
        "monitor = FileMonitor(file='./log.txt', interval=0.2)\n"
        "monitor.start()\n"
        "sum(i * i for i in range(10_000_000))\n"
        "monitor.stop()\n"
        "detail = monitor.stats()\n"
        "summary = monitor.summary()\n"
        "print(sorted(detail))\n"
        "print(sorted(summary))\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "EDGEWATT_SOCKET": str(tmp_path / "x"),
        },
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    detail_keys, summary_keys = result.stdout.splitlines()
    assert "'cpu_usage'" in detail_keys and "'network_bytes_sent'" in detail_keys
    assert "'avg_cpu_usage'" in summary_keys and "'total_network_bytes_recv'" in summary_keys
    # heflwr's text log: a date line, then one line per sample.
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", lines[0]), lines
    assert lines[1].startswith("CPU Usage: ") and len(lines) >= 2


def test_a_monitors_device_energy_is_one_figure(daemon_factory: Any, tmp_path: Path) -> None:
    # The board input rail and the device are one energy: from the device's counter.
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_IDLE_POWER_W": "4"},
    )
    from edgewatt.client.thread_monitor import FileMonitor

    monitor = FileMonitor(str(tmp_path / "m.jsonl"), 0.2, records="edgewatt", socket=daemon.socket)
    monitor.set_metrics(power=True)
    monitor.start()
    wait_for(lambda: len(monitor.stats().get("energy_j", [])) >= 3)  # samples with energy
    monitor.stop()
    summary = monitor.summary()
    assert summary["energy_j"] > 0
    assert summary["energy_vdd_in_j"] == summary["energy_j"]
    assert summary["total_power_vdd_in"] == pytest.approx(summary["energy_j"] * 1000)
    # At most 16.802 W over the run (less where the daemon's first sensor line came
    # after the monitor's first reading).
    assert summary["energy_j"] <= 16.802 * summary["duration_s"] * 1.05


def _drawn(path: Path, tmp_path: Path) -> Layout:
    """Render ``path`` as a user would, and return what the plot shows."""
    png = tmp_path / (path.stem + ".png")
    result = run(["report", str(path), "--plot", str(png)])
    assert result.returncode == 0, result.stderr
    assert f"plot written to {png}" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    header, samples, phases, summary = load(str(path))
    summary = summary or summary_from_samples(samples, header.get("started_at"))
    return layout(header, samples, phases, summary)


def _samples(path: Path) -> list[dict[str, Any]]:
    return load(str(path))[1]


def _labels(drawn: Layout) -> list[str]:
    return [label for label, _ in drawn.panels]


def _all_times(drawn: Layout) -> list[float]:
    return [x for _, lines in drawn.panels for _, xs, _ in lines for x in xs]


def test_plot_of_a_run_file_without_phases_or_power(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run(
        ["run", "--socket", str(tmp_path / "none.sock"), "--interval", "0.1", "--output",
         str(out), "--", sys.executable, "-c", "import time; time.sleep(0.6)"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    drawn = _drawn(out, tmp_path)
    command = f"{sys.executable} -c 'import time; time.sleep(0.6)'"
    title, figures = drawn.title.split("\n")
    assert title == (command if len(command) <= 70 else command[:67] + "...")
    assert figures.startswith(f"on {socket.gethostname()}, 20")
    # In-process, nothing counts the command's own bytes: no network panel; the
    # host's bytes only under host_ names in the rows, never drawn as the command's.
    rows = _samples(out)
    assert rows and all("network_bytes_sent" not in row for row in rows), rows
    assert all("host_network_bytes_sent" in row for row in rows), rows
    assert _labels(drawn) == ["CPU (% of one core)", "memory (MiB)"]
    # The host's bytes are not the command's, and nothing sampled the command's own.
    assert "network" not in drawn.title
    assert drawn.phases == []
    assert min(_all_times(drawn)) >= 0 and 0.5 < drawn.end_s < 1.5


def test_plot_of_a_monitor_file_with_phases(tmp_path: Path) -> None:
    drawn = _drawn(_monitor_file(tmp_path), tmp_path)
    assert [name for name, _, _ in drawn.phases] == ["load", "train"]
    (_, load_start, load_end), (_, train_start, train_end) = drawn.phases
    # Phases start at or after 0 and tile the run: each ends where the next begins.
    assert 0 <= load_start < load_end == train_start < train_end == drawn.end_s
    # The script's own command line, as the kernel has it (python -c and the code).
    command = f"{sys.executable} -c import time from edgewatt.client.thread_monitor"
    assert drawn.title.startswith(command[:67])  # titles cut commands at 70 characters
    rss = dict(drawn.panels)["memory (MiB)"][0][2]
    assert max(rss) > 50  # the 50 MiB it touched


def test_plot_of_a_file_with_device_power(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_IDLE_POWER_W": "4"},
    )
    out = tmp_path / "power.jsonl"
    result = run(
        ["run", "--socket", daemon.socket, "--interval", "0.2", "--label", "run=p1", "--output",
         str(out), "--", sys.executable, "-c", "import time; time.sleep(1.5)"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    drawn = _drawn(out, tmp_path)
    # The last of the run's panels (the host's bytes, where any, apart below).
    assert [x for x in _labels(drawn) if "host" not in x][-1] == "device power (W)"
    name, xs, watts = dict(drawn.panels)["device power (W)"][0]
    assert name == "mean power of each interval" and watts
    # Its area is the file's energy, its mean over time the title's average: the stand-in's
    # constant 16.802 W (one interval may differ by the sensor's period it holds).
    area = sum((x1 - x0) * w for x0, x1, w in zip(xs[::2], xs[1::2], watts[::2]))
    summary = load(str(out))[3]
    assert summary is not None
    # The summary's is the daemon's, settled at the run's edges and given to the mJ; the
    # samples' are each pass's as known then: at a constant power, the same energy.
    assert area == pytest.approx(summary["energy_j"], abs=0.001)
    mean = area / sum(x1 - x0 for x0, x1 in zip(xs[::2], xs[1::2]))
    assert mean == pytest.approx(summary["avg_power_w"], rel=1e-3)  # wall and monotonic
    assert mean == pytest.approx(16.802, abs=0.03)
    assert (
        f"device energy {amount(summary['energy_j'], 1)} J (avg {summary['avg_power_w']:.2f} W)"
        in (drawn.title)
    )


def test_plot_of_a_killed_run_without_a_summary(tmp_path: Path) -> None:
    path = _monitor_file(tmp_path)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    drawn = _drawn(cut, tmp_path)
    assert "CPU" in drawn.title and [n for n, _, _ in drawn.phases] == ["load", "train"]


@pytest.mark.parametrize(
    ("counts", "label", "what"),
    [
        ("tcp-payload", "network", f"TCP bytes, the command's, across its boundary; {ESCAPES}"),
        (
            "ip-bytes",
            "network",
            "IP bytes of every connection, headers included, across its boundary",
        ),
        ("interface-bytes", "network", "frames on its network namespace's interfaces"),
        (
            "ip-bytes+interface-bytes",
            "network",
            "IP bytes, and the frames of a namespace it may not enter",
        ),
    ],
)
def test_the_report_says_what_its_network_figures_count(counts: str, label: str, what: str) -> None:
    summary = {
        "network_transmit_bytes": 1024,
        "network_receive_bytes": 2048,
        "network_counts": counts,
    }
    rows = [line.split(maxsplit=1) for line in summary_table(summary, "t").splitlines()[1:]]
    assert [label, f"sent 1.0 KiB, received 2.0 KiB ({what})"] in rows


def test_a_daemon_lost_mid_run_is_said_with_where_the_figures_came_from(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(interval=0.2)
    # Waits for a line, then burns 0.5 s of CPU: the daemon is killed in between.
    code = (
        "import sys, time\n"
        "print('up', flush=True)\n"
        "sys.stdin.readline()\n"
        "end = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\n"
    )
    run = subprocess.Popen(  # a process target: the title ends with where figures came from
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--no-cgroup", "--",
         sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert run.stdin is not None and run.stdout is not None and run.stderr is not None
    assert run.stdout.readline() == "up\n"
    before = time.time()
    daemon.stop(signal.SIGKILL)
    # edgewatt run's next reading finds the daemon gone and says so (a warning).
    warning = run.stderr.readline()
    after = time.time()
    assert "stopped answering" in warning and "in-process" in warning, warning
    _, stderr = run.communicate("go\n", timeout=60)
    assert run.returncode == 0, stderr
    title = next(line for line in stderr.splitlines() if line.startswith("edgewatt run:"))
    assert "monitored via daemon)" not in title, title
    lost = re.search(
        r"monitored via daemon until (\d\d:\d\d:\d\d) UTC \(it stopped answering", title
    )
    assert lost is not None and title.endswith("then in-process)"), title
    seconds = [
        time.strftime("%H:%M:%S", time.gmtime(t)) for t in range(int(before), int(after) + 1)
    ]
    assert lost[1] in seconds, (title, before, after)
    # The command's CPU from the kernel's count of it, which the lost daemon cannot give.
    assert re.search(r"^  counted by\s+kernel \(wait4", stderr, re.M), stderr
    cpu = float(re.search(r"CPU time +([\d.]+) s", stderr)[1])  # type: ignore[index]
    assert 0.5 <= cpu <= 0.8, stderr


def _write(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


HEADER = {"type": "header", "host": "board", "pid": 7, "command": "python train.py",
          "labels": {}, "started_at": 1000.0,
          "metrics": {"cpu": True, "memory": True, "network": False, "power": True}}  # fmt: skip


def _sample(t: float, **figures: float) -> dict[str, Any]:
    return {"type": "sample", "timestamp": t, **figures}


def test_a_cut_off_last_line_is_skipped_with_one_warning(tmp_path: Path) -> None:
    whole = _monitor_file(tmp_path).read_text()
    # The run ended mid-write (a board that lost power): its summary line cut short.
    cut = tmp_path / "cut.jsonl"
    cut.write_text(whole[: whole.rindex('"type": "summary"') + 30])
    number = cut.read_text().count("\n") + 1
    result = run(["report", str(cut), "--plot", str(tmp_path / "cut.png")])
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        f"edgewatt report: warning: {cut}:{number}: the last line is cut off (31 bytes without "
        "a newline); skipped\n"
    )
    # The figures from the samples before it, the phases as recorded.
    header, samples, _, _ = load(str(cut))
    cpu = summary_from_samples(samples, header["started_at"])["cpu_time_s"]
    assert f"CPU time  {amount(cpu, 2)} s" in result.stdout
    names = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ")]
    assert names[:3] == ["phase", "load", "train"]  # the phase table's header and rows


@pytest.mark.parametrize(
    ("record", "said"),
    [
        (_sample(1001.0, cpu_usage="high"), "cpu_usage must be a number, got 'high'"),
        (_sample(1001.0, energy_j=float("nan")), "energy_j must be a number, got nan"),
        ({"type": "sample", "cpu_usage": 3.0}, "a sample without its timestamp"),
        ({"type": "phase", "name": 5, "timestamp": 1001.0}, "a phase needs a name and a timestamp"),
        (
            {"type": "phase", "name": "epoch-1", "timestamp": 1001.0, "device_energy_j": "9 J"},
            "device_energy_j must be a number, got '9 J'",
        ),
        (
            {"type": "phase", "name": "epoch-1", "timestamp": 1001.0, "ended_at": [1002]},
            "ended_at must be a number, got [1002]",
        ),
        ({"type": "summary", "duration_s": "1.5"}, "duration_s must be a number, got '1.5'"),
        # Hostile or impossible: each was a traceback or a figure no device can have.
        (
            _sample(1001.0, memory_rss_bytes=10**3999),
            "memory_rss_bytes must be a number, got an integer of 4000 digits",
        ),
        (_sample(1001.0, network_bytes_sent=-5), "network_bytes_sent must be 0 to 9e+18, got -5"),
        (_sample(-1e308), "timestamp must be a Unix time from 1970 to 2106, got -1e+308"),
        (
            {"type": "summary", "duration_s": 1e300},
            "duration_s must be 0 to 4294967296 s, got 1e+300",
        ),
        ({"type": "summary", "energy_j": -1e300}, "energy_j must be within +-9e+18, got -1e+300"),
        ([1, 2], "not a record (not a JSON object)"),
        ({"cpu_usage": 3.0}, "not an edgewatt monitor record (no type)"),
    ],
)
def test_a_bad_field_is_an_error_naming_file_and_line(
    record: Any, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(HEADER) + "\n" + json.dumps(_sample(1000.5, cpu_usage=1.0)) + "\n"
        + json.dumps(record) + "\n" + json.dumps(_sample(1002.0, cpu_usage=1.0)) + "\n"
    )  # fmt: skip
    png = tmp_path / "bad.png"
    result = run(["report", str(path), "--plot", str(png)])
    assert result.returncode == 1
    assert result.stderr == f"edgewatt report: {path}:3: {said}\n"  # never a traceback
    assert result.stdout == "" and not png.exists()


@pytest.mark.parametrize(
    ("field", "said"),
    [
        ({"command": ["python", "train.py"]}, "command must be a string (the command line)"),
        ({"started_at": -1e308}, "started_at must be a Unix time from 1970 to 2106, got -1e+308"),
        ({"units": "bytes"}, "units must be an object"),
    ],
)
def test_a_hostile_header_is_an_error_naming_its_field(
    field: dict[str, Any], said: str, tmp_path: Path
) -> None:
    path = tmp_path / "hostile.jsonl"
    path.write_text(
        json.dumps({**HEADER, **field}) + "\n"
        + json.dumps(_sample(1000.5, cpu_usage=1.0)) + "\n"
        + json.dumps(_sample(1002.0, cpu_usage=1.0)) + "\n"
    )  # fmt: skip
    png = tmp_path / "hostile.png"
    result = run(["report", str(path), "--plot", str(png)])
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr == f"edgewatt report: {path}:1: {said}\n"  # never a traceback
    assert not png.exists()


def test_a_line_that_is_not_utf8_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        json.dumps(HEADER).encode() + b"\n"
        + b'{"type": "phase", "name": "\xe9poque", "timestamp": 1001.0}\n'
        + json.dumps(_sample(1002.0, cpu_usage=1.0)).encode() + b"\n"
    )  # fmt: skip
    result = run(["report", str(path)])
    assert result.returncode == 1
    assert result.stderr == (
        f"edgewatt report: {path}:2: not UTF-8 text (byte 0xe9 at column 28)\n"
    )


def test_an_empty_or_header_only_file_is_an_error_and_no_plot(tmp_path: Path) -> None:
    for name, text, what in (
        ("empty.jsonl", "", "no records"),
        ("blank.jsonl", "\n\n", "no records"),
        ("header.jsonl", json.dumps(HEADER) + "\n", "only a header"),
    ):
        path = tmp_path / name
        path.write_text(text)
        png = tmp_path / (name + ".png")
        result = run(["report", str(path), "--plot", str(png)])
        assert result.returncode == 1, name
        assert result.stderr == f"edgewatt report: {path}: {what}, no samples: nothing to report\n"
        assert result.stdout == "" and not png.exists()


def test_the_power_panel_is_each_intervals_energy_over_its_length(tmp_path: Path) -> None:
    # Readings of 16 W at each sample's instant, but 10, 20 and 5 J over intervals of
    # 1, 1 and 2 s: 35 J in 4 s, 8.75 W (the instants' mean, 16 W, is not the energy's).
    path = _write(tmp_path / "p.jsonl", [
        HEADER,
        _sample(1001.0, cpu_usage=10.0, power_w=16.0, energy_j=10.0),
        _sample(1002.0, cpu_usage=10.0, power_w=16.0, energy_j=20.0),
        {"type": "phase", "name": "train", "timestamp": 1002.0},
        _sample(1004.0, cpu_usage=10.0, power_w=16.0, energy_j=5.0),
    ])  # fmt: skip
    drawn = _drawn(path, tmp_path)
    assert dict(drawn.panels)["device power (W)"] == [
        ("mean power of each interval", [0.0, 1.0, 1.0, 2.0, 2.0, 4.0],
         [10.0, 10.0, 20.0, 20.0, 2.5, 2.5])
    ]  # fmt: skip
    assert "4.0 s, CPU 0.40 s, device energy 35.0 J (avg 8.75 W)" in drawn.title
    assert drawn.phases == [("train", 2.0, 4.0)]


def test_a_single_sample_is_drawn_as_a_point_and_the_axes_hold_the_peaks(
    tmp_path: Path,
) -> None:
    from edgewatt.cli.report import draw

    # What `edgewatt run --output` writes for a command shorter than its interval.
    out = tmp_path / "true.jsonl"
    result = run(["run", "--socket", str(tmp_path / "none.sock"), "--output", str(out), "--",
                  "true"])  # fmt: skip
    assert result.returncode == 0, result.stderr
    _, samples, _, summary = load(str(out))
    assert len(samples) == 1
    drawn = _drawn(out, tmp_path)
    figure = draw(drawn)
    # One point per curve says nothing: the run's cost as bars, its
    # CPU the kernel's count.
    assert summary is not None and drawn.bars
    assert [p.get_height() for p in figure.axes[0].patches] == [summary["cpu_time_s"]]
    assert drawn.costs[0].cpu_s == summary["cpu_time_s"]
    # No pass saw it: its title's memory is the kernel's record at its exit (never the
    # peak of edgewatt run's fork before the exec, 18 MiB of Python).
    assert summary["memory_rss_peak_bytes"] is None
    peak = summary.get("memory_rss_largest_peak_bytes")
    if peak is None:  # no taskstats (not root): wait4's bound, said in the table
        assert "is at most" in summary["memory_unmeasured"]
    else:
        assert 0 < peak < 8 << 20
        assert f", largest process's peak RSS {human_bytes(peak)} at exit" in drawn.title
    # A file whose summary peak is above every sample: the axis still holds it.
    path = _write(tmp_path / "peak.jsonl", [
        HEADER,
        _sample(1001.0, memory_rss_bytes=10 * 2**20),
        _sample(1002.0, memory_rss_bytes=12 * 2**20),
        {"type": "summary", "samples": 2, "duration_s": 2.0, "memory_rss_peak_bytes": 20 * 2**20},
    ])  # fmt: skip
    drawn = _drawn(path, tmp_path)
    assert drawn.levels == [("memory (MiB)", 20.0, "RSS summed peak 20.0 MiB")]
    assert draw(drawn).axes[0].get_ylim() == (0.0, pytest.approx(20.0 * 1.12))
    # With PSS drawn too, its peak is named as its line is.
    path = _write(tmp_path / "pss.jsonl", [
        HEADER,
        _sample(1001.0, memory_rss_bytes=10 * 2**20, memory_pss_bytes=4 * 2**20),
        _sample(1002.0, memory_rss_bytes=12 * 2**20, memory_pss_bytes=5 * 2**20),
        {"type": "summary", "samples": 2, "duration_s": 2.0, "memory_rss_peak_bytes": 20 * 2**20,
         "memory_pss_peak_bytes": 9 * 2**20},
    ])  # fmt: skip
    drawn = _drawn(path, tmp_path)
    assert drawn.levels == [
        ("memory (MiB)", 20.0, "RSS summed peak 20.0 MiB"),
        ("memory (MiB)", 9.0, "PSS peak 9.0 MiB"),
    ]
    if os.environ.get("EDGEWATT_TEST_PLOTS"):
        draw(drawn).savefig(f"{os.environ['EDGEWATT_TEST_PLOTS']}/pss-levels.png", dpi=100)


def test_a_second_run_appended_to_a_file_is_reported_alone(tmp_path: Path) -> None:
    out = tmp_path / "twice.jsonl"
    for seconds in ("0.3", "0.6"):
        done = run(["run", "--socket", str(tmp_path / "none.sock"), "--interval", "0.1",
                    "--output", str(out), "--", "sleep", seconds])  # fmt: skip
        assert done.returncode == 0, done.stderr
    second = next(i for i, line in enumerate(out.read_text().splitlines(), 1)
                  if i > 1 and '"type": "header"' in line)  # fmt: skip
    result = run(["report", str(out), "--plot", str(tmp_path / "twice.png")])
    assert result.returncode == 0, result.stderr
    header, samples, _, summary = load(str(out))
    assert result.stderr == (
        f"edgewatt report: warning: {out}:{second}: another run appended (pid {header['pid']} "
        f"after pid {json.loads(out.read_text().splitlines()[0])['pid']}); reporting the last, "
        "from this line\n"
    )
    assert header["command"] == "sleep 0.6" and summary is not None
    assert f"duration    {amount(summary['duration_s'], 1)} s" in result.stdout
    assert all(s["timestamp"] >= header["started_at"] for s in samples)


def test_a_thousand_phases_keep_the_table_and_the_plot_readable(tmp_path: Path) -> None:
    # A function tracked at each training step is a phase: 1,000 of them (the daemon's
    # bound), one sample each, 1 s and 10 J apiece, the newest with 7 MiB.
    records: list[dict[str, Any]] = [HEADER]
    for i in range(1000):
        records.append({"type": "phase", "name": f"step-{i}", "timestamp": 1000.0 + i})
        records.append(_sample(1001.0 + i, cpu_usage=50.0, energy_j=10.0,
                               memory_rss_bytes=(i + 1) * 7 * 2**10))  # fmt: skip
    path = _write(tmp_path / "steps.jsonl", records)
    png = tmp_path / "steps.png"
    result = run(["report", str(path), "--plot", str(png)])
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("    step-")]
    # The newest 30, each with its own interval's figures, then what was left out.
    assert [r[0] for r in rows] == [f"step-{i}" for i in range(970, 1000)]
    assert rows[-1][1:9] == ["1.00", "s", "0.50", "s", "10.0", "J", "-", "10.00"]
    assert "the newest 30 phases of 1000; the JSON lists every one" in result.stdout
    header, samples, phases, _ = load(str(path))
    drawn = layout(header, samples, phases, summary_from_samples(samples, 1000.0))
    assert len(drawn.phases) == 1000
    from edgewatt.cli.report import draw

    figure = draw(drawn)
    # No name written over a phase too narrow for it; the key names the newest 40.
    assert [t.get_text() for t in figure.axes[0].texts] == []
    assert len(figure.axes[0].patches) == 1000  # every phase shaded
    cells = figure.axes[-1].tables[0].get_celld().values()
    keyed = [c.get_text().get_text() for c in cells if c.get_text().get_text().startswith("step")]
    assert keyed == [f"step-{i}" for i in range(960, 1000)]
    # One memory line still says which memory it is.
    memory = figure.axes[[label for label, _ in drawn.panels].index("memory (MiB)")]
    assert [t.get_text() for t in memory.get_legend().get_texts()] == ["RSS summed"]
    if os.environ.get("EDGEWATT_TEST_PLOTS"):
        figure.savefig(f"{os.environ['EDGEWATT_TEST_PLOTS']}/thousand-phases.png", dpi=100)


def test_the_picture_says_what_each_phase_cost(tmp_path: Path) -> None:
    """30 phases: each shaded in a colour of its own and keyed below
    with its seconds, CPU and joules (device and attributed), as the table has them."""
    from edgewatt.cli.report import draw

    records: list[dict[str, Any]] = [HEADER]
    for i in range(30):
        records.append({"type": "phase", "name": f"round-{i}", "timestamp": 1000.0 + 2 * i,
                        "ended_at": 1002.0 + 2 * i, "duration_s": 2.0, "cpu_user_s": i / 10,
                        "cpu_system_s": 0.05, "device_energy_j": 20.0 + i,
                        "energy_j": i / 4})  # fmt: skip
    for t in range(61):
        records.append(_sample(1000.0 + t, cpu_usage=50.0, energy_j=10.0))
    path = _write(tmp_path / "rounds.jsonl", records)
    drawn = _drawn(path, tmp_path)
    assert [c.name for c in drawn.costs] == [f"round-{i}" for i in range(30)]
    figure = draw(drawn)
    shaded = [tuple(p.get_facecolor()[:3]) for p in figure.axes[0].patches]
    assert len(shaded) == 30 and len(set(shaded)) == 30  # no colour cycles
    rows: dict[str, list[str]] = {}
    for (row, column), cell in figure.axes[-1].tables[0].get_celld().items():
        rows.setdefault(str(row), [""] * 6)[column] = cell.get_text().get_text()
    keyed = {r[1]: r[2:] for r in rows.values() if r[1].startswith("round-")}
    assert keyed == {
        f"round-{i}": [f"{2.0:.3f}", f"{i / 10 + 0.05:.3f}", f"{20.0 + i:.2f}", f"{i / 4:.2f}"]
        for i in range(30)
    }
    # The key's swatch is the colour its phase is shaded in.
    cells = sorted(figure.axes[-1].tables[0].get_celld().items())
    swatches = [tuple(c.get_facecolor()[:3]) for (r, col), c in cells if col == 0 and r > 0]
    assert swatches == shaded
    if os.environ.get("EDGEWATT_TEST_PLOTS"):
        figure.savefig(f"{os.environ['EDGEWATT_TEST_PLOTS']}/thirty-phases.png", dpi=100)


@pytest.mark.parametrize("scope", ["host", "process"])
def test_the_network_panel_and_title_say_whose_bytes_they_are(scope: str) -> None:
    """A file's network bytes are the host's (edgewatt run's monitor, heflwr's) or the
    process's (the heflwr drop-ins' process scope), as its header's units say: the
    axis and the title name the host's as such (a run's plot once drew a pip install
    beside it as if the command had received 40 MiB)."""
    from edgewatt.client._samples import units

    header = {"type": "header", "started_at": 100.0, "units": units(scope)}
    samples = [
        {"timestamp": 100.0 + i, "cpu_usage": 10.0, "network_bytes_sent": 2048 * i,
         "network_bytes_recv": 1024} for i in (1, 2)
    ]  # fmt: skip
    drawn = layout(header, samples, [], summary_from_samples(samples, started_at=100.0))
    whose = "host network" if scope == "host" else "network"
    assert [label for label, _ in drawn.panels] == ["CPU (% of one core)", f"{whose} (KiB/s)"]
    [(_, _, sent), (_, _, received)] = dict(drawn.panels)[f"{whose} (KiB/s)"]
    assert (sent, received) == ([2.0, 4.0], [1.0, 1.0])
    # The host's bytes are not the command's: never in the title.
    assert ("network sent 6.0 KiB, received 2.0 KiB" in drawn.title) == (scope == "process")


# Fills the filesystem it is given, then works on for ~30 samples (more than the
# output's page already allocated holds) and exits 0.
FILL_THEN_WORK = """
import sys, time
try:
    with open(sys.argv[1], "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()
except OSError:
    pass
end = time.monotonic() + 3.0
while time.monotonic() < end:
    pass
"""


def test_an_output_on_a_full_disk_fails_the_run_and_says_what_it_kept(
    small_tmpfs: Path,
) -> None:
    output = small_tmpfs / "run.jsonl"
    result = run(
        ["run", "--socket", str(small_tmpfs / "none.sock"), "--interval", "0.1",
         "--output", str(output), "--", sys.executable, "-c", FILL_THEN_WORK,
         str(small_tmpfs / "filler")],
    )  # fmt: skip
    # The command succeeded; the file is not whole: EX_IOERR, and why.
    assert result.returncode == 74, result.stderr
    said = re.search(
        r"edgewatt run: --output incomplete: writing (\S+) failed \(No space left on device\): "
        r"it holds this run's first (\d+) lines, nothing after\n",
        result.stderr,
    )
    assert said is not None and said.group(1) == str(output), result.stderr
    assert "samples written to" not in result.stderr
    # What it kept is whole records, that many: no line cut (report warns of none).
    text = output.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == int(said.group(2)) >= 1
    assert json.loads(text.splitlines()[0])["type"] == "header"
    assert '"type": "summary"' not in text
    (small_tmpfs / "filler").unlink()
    shown = run(["report", str(output)])
    assert "cut off" not in shown.stderr, shown.stderr
