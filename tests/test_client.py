"""client.register(): with the real daemon, without one, and when it disappears."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt import client
from tests.conftest import ROOT, DaemonProcess, wait_for


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=60,
    )


def test_with_daemon_the_daemon_samples_and_no_thread_starts(daemon: DaemonProcess) -> None:
    code = (
        "import json, threading, time\n"
        "from edgewatt import client\n"
        "before = threading.active_count()\n"
        "with client.register(labels={'run': 'ctx'}) as reg:\n"
        "    threads = threading.active_count() - before\n"
        "    with reg.phase('epoch-1'):\n"
        "        end = time.process_time() + 1.0\n"
        "        while time.process_time() < end: pass\n"
        "    time.sleep(0.5)\n"
        "    print(json.dumps({'id': reg.id, 'mode': reg.mode, 'threads': threads,\n"
        "                      'stats': reg.stats(), 'summary': reg.summary()}))\n"
    )
    out = run_python(code, EDGEWATT_SOCKET=daemon.socket)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["mode"] == "daemon" and data["threads"] == 0
    assert data["stats"]["memory_rss_bytes"] > 0
    summary = data["summary"]
    assert summary["labels"] == {"run": "ctx"}
    (phase,) = summary["phases"]
    assert phase["name"] == "epoch-1" and phase["ended_at"] is not None
    # Phase edges are late by less than one interval (0.2 s): 1 s of CPU reads >= 0.75.
    assert 0.75 <= phase["cpu_user_s"] + phase["cpu_system_s"] <= 1.25
    # close() unregistered it: it ended there, kept to read for exited_retention.
    assert daemon.call("GET", f"/v1/targets/{data['id']}")[1]["state"] == "unregistered"


def test_a_registration_and_its_edges_go_on_one_connection(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection that finds the daemon carries the registration and every
    # request after it: no connect, and no serving thread in the daemon, per call.
    from edgewatt.core import transport

    connects = []
    real = transport._connect

    def connect(path: str, timeout: float | None) -> socket.socket:
        connects.append(path)
        return real(path, timeout)

    monkeypatch.setattr(transport, "_connect", connect)
    reg = client.register(socket=daemon.socket, fallback="never")
    assert (reg.mode, connects) == ("daemon", [daemon.socket])
    with client.track("step", registration=reg):
        pass
    with reg.phase("epoch"):
        pass
    assert reg.summary()["phases"][-1]["name"] == "epoch"
    target_id = reg.id
    reg.close()
    assert connects == [daemon.socket]
    assert daemon.call("GET", f"/v1/targets/{target_id}")[1]["state"] == "unregistered"


SUMMARY_TO_NOW = """
import json, resource, time
from edgewatt import client

def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime

with client.register(fallback=FALLBACK) as reg:
    start = cpu()
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    s = reg.summary()  # at once: no pass since the burn but the one it asks for
    used = cpu() - start
    total = s["cpu_user_s"] + s["cpu_system_s"]
    print(json.dumps({"mode": reg.mode, "summary": total, "used": used}))
"""


@pytest.mark.parametrize("fallback", ["never", "always"])
def test_summary_runs_to_now(daemon_factory: Any, fallback: str) -> None:
    # A 5 s interval: no regular pass falls in the 0.6 s burn, so a summary that ends
    # at the last pass would miss it; it holds it, to a tick per mode, daemon or not.
    daemon = daemon_factory(interval=5.0)
    out = run_python(
        SUMMARY_TO_NOW.replace("FALLBACK", repr(fallback)), EDGEWATT_SOCKET=daemon.socket
    )
    figures = json.loads(out.stdout)
    assert figures["mode"] == ("daemon" if fallback == "never" else "local")
    assert figures["used"] >= 0.6
    assert figures["summary"] == pytest.approx(figures["used"], abs=0.025), figures


# A registration's figure beside the kernel's count of the process (``kernel()``) from
# before the registration to after its summary, ``work`` done in it.
COUNTED = """
import json, mmap, time
from edgewatt import client

def kernel():
    KERNEL

before = kernel()
with client.register(fallback=FALLBACK) as reg:
    WORK
    s = reg.summary()
    after = kernel()
    print(json.dumps({"mode": reg.mode, "before": before, "after": after,
                      "summary": s[FIGURE], "latest": reg.stats()[FIGURE]}))
