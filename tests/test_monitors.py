"""The heflwr-compatible monitors, thread and process variants, with and without a daemon."""

from __future__ import annotations

import contextlib
import json
import math
import re
import resource
import socket
import subprocess
import sys
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
from edgewatt.client.heflwr.records import STATS_KEYS as HEFLWR_STATS
from edgewatt.client.heflwr.records import SUMMARY_KEYS as HEFLWR_SUMMARY
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
    expected.add("memory_pss_bytes")  # Linux: smaps_rollup
    assert expected | {"network_bytes_sent", "network_bytes_recv"} == set(stats)
    assert not any(k.startswith("power") for k in stats)  # power is off by default
    # PSS: what the process holds, the buffer included, never above its RSS.
    assert max(stats["memory_pss_bytes"]) > 120 * 2**20
    assert all(p <= r for p, r in zip(stats["memory_pss_bytes"], stats["memory_rss_bytes"]))
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
    # At least 3 (an interval of 0.2 s over >= 1.5 s, a short last one merged; a busy
    # machine's scheduler decides the rest): the figures above are what is exact.
    assert summary["samples"] == len(stats["timestamp"]) >= 3
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
    wait_for(lambda: a.stats()["cpu_usage"] and b.stats()["memory_usage"])
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
    wait_for(lambda: rich.stats().get("memory_usage"))
    rich.stop()
    assert set(rich.stats()) == {
        "timestamp",
        "memory_usage",
        "memory_rss_bytes",
        "memory_pss_bytes",
    }
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
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= 3)
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
    wait_for(lambda: len(receiver.forms()) >= 3)
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
    wait_for(receiver.forms)
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
    # Nobody listens: samples wait in the buffer.
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= 10)
    receiver = Receiver(port)
    try:
        wait_for(lambda: len(receiver.forms()) >= 10)  # the buffer delivered, stop() aside
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
    wait_for(lambda: any("oldest samples dropped" in r.message for r in caplog.records))
    monitor.stop()
    assert any("oldest samples dropped" in r.message for r in caplog.records)
    assert any("samples not delivered" in r.message for r in caplog.records)


def test_remote_monitor_follows_no_redirect(tmp_path: Path, caplog: Any) -> None:
    # A server answering 302 to another host: urllib followed it as a GET without the
    # sample, to whatever host was named. Now the redirect is refused and said.
    elsewhere: list[tuple[str, str]] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            elsewhere.append(("GET", self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: Any) -> None: ...

    other = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    location = f"http://127.0.0.1:{other.server_address[1]}/stolen"
    posts: list[str] = []

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None: ...

    redirecting = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for server in (other, redirecting):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = redirecting.server_address[1]
        monitor = thread_monitor.RemoteMonitor(f"127.0.0.1:{port}", 0.2, "x")
        monitor.socket = str(tmp_path / "none.sock")
        monitor.start()
        wait_for(lambda: len(posts) >= 2)
        monitor.stop()
    finally:
        for server in (other, redirecting):
            server.shutdown()
            server.server_close()
    assert len(posts) == len(monitor.stats()["cpu_usage"]) >= 2  # each tried once
    assert elsewhere == []
    warned = [r.message for r in caplog.records if "refused a sample" in r.message]
    assert warned == [
        f"edgewatt: http://127.0.0.1:{port}/simple_log refused a sample "
        f"(HTTP 302, a redirect to {location}, not followed); 1 dropped"
    ]


def test_remote_monitor_stops_in_time_with_a_trickling_server(tmp_path: Path, caplog: Any) -> None:
    # A server that answers a byte every 0.2 s: each receive is quick, the exchange
    # never ends. stop() waits at most its 5 s flush for the buffer, then cuts the post
    # short (it waited 5 s and then 3 s more, the post still running after).
    listener = socket.create_server(("127.0.0.1", 0))
    stop_serving, posting = threading.Event(), threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            while not stop_serving.is_set():
                connection, _ = listener.accept()
                connection.recv(65536)
                posting.set()
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                    if stop_serving.wait(0.2):
                        break
                    connection.sendall(bytes([byte]))
                connection.close()

    threading.Thread(target=trickle, daemon=True).start()
    try:
        monitor = thread_monitor.RemoteMonitor(f"127.0.0.1:{listener.getsockname()[1]}", 0.2, "x")
        monitor.socket = str(tmp_path / "none.sock")
        monitor.start()
        wait_for(posting.is_set)  # a post under way, its answer trickling
        began = time.monotonic()
        monitor.stop()
        stopped_s = time.monotonic() - began
    finally:
        stop_serving.set()
        listener.close()
    assert stopped_s < 5.0 + 1.0, stopped_s
    assert any("samples not delivered" in r.message for r in caplog.records)
    assert any("TimeoutError: no whole answer within 2 s" in r.message for r in caplog.records)


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
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= 3)
    before = len(monitor.stats()["cpu_usage"])
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait()
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= before + 4)
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
    wait_for(lambda: len(monitor.stats().get("timestamp", [])) >= 5)
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
    wait_for(lambda: monitor.stats().get("timestamp"))
    monitor.stop()
    header = json.loads(path.read_text().splitlines()[0])
    assert header["interval_s"] == 0.3


