"""InfluxDB as a store: the real daemon pushing into Debian's influxdb 1.6.7, started
here in a temporary directory on free ports. Every InfluxQL query of the dashboard
returns data; a target's energy (and each phase's) in InfluxDB is its summary's; an
outage of 30 s loses nothing that fits the buffer; hostile label values come back as
the line protocol allows. The v2 API's requests (2.x and 3.x, not packaged by Debian)
are checked as a server receives them."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter import config
from edgewatt.exporter.influx import (
    InfluxOptions,
    InfluxPusher,
    escape_tag,
    kept_bytes,
    line,
    snapshot_lines,
)
from tests.conftest import ROOT, DaemonProcess, binary, free_port, wait_for
from tests.snapshots import POWER, process

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "influxdb.json"
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
DATABASE = "edgewatt"


class InfluxServer:
    """influxd on free ports, its data in ``directory``: stopped and started again on
    the same data, as a real outage would."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        conf = directory / "influxdb.conf"
        conf.write_text(
            f'reporting-disabled = true\nbind-address = "127.0.0.1:{free_port()}"\n'
            f'[meta]\n  dir = "{directory}/meta"\n'
            f'[data]\n  dir = "{directory}/data"\n  wal-dir = "{directory}/wal"\n'
            "  query-log-enabled = false\n"
            f'[http]\n  bind-address = "127.0.0.1:{self.port}"\n  log-enabled = false\n'
            "[monitor]\n  store-enabled = false\n[continuous_queries]\n  enabled = false\n"
        )
        self.conf = conf

    def start(self) -> InfluxServer:
        log = open(self.directory / "influxd.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [binary("influxd", "influxdb"), "-config", str(self.conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(self._up, timeout=30)
        self.query(f'CREATE DATABASE "{DATABASE}"', database="")
        return self

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "influxd exited"
        try:
            with urllib.request.urlopen(self.url + "/ping", timeout=1) as answer:
                return answer.status == 204
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)

    def query(self, q: str, database: str = DATABASE) -> list[dict[str, Any]]:
        """The series of the first statement's result (each: name, tags, columns, values)."""
        params = {"q": q, "epoch": "ns"}
        if database:
            params["db"] = database
        request = urllib.request.Request(
            self.url + "/query", data=urllib.parse.urlencode(params).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result = json.loads(answer.read())["results"][0]
        assert "error" not in result, (q, result)
        return result.get("series", [])


@pytest.fixture
def influxdb(tmp_path: Path) -> Iterator[InfluxServer]:
    server = InfluxServer(tmp_path / "influx")
    server.start()
    yield server
    server.stop()


def _daemon(
    factory: Any, server: InfluxServer, interval_s: float = 1.0, **env: str
) -> DaemonProcess:
    return factory(
        interval=0.5,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            "EDGEWATT_POWER_SAMPLE_HZ": "10",
            "EDGEWATT_INFLUX_URL": server.url,
            "EDGEWATT_INFLUX_DATABASE": DATABASE,
            "EDGEWATT_INFLUX_INTERVAL": str(interval_s),
            **env,
        },
    )


WORKLOAD = """
import json, sys, time
from edgewatt import client
r = client.register(labels={"run": "influx-e2e"})
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
with r.phase("load"):
    burn(1.5)
with r.phase("save"):
    time.sleep(0.5)
    burn(0.5)
print(json.dumps({"id": r.id}), flush=True)
time.sleep(1.0)
"""  # it exits registered: its final sample is the last point


def _dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["query"]) for p in board["panels"] for t in p["targets"]]


def _filled(query: str) -> str:
    return (
        query.replace("$timeFilter", "time > now() - 10m")
        .replace("$__interval", "2s")
        .replace("$device", ".*")
    )


