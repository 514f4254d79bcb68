"""Every command in the README, run as written: the Python example saved as train.py,
the ```sh blocks against a real daemon (with the stand-in tegrastats), `make run`; the
```console blocks that cannot run here are each named with the test that covers them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, fetched, free_port, wait_for
from tests.test_containers import AVAILABLE as CONTAINERS
from tests.test_containers import IMAGE, LIMITS, build_image, podman

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)

# Commands a test run cannot carry out here, and where they are proved instead.
COVERED_ELSEWHERE = {
    "pip install /path/to/edgewatt": "tests/test_layers.py installs the wheel in a fresh venv",
    "pipx install /path/to/edgewatt": "deploy/systemd/container-check.sh (pipx, pipx --global)",
    "make test": "this very run",
    'make run ARGS="--tegrastats tests/bin/tegrastats"': "run below, the stand-in's power read",
    'sudo "$(command -v edgewatt)" install-service': "container-check.sh, tests/test_systemd.py",
    "edgewatt status": "run in the ```sh block below it, against a daemon",
}


def commands(language: str) -> list[str]:
    found = []
    for lang, body in BLOCKS:
        if lang == language:
            for line in body.splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command:
                    found.append(command)
    return found


def shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=120,
    )  # fmt: skip


def user_env(socket: str) -> dict[str, str]:
    # A user's shell with the environment activated: `edgewatt` and `python` are its.
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "EDGEWATT_SOCKET": socket,
    }


def test_every_console_command_is_run_here_or_covered_elsewhere() -> None:
    console = commands("console")
    assert "make run" in console
    assert set(console) - {"make run"} == set(COVERED_ELSEWHERE)


def test_the_example_and_every_sh_command_run_as_written(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", str(ROOT / "tests" / "bin" / "tegrastats")],
        env={"FAKE_TEGRASTATS_MODEL": "AGX Orin", "EDGEWATT_IDLE_POWER_W": "4"},
    )
    env = user_env(daemon.socket)
    [example] = [body for lang, body in BLOCKS if lang == "python"]
    (tmp_path / "train.py").write_text(example)
    ran = subprocess.run(
        [sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert ran.returncode == 0, ran.stderr
    match = re.fullmatch(r"([\d.]+) s CPU, ([\d.]+) J\n", ran.stdout)
    assert match, ran.stdout
    cpu, joules = match.groups()
    assert float(cpu) > 0.05 and float(joules) > 0
    assert ran.stderr == ""  # a daemon answered: no fallback warning

    run_cmd, report_cmd, status_cmd, curl_cmd, doctor_cmd = commands("sh")[:5]
    result = shell(run_cmd, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "(exit status 0, monitored via daemon)" in result.stderr
    assert re.search(r"device energy +[\d.]+ J", result.stderr)
    result = shell(report_cmd, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    picture_is_informative(tmp_path / "run.jsonl")

    # "See what it measured", while the training script runs.
    training = subprocess.Popen(
        [sys.executable, "-c",
         "from edgewatt import client; import time\n"
         "r = client.register(labels={'run': 'demo'}); print(r.mode, flush=True)\n"
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        assert training.stdout is not None and training.stdout.readline() == "daemon\n"
        result = shell(status_cmd, tmp_path, env)
        assert result.returncode == 0 and "run=demo" in result.stdout, result.stderr
        result = shell(curl_cmd.replace(":9464", f":{daemon.port}"), tmp_path, env)
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 3 and 'run="demo"' in result.stdout
        result = shell(doctor_cmd, tmp_path, env)
        assert result.stdout.startswith(f"ok    daemon answering at {daemon.socket}")
    finally:
        training.kill()
        training.wait()


def picture_is_informative(path: Path) -> None:
    """The README's picture from the README's run, as the plot lays it out: its six
    phases shaded and named, each epoch's CPU the 1.5 s the script burns as the kernel
    counts it and its memory 50 MiB above the last's, and curves of CPU, memory and the
    device's power over them (at --interval 0.2 the run lasts 6 s at least, 30 samples
    on time: at least half of them on a busy machine)."""
    from edgewatt.cli.report import POWER, RSS, layout, load
    from tests.test_one_target import README_PHASES

    header, samples, phases, summary = load(str(path))
    assert summary is not None and summary["duration_s"] >= 6.0
    assert [p["name"] for p in phases] == README_PHASES
    epochs = [p for p in phases if p["name"].startswith("epoch-")]
    for epoch in epochs:
        assert epoch["cpu_user_s"] + epoch["cpu_system_s"] >= 1.5 - 0.02, epoch
    for before, after in zip(epochs, epochs[1:]):
        grown = after["memory_rss_peak_bytes"] - before["memory_rss_peak_bytes"]
        assert grown >= 50 * 2**20, (before, after)
    drawn = layout(header, samples, phases, summary)
    assert [name for name, _, _ in drawn.phases] == README_PHASES
    panels = dict(drawn.panels)
    assert {"CPU (% of one core)", RSS, POWER} <= set(panels), list(panels)
    for label in ("CPU (% of one core)", RSS, POWER):
        points = [len(xs) for _, xs, _ in panels[label]]
        assert sum(points) >= 15, (label, points)
    # The memory held, never a drop to 0 B where the last pass found the command exited
    # and not yet reaped (no page held is no reading): at least a Python interpreter's.
    for name, _, ys in panels[RSS]:
        assert min(ys) >= 4, (name, min(ys))
    assert summary["memory_rss_min_bytes"] >= 4 * 2**20, summary["memory_rss_min_bytes"]
    assert len(samples) >= 15


@pytest.mark.parametrize("args", ["", "--tegrastats tests/bin/tegrastats"])
def test_make_run_serves_on_its_embedded_defaults(args: str, tmp_path: Path) -> None:
    # As written, in the checkout; only where it listens is moved out of the way. With
    # the stand-in, the quick start's power on a machine without a sensor.
    socket = tmp_path / "ew.sock"
    port = free_port()
    env = {
        **os.environ,
        "EDGEWATT_SOCKET": str(socket),
        "EDGEWATT_LISTEN": f"127.0.0.1:{port}",
        "EDGEWATT_STATE_DIR": str(tmp_path / "state"),
    }
    make = subprocess.Popen(
        ["make", "run", *([f"ARGS={args}"] if args else [])], cwd=ROOT, env=env,
        start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(socket.exists, timeout=120)
        from edgewatt.core import transport

        health = wait_for(lambda: _health(transport, str(socket)), timeout=30)
        assert health["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b'service_name="edgewatt"' in r.read()
        if args:  # the device's power, from the stand-in's replayed lines
            wait_for(lambda: _power(port), timeout=30)
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.communicate(timeout=30)
    assert not socket.exists()  # nothing left behind: the socket goes with the daemon


def _power(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return re.search(rb"^hw_host_power_watts\{.*\} [1-9]", r.read(), re.M) is not None


def _health(transport: Any, path: str) -> Any:
    try:
        return transport.call_ok(path, "GET", "/healthz")
    except OSError:
        return None


@pytest.mark.skipif(not CONTAINERS, reason="needs root, cgroup v2, nftables and podman")
def test_the_container_commands_run_as_written(daemon: Any, tmp_path: Path) -> None:
    register_cmd, summary_cmd, run_cmd = commands("sh")[5:]
    env = user_env(daemon.socket)
    [example] = [body for lang, body in BLOCKS if lang == "python"]
    (tmp_path / "train.py").write_text(example)
    tar = build_image(tmp_path)
    podman("import", str(tar), IMAGE)
    podman("rm", "-f", "fl-client", check=False)
    podman("run", "-d", "--name", "fl-client", *LIMITS, IMAGE, "/bin/sleep", "120")
    try:
        registered = shell(register_cmd, tmp_path, env)
        assert registered.returncode == 0, registered.stderr
        target_id = registered.stdout.strip()
        shown = shell(summary_cmd.replace("ID", target_id), tmp_path, env)
        assert shown.returncode == 0, shown.stderr
        assert "container fl-client (running, cgroup)" in shown.stdout
    finally:
        podman("rm", "-f", "-t", "0", "fl-client", check=False)
    ran = shell(run_cmd, tmp_path, env)
    assert ran.returncode == 0, ran.stderr
    assert ", cgroup /edgewatt/run-" in ran.stderr
    assert re.search(r"CPU time +[\d.]+ s", ran.stderr)


def test_the_heflwr_imports_are_heflwrs_with_edgewatt_client_for_heflwr_monitor() -> None:
    """Each import the README gives heflwr users runs, and together they
    name every monitor module of the real heflwr 0.1.91 with its classes (a reader once
    imported `thread_monitor` from `process_monitor`)."""
    fetched(ROOT / ".cache" / "heflwr", "bin/python", "heflwr 0.1.91", "fetch-heflwr")
    [package] = (ROOT / ".cache" / "heflwr" / "lib").glob("python*/site-packages/heflwr/monitor")
    theirs = {
        module.parent.name: sorted(re.findall(r"import (\w+Monitor)$", module.read_text(), re.M))
        for module in package.glob("*/__init__.py")
        if "Monitor" in module.read_text()
    }
    paragraph = README[README.index("heflwr users:") :].split("\n\n")[0]
    imports = re.findall(r"`(from edgewatt\.client\.(\w+) import ([\w, ]+))`", paragraph)
    for line, _, _ in imports:
        subprocess.run([sys.executable, "-c", line], check=True, cwd=ROOT)
    named = {module: sorted(names.split(", ")) for _, module, names in imports}
    for module in theirs:  # "or the same from edgewatt.client.thread_monitor"
        named.setdefault(module, next(iter(named.values())))
        assert f"edgewatt.client.{module}" in paragraph
    assert named == theirs
