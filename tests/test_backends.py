"""The client's two in-process backends: how one is chosen, and that they agree.

This file, like every client test, also runs with EDGEWATT_CLIENT_BACKEND=psutil
(`make test` runs the client tests twice)."""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgewatt.core import platforms
from tests.conftest import ROOT


def test_a_forced_backend_wins_and_a_bad_one_is_named(caplog: pytest.LogCaptureFixture) -> None:
    assert platforms.choose({"EDGEWATT_CLIENT_BACKEND": "psutil"}) == "psutil"
    assert platforms.choose({"EDGEWATT_CLIENT_BACKEND": " PROCFS "}) == "procfs"
    with caplog.at_level(logging.WARNING, logger="edgewatt"):
        assert platforms.choose({"EDGEWATT_CLIENT_BACKEND": "bsd"}) == "procfs"
    assert "EDGEWATT_CLIENT_BACKEND='bsd' is not one of" in caplog.text


def test_without_proc_the_chooser_takes_psutil(tmp_path: Path) -> None:
    assert platforms.choose({}) == "procfs"  # this is Linux with /proc
    assert platforms.choose({"EDGEWATT_PROC_PATH": str(tmp_path)}) == "psutil"


def _client_script(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
    )


def test_import_client_and_sampling_with_proc_unavailable(tmp_path: Path) -> None:
    # The chooser sees no /proc: the psutil backend samples, same keys as procfs.
    code = (
        "import json, time\nfrom edgewatt import client\n"
        "r = client.register(fallback='always')\n"
        "time.sleep(0.3)\n"
        "print(json.dumps({'backend': r.backend.backend, 'summary': r.summary()}))\n"
        "r.close()\n"
    )
    result = _client_script(code, {"EDGEWATT_PROC_PATH": str(tmp_path / "none")})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["backend"] == "psutil"
    assert out["summary"]["samples"] >= 1
    assert out["summary"]["memory_rss_peak_bytes"] > 10 * 2**20


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_import_client_works_with_proc_hidden_from_the_process() -> None:
    # /proc really gone (tmpfs over it in a private mount namespace): importing and
    # registering must not raise; with no way to sample, the registration is inactive.
    code = (
        "from edgewatt import client\n"
        "r = client.register(fallback='auto', socket='/nonexistent.sock')\n"
        "print(r.mode)\n"
    )
    result = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount -t tmpfs none /proc && exec {sys.executable} -c "$0"',
            code,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["inactive"]
    assert "in-process monitoring unavailable" in result.stderr


# Standard-library modules that exist only on Unix: the client's own code may import
# none of them, since it must also run on Windows (the standard library and psutil pick
# their platform's modules themselves).
UNIX_ONLY = {"fcntl", "termios", "pwd", "grp", "resource", "pty", "tty", "syslog", "posix"}


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_unix_only_module_on_import_or_on_the_psutil_path() -> None:
    code = (
        "import json, sys, time\n"
        "before = set(sys.modules)\n"
        "from edgewatt import client\n"
        "at_import = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "r = client.register(fallback='always')\n"
        "time.sleep(0.2)\n"
        "r.summary()\n"
        "r.close()\n"
        "ours = [m.__file__ for n, m in sys.modules.items()\n"
        "        if n.startswith('edgewatt.') and getattr(m, '__file__', None)]\n"
        "print(json.dumps({'at_import': sorted(at_import), 'ours': ours}))\n"
    )
    result = _client_script(code, {"EDGEWATT_CLIENT_BACKEND": "psutil"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert not set(out["at_import"]) & UNIX_ONLY
    loaded = [Path(f) for f in out["ours"]]
    assert ROOT / "core" / "platforms" / "portable.py" in loaded
    for path in loaded:
        if path.suffix == ".py":  # not the native reader, built only where it compiles
            assert not _imported_names(path) & UNIX_ONLY, path


WORKLOAD = """
import json, resource, sys, time
from edgewatt.client.process_monitor import FileMonitor
def cpu():  # the script and its reaped children (the monitor's helper), as counted
    return sum(sum(resource.getrusage(who)[:2])
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
monitor = FileMonitor(file=sys.argv[1], interval=0.25, records="edgewatt")
started = cpu()
monitor.start()
held = bytearray(200 * 2**20)  # touched: 200 MiB resident
for i in range(0, len(held), 4096):
    held[i] = 1
end = time.process_time() + 1.5  # 1.5 s of CPU, however long the scheduler takes
while time.process_time() < end:
    pass
monitor.stop()
print(json.dumps({"summary": monitor.summary(), "started_cpu_s": started, "cpu_s": cpu()}))
"""


def test_both_backends_report_the_same_figures_for_the_same_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKLOAD)
    summaries = {}
    for backend in ("procfs", "psutil"):
        result = subprocess.run(
            [sys.executable, str(script), str(tmp_path / f"{backend}.log")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={
                "PATH": "/usr/bin:/bin",
                "EDGEWATT_SOCKET": str(tmp_path / "none.sock"),
                "EDGEWATT_CLIENT_BACKEND": backend,
            },
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        summaries[backend] = out["summary"]
        # Both hold the whole 1.5 s burn and no more than the kernel counted for the
        # script and its helper between start() and stop() (getrusage; /proc's 10 ms
        # ticks in user and system time), whatever share of a core the scheduler gave.
        counted = out["cpu_s"] - out["started_cpu_s"]
        assert 1.5 - 0.02 <= out["summary"]["cpu_time_s"] <= counted + 0.04, out
    procfs, psutil = summaries["procfs"], summaries["psutil"]
    assert set(procfs) == set(psutil)
    peak = "memory_rss_peak_bytes"
    assert abs(procfs[peak] - psutil[peak]) < 0.05 * procfs[peak], summaries
    assert procfs[peak] > 200 * 2**20