def test_average_cpu_is_weighted_by_time_and_a_short_last_sample_is_merged() -> None:
    # Two 1 s intervals at 100 % and the 20 ms closing interval read at stop(), in which
    # clock-tick rounding counted 30 ms (150 %). The 20 ms are merged into the previous
    # sample (1.02 s, 1.03 s of CPU), never reported as a rate of their own; the average
    # is CPU seconds over wall seconds, 2.03 / 2.02 s, not a mean of samples.
    from edgewatt.client._samples import Reading, Recorder

    def reading(t: float, cpu: float, sent: int) -> Reading:
        return Reading(t, cpu, 0.0, 100 * 2**20, 8 * 2**30, sent, 0)

    recorder = Recorder({"cpu": True, "memory": True, "network": True, "power": False}, 1.0)
    merged = [(10.0, 5.0, 0), (11.0, 6.0, 100), (12.0, 7.0, 300), (12.02, 7.03, 310)]
    assert [recorder.observe(reading(*r)) is not None for r in merged] == [0, 1, 1, 0]
    stats = recorder.stats()
    assert stats["cpu_usage"] == pytest.approx([100.0, 103 / 1.02])
    assert stats["network_bytes_sent"] == [100, 210]  # nothing lost in the merge
    assert stats["timestamp"] == [11.0, 12.02]
    summary = recorder.summary()
    assert summary["samples"] == 2 and summary["cpu_time_s"] == 2.03
    assert summary["avg_cpu_usage"] == pytest.approx(2.03 / 2.02 * 100)
    # A quarter interval or more is a sample of its own.
    recorder.observe(reading(12.27, 7.2, 310))
    assert recorder.summary()["samples"] == 3


def test_a_wall_clock_step_moves_no_interval_of_the_recorder() -> None:
    # Five readings 1 s apart on the monotonic clock; the wall clock is stepped back an
    # hour after the second and forward two hours after the fourth (NTP on a board
    # that booted without a clock). Every reading is a sample, each interval 1 s: 100 %
    # of a core, 2 W on the SoC rail for 4 s (8,000 mJ), 4 s monitored. On the wall
    # clock, the readings after the step back would be skipped as "not newer", and the
    # step forward would make one interval last 3,601 s.
    from edgewatt.client._samples import Reading, Recorder

    walls = [1000.0, 1001.0, -1598.0, -1597.0, 5604.0]
    readings = [
        Reading(wall, 5.0 + i, 0.0, 2**20, 2**30, 0, 0, power_w=5.0, energy_j=5.0 * i,
                rails_w={"VDD_SOC": 2.0}, monotonic=50.0 + i)
        for i, wall in enumerate(walls)
    ]  # fmt: skip
    recorder = Recorder({"cpu": True, "memory": True, "network": True, "power": True}, 1.0)
    assert [recorder.observe(r) is not None for r in readings] == [0, 1, 1, 1, 1]
    stats, summary = recorder.stats(), recorder.summary()
    assert stats["cpu_usage"] == [100.0] * 4
    assert stats["timestamp"] == walls[1:]  # what the wall clock said, as it said it
    assert summary["duration_s"] == 4.0 and summary["cpu_time_s"] == 4.0
    assert summary["avg_cpu_usage"] == 100.0
    assert summary["total_power_vdd_soc"] == 8000.0
    assert summary["energy_j"] == 20.0 and summary["avg_power_w"] == 5.0
    # The daemon's same sample read twice is no sample, whatever the clocks say.
    repeated = Reading(5604.0, 9.0, 0.0, 2**20, 2**30, 0, 0, monotonic=54.5)
    assert recorder.observe(repeated) is None and recorder.summary()["samples"] == 4