def test_the_daemons_figures_land_in_influxdb_and_every_dashboard_query_reads_them(
    daemon_factory: Any, influxdb: InfluxServer
) -> None:
    daemon = _daemon(daemon_factory, influxdb)
    run = subprocess.run(
        [sys.executable, "-c", WORKLOAD], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "EDGEWATT_SOCKET": daemon.socket},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    tid = json.loads(run.stdout)["id"]
    summary = wait_for(
        lambda: (
            (s := daemon.call("GET", f"/v1/targets/{tid}/summary")[1])["state"] == "exited" and s
        ),
        timeout=15,
    )
    # About 20 pushes of 50 lines (20 s on an idle host; a busy one's come later).
    status = wait_for(
        lambda: (s := daemon.call("GET", "/healthz")[1]["influx"])["written_lines"] > 1000 and s,
        timeout=60,
    )
    assert status["failing"] is False, status
    assert status["dropped_lines"] == status["refused_lines"] == 0, status

    # Every InfluxQL query of the dashboard returns data.
    for title, query in _dashboard_queries():
        series = influxdb.query(_filled(query))
        values = [v for s in series for row in s["values"] for v in row[1:] if v is not None]
        assert values, (title, _filled(query))

    # The target's energy, and each phase's, are its summary's (which rounds to mJ),
    # once the push that holds its final sample is stored (a busy host's comes late).
    where = f"\"edgewatt_target_id\" = '{tid}'"

    def stored_energy() -> list[dict[str, Any]]:
        return influxdb.query(
            f'SELECT last("value") FROM "edgewatt_process_energy_joules" WHERE {where}'
        )

    with contextlib.suppress(AssertionError):  # what still differs is said below
        wait_for(
            lambda: (
                (rows := stored_energy())
                and abs(rows[0]["values"][0][1] - summary["energy_j"]) <= 0.0006
            ),
            timeout=30,
            step=0.5,
        )
    energy = stored_energy()
    assert energy[0]["values"][0][1] == pytest.approx(summary["energy_j"], abs=0.0006)
    assert summary["energy_j"] > 0
    phases = influxdb.query(
        f'SELECT last("value") FROM "edgewatt_process_phase_energy_joules" WHERE {where} '
        'GROUP BY "edgewatt_phase"'
    )
    stored = {s["tags"]["edgewatt_phase"]: s["values"][0][1] for s in phases}
    wanted = {p["name"]: p["energy_j"] for p in summary["phases"]}
    assert stored.keys() == wanted.keys() == {"load", "save"}
    for name, joules in wanted.items():
        assert stored[name] == pytest.approx(joules, abs=0.0006), (stored, wanted)
    # Power per rail per host, as the seed's query reads it.
    rails = influxdb.query(
        'SELECT mean("value") FROM "hw_power_watts" WHERE time > now() - 10m '
        'GROUP BY "host_name", "hw_name"'
    )
    assert {s["tags"]["hw_name"] for s in rails} >= {"VDD_IN"}


def test_thirty_seconds_without_influxdb_lose_nothing_that_fits_the_buffer(
    daemon_factory: Any, influxdb: InfluxServer
) -> None:
    daemon = _daemon(daemon_factory, influxdb, interval_s=0.5)
    # A point stored before the outage (each push the latest pass's, 0.5 s old at most).
    wait_for(lambda: daemon.call("GET", "/healthz")[1]["influx"]["written_lines"] > 0, timeout=15)
    outage_start = time.time()
    influxdb.stop()
    wait_for(lambda: daemon.call("GET", "/healthz")[1]["influx"]["failing"], timeout=10)
    time.sleep(30)
    outage_end = time.time()
    influxdb.start()
    drained = wait_for(
        lambda: (
            (s := daemon.call("GET", "/healthz")[1]["influx"])["queued_lines"] == 0
            and not s["failing"]
            and s
        ),
        timeout=30,
    )
    # And a push after it: a point of a pass after the outage, stored.
    written = drained["written_lines"]
    wait_for(lambda: daemon.call("GET", "/healthz")[1]["influx"]["written_lines"] > written)
    series = influxdb.query(
        f'SELECT "value" FROM "hw_host_power_watts" WHERE time > {int((outage_start - 3) * 1e9)}'
    )
    times = [row[0] / 1e9 for row in series[0]["values"]]
    assert times[0] < outage_start and times[-1] > outage_end
    gaps = [b - a for a, b in zip(times, times[1:])]
    # A point every push (0.5 s, each the latest pass's), none missing across the outage.
    assert max(gaps) < 1.6, (
        max(gaps),
        outage_start,
        outage_end,
        [(t, g) for t, g in zip(times, gaps) if g > 0.7],
    )
    assert len([t for t in times if outage_start < t < outage_end]) >= 50
    status = daemon.call("GET", "/healthz")[1]["influx"]
    assert status["dropped_lines"] == 0, status
    log = daemon.log()
    assert log.count("InfluxDB writes to") == 2, log  # one line each way
    assert "are failing" in log and "work again" in log


HOSTILE = {
    "team": 'a,b=c d"e',
    "path": "C:\\runs\\",
    "note": "two\nlines",
    "quote": "it's \\, here",
    "uni": "é😀 ok",
}


def test_hostile_label_values_come_back_as_the_line_protocol_allows(
    daemon_factory: Any, influxdb: InfluxServer, spawn: Any
) -> None:
    daemon = _daemon(daemon_factory, influxdb, interval_s=0.5)
    sleeper = spawn("import time; time.sleep(60)")
    tid = daemon.register(sleeper.pid, labels=HOSTILE)["id"]
    where = f"\"edgewatt_target_id\" = '{tid}'"
    wait_for(
        lambda: influxdb.query(f'SELECT "value" FROM "process_memory_usage_bytes" WHERE {where}'),
        timeout=15,
    )
    series = influxdb.query(
        f'SELECT last("value") FROM "process_memory_usage_bytes" WHERE {where} '
        f"GROUP BY {', '.join(f'{chr(34)}{k}{chr(34)}' for k in HOSTILE)}"
    )
    assert series[0]["tags"] == {
        "team": 'a,b=c d"e',  # commas, equals signs, spaces, quotes: as given
        "path": "C:\\runs\\ ",  # a trailing backslash would escape what follows: a space
        "note": "two lines",  # no escape carries a line break
        "quote": "it's \\, here",
        "uni": "é😀 ok",
    }


