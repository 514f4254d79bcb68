"""The heflwr-compatible monitors, thread and process variants, with and without a daemon."""

from __future__ import annotations

import contextlib
import json
import math
import resource
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from edgewatt.client import process_monitor, thread_monitor
from edgewatt.client._heflwr import STATS_KEYS as HEFLWR_STATS
from edgewatt.client._heflwr import SUMMARY_KEYS as HEFLWR_SUMMARY
from tests.conftest import free_port, kernel_cpu_seconds, wait_for

VARIANTS = [thread_monitor, process_monitor]


TICK = 0.021  # /proc counts user and system time each in 10 ms ticks


def tree_cpu_seconds() -> float:
    """The kernel's count for this process and all it started, reaped or live (the
    daemon of the fixture is a child: the monitor registers with children)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(OSError):
            total += kernel_cpu_seconds(child.pid)
    return total


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.fixture(params=["no daemon", "daemon"])
def socket_path(request: Any, tmp_path: Path, daemon_factory: Any) -> str:
    if request.param == "daemon":
        return daemon_factory(interval=0.1).socket
    return str(tmp_path / "none.sock")


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_file_monitor_figures_and_file(variant: Any, socket_path: str, tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    monitor = variant.FileMonitor(
        file=str(path), interval=0.2, records="edgewatt", socket=socket_path
    )
    before = tree_cpu_seconds()
    monitor.start()
    block = bytearray(120 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    burn(1.5)
    monitor.stop()
    after = tree_cpu_seconds()
    stats, summary = monitor.stats(), monitor.summary()
    expected = {"timestamp", "cpu_usage", "memory_usage", "memory_rss_bytes"}
    assert expected | {"network_bytes_sent", "network_bytes_recv"} == set(stats)
    assert not any(k.startswith("power") for k in stats)  # power is off by default
    assert all(len(v) == len(stats["timestamp"]) for v in stats.values())
    # What the kernel counted, whatever the scheduler gave: the whole burn lies between
    # the first and the last reading, and nothing beyond what the kernel counted for
    # the tree around start() and stop() (a tick of rounding per process and mode).
    assert 1.5 - TICK <= summary["cpu_time_s"] <= after - before + 2 * TICK
    # The samples are the same count spread over time (no first 0 %, none lost).
    times = [summary["start_time"], *stats["timestamp"]]
    spread = math.fsum(
        u / 100 * (times[i + 1] - times[i]) for i, u in enumerate(stats["cpu_usage"])
    )
    assert spread == pytest.approx(summary["cpu_time_s"], abs=1e-3)
    assert summary["memory_rss_peak_bytes"] > 120 * 2**20
    assert summary["samples"] == len(stats["timestamp"]) >= 5
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["units"]["cpu_usage"] == "percent of one core"
    assert lines[0]["source"] == ("daemon" if "ew" in socket_path else "local")
    assert [ln["type"] for ln in lines[1:-1]] == ["sample"] * (len(lines) - 2)
    assert lines[-1]["type"] == "summary" and lines[-1]["samples"] == len(lines) - 2
    del block


def test_disabled_metrics_are_empty_and_monitors_coexist(tmp_path: Path) -> None:
    a = thread_monitor.FileMonitor(str(tmp_path / "a.txt"), 0.1, socket=str(tmp_path / "x"))
    b = thread_monitor.FileMonitor(str(tmp_path / "b.txt"), 0.1, socket=str(tmp_path / "x"))
    b.set_metrics(cpu=False, network=False)
    a.start()
    b.start()
    time.sleep(0.6)
    a.stop()
    b.stop()
    # heflwr's seven keys always: a metric that is off has an empty list, a 0 total.
    stats, summary = b.stats(), b.summary()
    assert list(stats) == list(HEFLWR_STATS) and list(summary) == list(HEFLWR_SUMMARY)
    assert stats["cpu_usage"] == stats["network_bytes_sent"] == [] and stats["memory_usage"]
    assert summary["avg_cpu_usage"] == summary["total_network_bytes_sent"] == 0
    assert a.stats()["cpu_usage"]
    # The edgewatt records leave what is off out.
    rich = thread_monitor.FileMonitor(str(tmp_path / "c.jsonl"), 0.1, records="edgewatt")
    rich.socket = str(tmp_path / "x")
    rich.set_metrics(cpu=False, network=False)
    rich.start()
    time.sleep(0.3)
    rich.stop()
    assert set(rich.stats()) == {"timestamp", "memory_usage", "memory_rss_bytes"}
    with pytest.raises(ValueError, match="metric 'gpu' is not supported"):
        a.set_metrics(gpu=True)
    with pytest.raises(TypeError, match="must be True or False"):
        a.set_metrics(cpu="yes")


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_unwritable_path_fails_at_start(variant: Any, tmp_path: Path) -> None:
    monitor = variant.FileMonitor(str(tmp_path / "missing" / "log.txt"), 0.2)
    with pytest.raises(OSError, match=r"cannot write monitor file .*missing/log.txt"):
        monitor.start()


def test_disk_full_mid_run_warns_and_goes_on(caplog: Any, tmp_path: Path) -> None:
    monitor = thread_monitor.FileMonitor("/dev/full", 0.1, socket=str(tmp_path / "x"))
    monitor.start()
    time.sleep(0.5)
    monitor.stop()
    assert len(monitor.stats()["cpu_usage"]) >= 3
    warnings = [r.message for r in caplog.records if "/dev/full" in r.message]
    assert len(warnings) == 1 and "monitoring goes on" in warnings[0]


# -- RemoteMonitor --------------------------------------------------------------------


class Receiver:
    """A real HTTP server recording what the monitors post."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.posts: list[tuple[str, str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append((self.path, self.headers["Content-Type"], body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forms(self) -> list[dict[str, str]]:
        return [
            {k: v[0] for k, v in urllib.parse.parse_qs(b.decode()).items()}
            for _, _, b in self.posts
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(free_port())
    yield r
    r.close()


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_remote_monitor_speaks_heflwr_simple_log(
    variant: Any, receiver: Receiver, tmp_path: Path
) -> None:
    monitor = variant.RemoteMonitor(
        f"127.0.0.1:{receiver.port}", interval=0.2, identifier="client-7"
    )
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    time.sleep(1.0)
    monitor.stop()
    forms = receiver.forms()
    assert len(forms) >= 3
    assert {p for p, _, _ in receiver.posts} == {"/simple_log"}
    assert receiver.posts[0][1] == "application/x-www-form-urlencoded"
    assert set(forms[0]) == {"identifier", "message"} and forms[0]["identifier"] == "client-7"
    assert forms[0]["message"].startswith("Cpu Usage: ") and "Memory Usage: " in forms[0]["message"]
    assert len(forms) == len(monitor.stats()["cpu_usage"])


def test_remote_monitor_full_log_records(receiver: Receiver, tmp_path: Path) -> None:
    monitor = thread_monitor.RemoteMonitor(f"127.0.0.1:{receiver.port}", 0.2, "id", simple=False)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    time.sleep(0.7)
    monitor.stop()
    form = receiver.forms()[0]
    assert {p for p, _, _ in receiver.posts} == {"/log"}
    assert (
        form["identifier"] == "id"
        and form["levelname"] == "INFO"
        and form["msg"] == form["message"]
    )
    assert float(form["created"]) == pytest.approx(time.time(), abs=5)


def test_outage_at_start_samples_arrive_in_order_later(tmp_path: Path) -> None:
    port = free_port()
    monitor = thread_monitor.RemoteMonitor(f"127.0.0.1:{port}", interval=0.1, identifier="late")
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    time.sleep(1.0)  # nobody listens: samples wait in the buffer
    receiver = Receiver(port)
    try:
        time.sleep(0.5)
        monitor.stop()
        messages = receiver.forms()
        assert len(messages) == len(monitor.stats()["cpu_usage"]) >= 10
        # Delivered in order: the bytes-sent figures are per sample, so compare the
        # posted messages with the recorded samples one by one.
        recorded = monitor.stats()["cpu_usage"]
        posted = [float(m["message"].split("Cpu Usage: ")[1].split("%")[0]) for m in messages]
        # The last one posted may have had stop()'s few milliseconds merged into it since.
        assert posted[:-1] == pytest.approx(recorded[:-1])
    finally:
        receiver.close()


def test_buffer_is_bounded_oldest_dropped(tmp_path: Path, caplog: Any) -> None:
    monitor = thread_monitor.RemoteMonitor(f"127.0.0.1:{free_port()}", 0.05, "x", buffer=5)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    time.sleep(0.8)
    monitor.stop()
    assert any("oldest samples dropped" in r.message for r in caplog.records)
    assert any("samples not delivered" in r.message for r in caplog.records)


def test_remote_monitor_otlp_decodes_with_official_messages(
    receiver: Receiver, tmp_path: Path
) -> None:
    monitor = thread_monitor.RemoteMonitor(
        f"http://127.0.0.1:{receiver.port}", 0.2, protocol="otlp", labels={"run": "fl-1"}
    )
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    burn(0.6)
    monitor.stop()
    assert receiver.posts and all(p == "/v1/metrics" for p, _, _ in receiver.posts)
    assert receiver.posts[0][1] == "application/x-protobuf"
    request = ExportMetricsServiceRequest.FromString(receiver.posts[-1][2])
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    assert {"process.cpu.time", "process.memory.usage", "system.network.io"} <= set(metrics)
    cpu = metrics["process.cpu.time"]
    assert cpu.unit == "s" and cpu.sum.is_monotonic
    attrs = {kv.key: kv.value.string_value for kv in cpu.sum.data_points[0].attributes}
    assert attrs["run"] == "fl-1" and attrs["cpu.mode"] == "user" and attrs["process.pid"]
    assert sum(p.as_double for p in cpu.sum.data_points) > 0.4


# -- PrometheusMonitor ----------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_prometheus_monitor_is_scraped(variant: Any, socket_path: str) -> None:
    monitor = variant.PrometheusMonitor(
        port=free_port(), interval=0.2, records="edgewatt", labels={"run": "p"}, socket=socket_path
    )
    monitor.start()
    try:
        url = f"http://127.0.0.1:{monitor.port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            return text if "process_cpu_time_seconds_total" in text else ""

        text = wait_for(scrape, timeout=10)
        assert f'process_pid="{monitor.pid}"' in text and 'run="p"' in text
        assert "process_memory_usage_bytes{" in text
    finally:
        monitor.stop()


def test_prometheus_port_in_use_fails_at_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        monitor = thread_monitor.PrometheusMonitor(port=port, interval=0.2)
        monitor.socket = str(tmp_path / "none.sock")
        with pytest.raises(OSError, match=f"cannot serve metrics on port {port}"):
            monitor.start()


def test_monitor_goes_on_when_the_daemon_disappears(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory(interval=0.1)
    monitor = thread_monitor.FileMonitor(str(tmp_path / "m.txt"), 0.2, socket=daemon.socket)
    monitor.start()
    assert monitor.source == "daemon"
    time.sleep(0.8)
    before = len(monitor.stats()["cpu_usage"])
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait()
    time.sleep(1.2)
    monitor.stop()
    assert len(monitor.stats()["cpu_usage"]) >= before + 4  # sampling in-process since


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_a_monitor_keeps_its_own_interval_with_a_slow_daemon(
    variant: Any, daemon_factory: Any, tmp_path: Path
) -> None:
    # The daemon samples every 5 s; the monitor asks for a fresh sample every 0.5 s.
    daemon = daemon_factory(interval=5.0)
    path = tmp_path / "m.jsonl"
    monitor = variant.FileMonitor(
        file=str(path), interval=0.5, records="edgewatt", socket=daemon.socket
    )
    monitor.start()
    time.sleep(2.6)
    monitor.stop()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["source"] == "daemon" and lines[0]["interval_s"] == 0.5
    times = [x["timestamp"] for x in lines if x["type"] == "sample"]
    assert len(times) >= 4, times
    gaps = [b - a for a, b in zip(times, times[1:])]
    # Every 0.5 s, and a last one at stop() (merged into the previous sample when it
    # comes less than 0.125 s after it).
    assert all(0.35 < g < 0.75 for g in gaps[:-1]) and 0 < gaps[-1] < 0.75, gaps


def test_the_daemons_minimum_interval_bounds_a_monitor(daemon_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("min_interval: 0.3\n")
    daemon = daemon_factory(interval=5.0, extra_args=["--config", str(tmp_path / "c.yaml")])
    path = tmp_path / "m.jsonl"
    monitor = thread_monitor.FileMonitor(
        file=str(path), interval=0.05, records="edgewatt", socket=daemon.socket
    )
    monitor.start()
    assert monitor.interval == 0.3  # the interval really used, as the header says
    time.sleep(1.0)
    monitor.stop()
    header = json.loads(path.read_text().splitlines()[0])
    assert header["interval_s"] == 0.3


def test_average_cpu_is_weighted_by_time_not_a_mean_of_samples() -> None:
    # Two 1 s intervals at 100 % and the 20 ms closing interval read at stop(), in which
    # clock-tick rounding counted 30 ms (150 %): the average is CPU seconds over wall
    # seconds, 2.03 / 2.02 s, not (100 + 100 + 150) / 3.
    from edgewatt.client._samples import Reading, Recorder

    def reading(t: float, cpu: float) -> Reading:
        return Reading(t, cpu, 0.0, 100 * 2**20, 8 * 2**30, None, None)

    recorder = Recorder({"cpu": True, "memory": True, "network": False, "power": False})
    for t, cpu in [(10.0, 5.0), (11.0, 6.0), (12.0, 7.0), (12.02, 7.03)]:
        recorder.observe(reading(t, cpu))
    assert recorder.stats()["cpu_usage"] == pytest.approx([100.0, 100.0, 150.0])
    summary = recorder.summary()
    assert summary["cpu_time_s"] == 2.03
    assert summary["avg_cpu_usage"] == pytest.approx(2.03 / 2.02 * 100)