def test_a_readings_monotonic_instant_is_its_wall_age_clamped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reading's instant is the monotonic clock now, less how old its wall stamp is:
    # a daemon sample 0.4 s old is 0.4 s back; a stamp from before a step back of the
    # wall clock (it looks 3,600 s in the future) counts as now; one from before a
    # step forward (3,600 s old) as 60 s back at most, never an hour.
    from edgewatt.client._readings import MAX_READING_AGE_S, monotonic_instant

    monkeypatch.setattr(time, "time", lambda: 5000.0)
    monkeypatch.setattr(time, "monotonic", lambda: 200.0)
    assert monotonic_instant(4999.6) == pytest.approx(199.6)
    assert monotonic_instant(8600.0) == 200.0
    assert monotonic_instant(1400.0) == 200.0 - MAX_READING_AGE_S == 140.0


# -- heflwr 0.1.91's shapes (tests/test_heflwr_compat.py checks them against heflwr) ---


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_heflwr_keys_always_also_before_start(variant: Any, tmp_path: Path) -> None:
    monitor = variant.FileMonitor(str(tmp_path / "log.txt"), 0.2)
    monitor.socket = str(tmp_path / "none.sock")
    assert monitor.stats() == {key: [] for key in HEFLWR_STATS}
    assert monitor.summary() == dict.fromkeys(HEFLWR_SUMMARY, 0)
    # Network off and power on: heflwr's documented columns are all there. Without a
    # power source the rails read [] and their totals 0 (heflwr's own sampler dies).
    monitor.set_metrics(network=False, power=True)
    monitor.start()
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= 2)  # typed figures to check
    monitor.stop()
    stats, summary = monitor.stats(), monitor.summary()
    assert list(stats) == list(HEFLWR_STATS) and list(summary) == list(HEFLWR_SUMMARY)
    assert stats["network_bytes_sent"] == [] and summary["total_network_bytes_sent"] == 0
    assert all(isinstance(v, float) for v in stats["cpu_usage"] + stats["memory_usage"])
    assert all(isinstance(v, int) for v in stats["power_vdd_in"])  # whole mW, as heflwr
    if not stats["power_vdd_in"]:
        assert summary["total_power_vdd_in"] == 0


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_samples_accumulate_across_start_and_stop(variant: Any, tmp_path: Path) -> None:
    monitor = variant.FileMonitor(str(tmp_path / "log.txt"), 0.2, records="edgewatt")
    monitor.socket = str(tmp_path / "none.sock")
    counts = []
    for _ in range(2):
        monitor.start()
        burn(0.7)
        monitor.stop()
        counts.append(monitor.summary()["samples"])
        if len(counts) == 1:
            first = monitor.stats()
        time.sleep(0.5)  # between rounds: not monitored, not counted
    stats, summary = monitor.stats(), monitor.summary()
    # The second round adds to the first (how many each holds is the scheduler's).
    assert counts[0] >= 2 and counts[1] >= counts[0] + 2 and counts[1] == len(stats["timestamp"])
    assert all(stats[k][: counts[0]] == v for k, v in first.items())
    # Both rounds, the time between them left out: 1.4 s of CPU over 1.4 s monitored.
    assert summary["cpu_time_s"] >= 1.4 - 2 * TICK
    assert summary["duration_s"] < summary["end_time"] - summary["start_time"] - 0.4
    assert summary["avg_cpu_usage"] == pytest.approx(
        summary["cpu_time_s"] / summary["duration_s"] * 100, rel=0.01
    )