def test_a_line_is_what_the_protocol_says() -> None:
    assert escape_tag("a b,c=d") == "a\\ b\\,c\\=d"
    assert escape_tag("end\\") == "end\\\\ "
    text = line("hw_power_watts", {"hw.name": "VDD IN", "host.name": "h", "empty": ""}, 2, 10)
    assert text == "hw_power_watts,host_name=h,hw_name=VDD\\ IN value=2.0 10"
    assert line("x", {}, float("nan"), 1) is None


class Recorder(http.server.BaseHTTPRequestHandler):
    """What a v2 write endpoint receives."""

    received: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.received.append((self.path, dict(self.headers), body))
        self.send_response(Recorder.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.received = []
    Recorder.status = 204
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _pass(sequence: int = 1) -> Snapshot:
    return Snapshot(
        time=1_796_000_000.0 + sequence,
        sequence=sequence,
        host=None,
        processes=(process(1),),
        power=POWER,
        host_name="h",
    )


def test_the_v2_api_gets_org_bucket_token_and_gzip(recorder: str) -> None:
    pusher = InfluxPusher(InfluxOptions(recorder, org="lab", bucket="edge", token="s3cr3t"))
    pusher.update(_pass())
    pusher.push()
    path, headers, body = Recorder.received[0]
    url = urllib.parse.urlsplit(path)
    assert url.path == "/api/v2/write"
    assert urllib.parse.parse_qs(url.query) == {
        "org": ["lab"], "bucket": ["edge"], "precision": ["ns"]
    }  # fmt: skip
    assert headers["Authorization"] == "Token s3cr3t"
    assert headers["Content-Encoding"] == "gzip"
    lines = gzip.decompress(body).decode().splitlines()
    energy = [t for t in lines if t.startswith("edgewatt_process_energy_joules,")]
    assert energy == [
        "edgewatt_process_energy_joules,edgewatt_target_id=t1,host_name=h,process_executable_name="
        f"python3,process_pid=1001,run=x value=10.0 {int(_pass().time * 1e9)}"
    ]
    assert pusher.status()["written_lines"] == len(lines)


def test_a_refused_batch_is_dropped_and_counted_a_failing_server_kept_up_to_the_bound(
    recorder: str,
) -> None:
    Recorder.status = 400
    pusher = InfluxPusher(InfluxOptions(recorder, database="x"))
    pusher.update(_pass())
    pusher.push()
    assert pusher.status()["refused_lines"] > 0 and not pusher.queue
    Recorder.status = 503
    pusher = InfluxPusher(InfluxOptions(recorder, database="x", buffer_bytes=20_000))
    made = 0
    for sequence in range(1, 40):
        pusher.update(_pass(sequence))
        pusher.push()
        made += sum(kept_bytes(t.encode()) for t in snapshot_lines(pusher.specs, _pass(sequence)))
    status = pusher.status()
    assert status["failing"] and status["dropped_lines"] > 0
    # Bytes, each line's and PER_LINE_BYTES for its keeping: what is kept and what went.
    kept = sum(kept_bytes(data) for data in pusher.queue)
    longest = max(kept_bytes(data) for data in pusher.queue)
    assert status["queued_bytes"] == kept and kept <= 20_000 < kept + longest
    assert kept + status["dropped_bytes"] == made
    newest = int(_pass(39).time * 1e9)
    assert pusher.queue[-1].endswith(f" {newest}".encode())  # the oldest went, the newest stay


def test_influx_settings_from_the_usual_variables_and_a_missing_bucket_named() -> None:
    built = config.build(
        None,
        {"INFLUX_HOST": "http://influx:8086", "INFLUX_ORG": "lab", "INFLUX_BUCKET": "edge",
         "INFLUX_TOKEN": "t"},
        {},
    )  # fmt: skip
    assert (built.influx_url, built.influx_org, built.influx_bucket, built.influx_token) == (
        "http://influx:8086", "lab", "edge", "t"
    )  # fmt: skip
    with pytest.raises(config.ConfigError, match=re.escape("influx_bucket unset")):
        config.build(None, {"INFLUX_HOST": "http://influx:8086", "INFLUX_ORG": "lab"}, {})


def test_a_server_that_answers_garbage_is_an_outage_not_a_crash() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-not-http\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        pusher = InfluxPusher(InfluxOptions(f"http://127.0.0.1:{port}", database="x"))
        pusher.update(_pass())
        pusher.push()  # never raises
        status = pusher.status()
        assert status["failing"] and status["queued_lines"] > 0 and status["written_lines"] == 0
    finally:
        listener.close()