"""


def _counted(
    daemon_factory: Any, fallback: str, figure: str, kernel: str, work: str
) -> dict[str, Any]:
    daemon = daemon_factory(interval=5.0)
    code = COUNTED.replace("FALLBACK", repr(fallback)).replace("FIGURE", repr(figure))
    out = run_python(
        code.replace("KERNEL", kernel).replace("WORK", work), EDGEWATT_SOCKET=daemon.socket
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["mode"] == ("daemon" if fallback == "never" else "local")
    return figures


@pytest.mark.parametrize("fallback", ["never", "always"])
def test_a_registration_reads_its_context_switches_as_the_kernel_counted_them(
    daemon_factory: Any, fallback: str
) -> None:
    # 50 sleeps of 1 ms: 50 voluntary switches at least, and no more than the kernel
    # counted for the process (its main thread) from before the registration to after
    # the summary, daemon or not.
    figures = _counted(
        daemon_factory,
        fallback,
        "context_switches_voluntary",
        "return int(open('/proc/self/status').read().splitlines()[-2].split()[1])",
        "for _ in range(50): time.sleep(0.001)",
    )
    assert 50 <= figures["summary"] <= figures["after"] - figures["before"], figures
    assert figures["before"] + 50 <= figures["latest"] <= figures["after"], figures


@pytest.mark.parametrize("fallback", ["never", "always"])
def test_a_registration_reads_its_minor_faults_as_the_kernel_counted_them(
    daemon_factory: Any, fallback: str
) -> None:
    # 2000 fresh pages touched: 2000 minor faults at least, and no more than the kernel
    # counted for the process (field 10 of its stat) over the registration; none where
    # psutil samples in process (it has no minor faults).
    figures = _counted(
        daemon_factory,
        fallback,
        "page_faults_minor",
        "stat = open('/proc/self/stat').read(); return int(stat.rsplit(')', 1)[1].split()[7])",
        "area = mmap.mmap(-1, 2000 * mmap.PAGESIZE)\n"
        "    for at in range(0, 2000 * mmap.PAGESIZE, mmap.PAGESIZE): area[at] = 1",
    )
    if fallback == "always" and os.environ.get("EDGEWATT_CLIENT_BACKEND") == "psutil":
        assert figures["summary"] is None and figures["latest"] is None, figures
        return
    assert 2000 <= figures["summary"] <= figures["after"] - figures["before"], figures
    assert figures["before"] + 2000 <= figures["latest"] <= figures["after"], figures


MANY_PHASES = """
import json, time
from edgewatt import client
reg = client.register(fallback=FALLBACK)
for i in range(1005):
    with client.track(f"step-{i}", registration=reg) as tracked:
        end = time.process_time() + (0.03 if i == 1004 else 0.0)
        while time.process_time() < end:
            pass