HEFLWR_LINE = re.compile(
    r"CPU Usage: \d+\.\d%, Memory Usage: \d+\.\d+(e-\d+)?%, Bytes Sent: \d+, Bytes Recv: \d+, "
)


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_file_monitor_writes_heflwrs_text_appending_at_each_start(
    variant: Any, tmp_path: Path
) -> None:
    path = tmp_path / "log.txt"
    monitor = variant.FileMonitor(file=str(path), interval=0.2)
    monitor.socket = str(tmp_path / "none.sock")
    for _ in range(2):
        taken = len(monitor.stats()["cpu_usage"])
        monitor.start()
        wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= taken + 2)  # noqa: B023
        monitor.stop()
    lines = path.read_text().splitlines()
    dates = [
        i for i, line in enumerate(lines) if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line)
    ]
    assert dates[0] == 0 and len(dates) == 2, lines
    samples = [line for i, line in enumerate(lines) if i not in dates]
    assert all(HEFLWR_LINE.fullmatch(line) for line in samples), samples
    assert len(samples) == len(monitor.stats()["cpu_usage"])


def test_prometheus_monitor_serves_heflwrs_gauges(tmp_path: Path) -> None:
    monitor = thread_monitor.PrometheusMonitor(port=free_port(), interval=0.2)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    try:
        url = f"http://127.0.0.1:{monitor.port}/metrics"

        def scrape() -> dict[str, float]:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            values = dict(re.findall(r"^(\w+) (\S+)$", text, re.M))
            return {k: float(v) for k, v in values.items()} if float(values["memory_usage"]) else {}

        values = wait_for(scrape, timeout=10)
        names = ["cpu_usage", "memory_usage", "bytes_sent", "bytes_recv", "vdd_in"]
        assert {*names, "vdd_cpu_gpu_cv", "vdd_soc"} <= set(values)
        # Percent of host memory, the figure stats() has; the rails 0.0 with power off.
        assert values["memory_usage"] == pytest.approx(monitor.stats()["memory_usage"][-1], rel=0.2)
        assert values["vdd_in"] == values["vdd_soc"] == 0.0
    finally:
        monitor.stop()


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_remote_log_record_is_heflwrs_and_echoed_on_stdout(
    variant: Any, receiver: Receiver, tmp_path: Path, capsys: Any
) -> None:
    monitor = variant.RemoteMonitor(f"127.0.0.1:{receiver.port}", 0.2, "id-9", simple=False)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    wait_for(receiver.forms)
    monitor.stop()
    forms = receiver.forms()
    form = forms[0]
    assert (
        form["name"] == "HeFlwr" and form["args"] == "()" and form["funcName"] == "update_metrics"
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", form["asctime"])
    assert form["msg"] == form["message"] and form["message"].startswith("Cpu Usage: ")
    echoed = capsys.readouterr().out.splitlines()
    assert len(echoed) == len(forms)
    assert all(re.match(r"INFO HeFlwr \d{4}-.* \| \S+\.py:\d+ \| Cpu Usage: ", e) for e in echoed)
    assert [e.split(" | ")[-1] for e in echoed] == [f["message"] for f in forms]


PEER = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
got = 0
while got < int(sys.argv[1]):
    got += len(conn.recv(1 << 20))
conn.sendall(b"r" * int(sys.argv[2]))
conn.recv(1)  # until the monitored process closes
"""


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_network_bytes_are_the_processs_own_loopback_included(
    variant: Any, socket_path: str, tmp_path: Path
) -> None:
    sent, received = 5 * 2**20, 2**20
    # The local server is not this process's child (a child would be the monitored
    # tree's own, talking to itself): started through a launcher that exits at once,
    # before the monitor starts, it is an orphan of init.
    launch = "import subprocess, sys; subprocess.Popen([sys.executable, *sys.argv[1:]])"
    peer = subprocess.Popen(
        [sys.executable, "-c", launch, "-c", PEER, str(sent), str(received)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert peer.wait(timeout=10) == 0 and peer.stdout is not None
    try:
        port = int(peer.stdout.readline())
        monitor = variant.FileMonitor(str(tmp_path / "log.txt"), 0.2, socket=socket_path)
        monitor.start()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"s" * sent)
            got = 0
            while got < received:
                got += len(conn.recv(1 << 20))
            # A sample of the connection after the transfer (one under way aside).
            taken = len(monitor.stats()["cpu_usage"])
            wait_for(lambda: len(monitor.stats()["cpu_usage"]) >= taken + 2)
        monitor.stop()
    finally:
        peer.stdout.read()  # end of file: the server has exited
        peer.stdout.close()
    summary = monitor.summary()
    # The local server is another process: its traffic is this process's (heflwr counts
    # every interface; the old drop-in left loopback out and read 0 B). Nothing else of
    # this process's talks TCP in the meantime, so the figures are the transfer's.
    assert sent <= summary["total_network_bytes_sent"] < sent + 2**16
    assert received <= summary["total_network_bytes_recv"] < received + 2**16


def test_process_variant_leaves_its_helper_out_of_memory(tmp_path: Path) -> None:
    monitor = process_monitor.FileMonitor(str(tmp_path / "log.txt"), 0.2)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    (helper,) = [
        child
        for child in psutil.Process().children()
        if "edgewatt.client._helper" in child.cmdline()
    ]
    wait_for(lambda: len(monitor.stats()["memory_usage"]) >= 2)
    helper_rss = helper.memory_info().rss
    own_rss = psutil.Process().memory_info().rss
    monitor.stop()
    rss = monitor.stats()["memory_usage"][-1] / 100 * psutil.virtual_memory().total
    # This process is the tree (no daemon child here): the helper, a child too, is not
    # the workload's (it was counted: 1.98x the process's own RSS).
    assert helper_rss > 10 * 2**20
    assert abs(rss - own_rss) < helper_rss / 2, (rss, own_rss, helper_rss)


def test_a_stop_just_after_a_sample_extends_it(tmp_path: Path) -> None:
    # stop() 0.1 s after the sample at 2 s: its reading is merged into that sample (a
    # rate over 0.1 s would be a few clock ticks' noise), not a sample of its own.
    monitor = thread_monitor.FileMonitor(str(tmp_path / "log.txt"), 2.0)
    monitor.socket = str(tmp_path / "none.sock")
    monitor.start()
    wait_for(lambda: monitor.stats()["cpu_usage"], timeout=10, step=0.02)  # the one at 2 s
    monitor.stop()
    stats = monitor.stats()
    assert len(stats["cpu_usage"]) == len(stats["memory_usage"]) == 1, stats
    assert len((tmp_path / "log.txt").read_text().splitlines()) == 2  # the date, one sample


@pytest.mark.parametrize("variant", VARIANTS, ids=["thread", "process"])
def test_heflwrs_public_attributes(variant: Any, tmp_path: Path) -> None:
    monitor = variant.FileMonitor(str(tmp_path / "log.txt"), 0.2)
    monitor.socket = str(tmp_path / "none.sock")
    is_set = (
        (lambda: monitor.monitoring.is_set())
        if variant is process_monitor
        else (lambda: monitor.monitoring)
    )
    assert not is_set() and monitor.thread is None
    assert monitor.process.pid == monitor.pid  # a psutil.Process, as heflwr's
    monitor.start()
    assert is_set()
    if variant is thread_monitor:
        assert monitor.thread is not None and monitor.thread.is_alive()
    else:
        assert monitor.monitor_process is not None and monitor.monitor_process.poll() is None
    time.sleep(0.3)
    monitor.stop()
    assert not is_set()
    # update_metrics(): heflwr's loop, which a script may run in a thread of its own.
    before = len(monitor.stats()["cpu_usage"])
    driver = threading.Thread(target=monitor.update_metrics)
    driver.start()
    wait_for(lambda: len(monitor.stats()["cpu_usage"]) > before + 1)
    assert is_set() or variant is thread_monitor
    monitor.stop()
    driver.join(timeout=10)
    assert not driver.is_alive() and not monitor.running