summary = reg.summary()
print(json.dumps({"mode": reg.mode, "last": tracked.last._asdict(), "summary": summary}))
"""


@pytest.mark.parametrize("fallback", ["never", "always"])
def test_a_function_tracked_past_the_phase_bound_keeps_being_measured(
    daemon_factory: Any, fallback: str
) -> None:
    # A training step tracked at every call: the 1,001st call and later are measured
    # like the first; the summary lists the newest 1,000 and counts the rest.
    daemon = daemon_factory(interval=5.0)
    out = run_python(MANY_PHASES.replace("FALLBACK", repr(fallback)), EDGEWATT_SOCKET=daemon.socket)
    assert out.returncode == 0 and "failed" not in out.stderr, out.stderr
    result = json.loads(out.stdout)
    assert result["mode"] == ("daemon" if fallback == "never" else "local")
    last, summary = result["last"], result["summary"]
    # 30 ms of CPU in the last call; /proc counts in 10 ms ticks at each edge.
    assert last["name"] == "step-1004" and 0.02 <= last["cpu_s"] <= 0.05
    assert [p["name"] for p in summary["phases"]] == [f"step-{i}" for i in range(5, 1005)]
    assert summary["phases_dropped"] == 5
    assert summary["phases"][-1]["cpu_user_s"] + summary["phases"][-1]["cpu_system_s"] == (
        pytest.approx(last["cpu_s"], abs=1e-6)
    )


def test_without_daemon_same_keys_one_warning(daemon: DaemonProcess, tmp_path: Path) -> None:
    code = (
        "import json, logging, time\n"
        "from edgewatt import client\n"
        "logging.basicConfig(level=logging.WARNING, format='WARN %(message)s')\n"
        "reg = client.register(labels={'run': 'x'}, socket=SOCK)\n"
        "with reg.phase('p'):\n"
        "    time.sleep(1.2)\n"
        "print(json.dumps({'mode': reg.mode, 'stats': reg.stats(), 'summary': reg.summary()}))\n"
        "reg.close()\n"
    )
    local = run_python(code.replace("SOCK", repr(str(tmp_path / "none.sock"))))
    assert local.returncode == 0, local.stderr
    with_daemon = run_python(code.replace("SOCK", repr(daemon.socket)))
    a, b = json.loads(local.stdout), json.loads(with_daemon.stdout)
    assert (a["mode"], b["mode"]) == ("local", "daemon")
    assert set(a["stats"]) == set(b["stats"])
    assert set(a["summary"]) == set(b["summary"])
    assert set(a["summary"]["phases"][0]) == set(b["summary"]["phases"][0])
    assert a["stats"]["memory_rss_bytes"] > 0 and a["summary"]["samples"] >= 2
    warnings = [line for line in local.stderr.splitlines() if line.startswith("WARN")]
    none = tmp_path / "none.sock"
    assert warnings == [
        f"WARN edgewatt: no daemon answering at {none} (given): no such socket; "
        f"monitoring pid {a['summary']['pid']} in-process"
    ]


def test_daemon_disappearing_mid_run_falls_back(daemon_factory: Any) -> None:
    daemon = daemon_factory()
    reg = client.register(labels={"run": "gone"}, socket=daemon.socket)
    try:
        assert reg.mode == "daemon"
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        stats = reg.stats()  # no exception: it notices and samples itself
        assert reg.mode == "local"
        wait_for(lambda: reg.stats()["memory_rss_bytes"] > 0)  # its own sample taken
        assert reg.summary()["labels"] == {"run": "gone"}
        assert isinstance(stats, dict)
    finally:
        reg.close()
    assert reg.mode == "inactive"


def test_fallback_never_stays_inactive(tmp_path: Path) -> None:
    reg = client.register(socket=str(tmp_path / "none.sock"), fallback="never")
    assert reg.mode == "inactive" and reg.stats() == {} and reg.summary() == {}
    with reg.phase("x"):
        pass
    reg.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"labels": ["a"]}, TypeError),
        ({"labels": {"a": 1}}, TypeError),
        ({"pid": 0}, ValueError),
        ({"pid": True}, ValueError),
        ({"children": "yes"}, TypeError),
        ({"fallback": "sometimes"}, ValueError),
    ],
)
def test_argument_errors_raise(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        client.register(**kwargs)


def test_invalid_labels_refused_by_the_daemon_raise(daemon: DaemonProcess) -> None:
    with pytest.raises(ValueError, match="reserved"):
        client.register(labels={"job": "x"}, socket=daemon.socket)


def test_a_daemon_that_never_answers_costs_at_most_half_a_second(tmp_path: Path) -> None:
    path = str(tmp_path / "mute.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    started = time.monotonic()
    reg = client.register(socket=path, fallback="never")
    assert time.monotonic() - started < 0.7
    assert reg.mode == "inactive"
    server.close()


def test_import_client_uses_only_the_standard_library() -> None:
    code = (
        "import sys, sysconfig\n"
        "before = set(sys.modules)\n"
        "from edgewatt import client\n"
        "new = set(sys.modules) - before\n"
        # Where each new module comes from: the standard library's folders, or built in
        # (sys.stdlib_module_names is 3.10+).
        "stdlib = (sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['platstdlib'])\n"
        "def outside(m):\n"
        "    f = getattr(sys.modules[m], '__file__', None)\n"
        "    return f is not None and not f.startswith(stdlib)\n"
        "print(sorted({m.split('.')[0] for m in new if outside(m)}))\n"
        "print(sorted(m for m in new if m.startswith('edgewatt')))\n"
    )
    out = run_python(code)
    third_party, ours = out.stdout.splitlines()
    assert third_party == "['edgewatt']", out.stdout + out.stderr
    # Of edgewatt itself, only the client and the stdlib-only transport it talks through.
    assert ours == (
        "['edgewatt', 'edgewatt.client', 'edgewatt.client._track', 'edgewatt.core', "
        "'edgewatt.core.transport']"
    )
