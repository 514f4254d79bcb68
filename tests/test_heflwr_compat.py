"""The drop-in monitors against heflwr 0.1.91 itself (tests/bin/fetch-heflwr).

Each script is written as heflwr's documentation tells a user to (docs/en/api/monitor.md:
construct, set_metrics, start, the work, stop, stats() and summary()). It runs once with
heflwr, in heflwr's own venv with its heflwr.monitor and heflwr.log loaded without the
package's __init__ (which imports torch and flwr), and once with edgewatt, with only the
import line changed. What a script can observe is compared: the keys and types of
stats() and summary() (before start() too), the log file line by line modulo figures,
the gauge names scraped from /metrics, what a /simple_log and a /log server receive and
the stdout echo, and the accumulation over two rounds. The figures themselves differ
where edgewatt measures better (docs/reference.md, "heflwr.monitor drop-in").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, fetched, free_port, wait_for

VARIANTS = ["thread_monitor", "process_monitor"]

# heflwr's package found, not imported: its monitor and log subpackages load on their
# own, its __init__ (torch, flwr) never runs. Then the script, as `python script.py`.
PRELUDE = """
import importlib.util, runpy, sys, types
spec = importlib.util.find_spec("heflwr")
package = types.ModuleType("heflwr")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["heflwr"] = package
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# A figure: an int, a float, a float in exponent notation.
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@pytest.fixture(scope="module")
def heflwr_python() -> str:
    return fetched(ROOT / ".cache" / "heflwr", "bin/python", "heflwr 0.1.91", "fetch-heflwr")


def run_both(
    heflwr_python: str, script: str, tmp_path: Path, args: list[str], **popen: Any
) -> dict[str, subprocess.CompletedProcess[str]]:
    """The script with heflwr, then with edgewatt (the import line changed), each in a
    folder of its own; ``{ARG}`` in ``args`` is that folder."""
    results = {}
    for who in ("heflwr", "edgewatt"):
        folder = tmp_path / who
        folder.mkdir()
        text = script if who == "heflwr" else script.replace("heflwr.monitor", "edgewatt.client")
        assert who == "heflwr" or "edgewatt.client" in text
        path = folder / "script.py"
        path.write_text(text)
        command = (
            [heflwr_python, "-c", PRELUDE, str(path)]
            if who == "heflwr"
            else [sys.executable, str(path)]
        )
        # No daemon: edgewatt samples in-process (the daemon's figures are its own tests').
        env = {**os.environ, "EDGEWATT_SOCKET": str(tmp_path / "none.sock")}
        results[who] = subprocess.run(
            [*command, *(a.replace("{ARG}", str(folder)) for a in args)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            **popen,
        )
        assert results[who].returncode == 0, (who, results[who].stderr)
    return results


def shape(line: str) -> str:
    return NUMBER.sub("N", line)


def runs(lines: list[str]) -> list[str]:
    """Shapes with consecutive repeats collapsed: the number of samples per round
    depends on timing (heflwr's first network sample waits 5 s)."""
    shapes = [shape(line) for line in lines]
    return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]


def types_of(value: Any) -> Any:
    """The keys and value types of stats() / summary() (after a JSON round trip, which
    keeps int apart from float)."""
    if isinstance(value, dict):
        return {k: types_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return sorted({type(v).__name__ for v in value})
    return type(value).__name__


FILE_SCRIPT = """
import copy, json, sys, time
from heflwr.monitor.{variant} import FileMonitor

monitor = FileMonitor(file="./log.txt", interval=0.5)
before = copy.deepcopy([monitor.stats(), monitor.summary()])  # heflwr's stats() is live
monitor.start()
end = time.time() + 1.0
while time.time() < end:
    pass
monitor.stop()
with open(sys.argv[1], "w") as f:
    json.dump({{"before": before, "after": [monitor.stats(), monitor.summary()]}}, f)
"""


@pytest.mark.parametrize("variant", VARIANTS)
def test_file_monitor_keys_types_and_log_format(
    variant: str, heflwr_python: str, tmp_path: Path
) -> None:
    run_both(heflwr_python, FILE_SCRIPT.format(variant=variant), tmp_path, ["{ARG}/out.json"])
    out = {w: json.loads((tmp_path / w / "out.json").read_text()) for w in ("heflwr", "edgewatt")}
    heflwr, edgewatt = out["heflwr"], out["edgewatt"]
    # Before start(): the same seven empty lists and seven zeros, values included.
    assert edgewatt["before"] == heflwr["before"]
    assert list(edgewatt["before"][0]) == list(heflwr["before"][0])  # and in its order
    # After: the same keys in the same order, each value of the same type.
    for got, want in zip(edgewatt["after"], heflwr["after"]):
        assert list(got) == list(want)
        assert {k: v for k, v in types_of(got).items() if v} == {
            k: v for k, v in types_of(want).items() if v
        }
    stats = edgewatt["after"][0]
    assert stats["cpu_usage"] and stats["network_bytes_sent"] and not stats["power_vdd_in"]
    logs = {w: (tmp_path / w / "log.txt").read_text() for w in ("heflwr", "edgewatt")}
    assert (
        runs(logs["edgewatt"].splitlines())
        == runs(logs["heflwr"].splitlines())
        == [
            "N-N-N N:N:N",
            "CPU Usage: N%, Memory Usage: N%, Bytes Sent: N, Bytes Recv: N, ",
        ]
    )
    assert logs["edgewatt"].endswith(", \n") and logs["heflwr"].endswith(", \n")


ROUNDS_SCRIPT = """
import copy, json, sys, time
from heflwr.monitor.{variant} import FileMonitor

monitor = FileMonitor(file="./log.txt", interval=0.5)
monitor.set_metrics(network=False)
counts = []
for server_round in range(2):
    monitor.start()
    time.sleep(1.25)
    monitor.stop()
    counts.append(len(monitor.stats()["cpu_usage"]))
    if server_round == 0:
        first = copy.deepcopy(monitor.stats())
with open(sys.argv[1], "w") as f:
    json.dump({{"counts": counts, "first": first, "stats": monitor.stats(),
                "summary": monitor.summary()}}, f)
"""


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_rounds_accumulate_as_heflwrs(variant: str, heflwr_python: str, tmp_path: Path) -> None:
    run_both(heflwr_python, ROUNDS_SCRIPT.format(variant=variant), tmp_path, ["{ARG}/out.json"])
    for who in ("heflwr", "edgewatt"):
        out = json.loads((tmp_path / who / "out.json").read_text())
        n1, n2 = out["counts"]
        # One set of samples for the monitor's life: round 2 adds to round 1's.
        assert 1 <= n1 < n2, (who, out["counts"])
        assert all(out["stats"][k][:n1] == v for k, v in out["first"].items()), who
        assert out["stats"]["network_bytes_sent"] == [], who  # off: empty, not absent
        assert out["summary"]["total_network_bytes_sent"] == 0, who
        lines = (tmp_path / who / "log.txt").read_text().splitlines()
        # Appended at each start: a date line, that round's samples, a date line, ...
        assert runs(lines) == ["N-N-N N:N:N", "CPU Usage: N%, Memory Usage: N%, "] * 2, who
        assert len(lines) == n2 + 2, who


POWER_SCRIPT = """
import json, sys, time
from heflwr.monitor.thread_monitor import FileMonitor

monitor = FileMonitor(file="./log.txt", interval=0.5)
monitor.set_metrics(network=False, power=True)
monitor.start()
time.sleep(1.0)
monitor.stop()
summary = monitor.summary()
print("energy:", summary["total_power_vdd_in"], "mJ")
with open(sys.argv[1], "w") as f:
    json.dump([monitor.stats(), summary], f)
"""


def test_power_on_without_a_sensor_reads_zero_and_keeps_sampling(
    heflwr_python: str, tmp_path: Path
) -> None:
    results = run_both(heflwr_python, POWER_SCRIPT, tmp_path, ["{ARG}/out.json"])
    out = {w: json.loads((tmp_path / w / "out.json").read_text()) for w in results}
    for who in results:
        assert results[who].stdout == "energy: 0 mJ\n", who
        assert list(out[who][1]) == list(out["heflwr"][1])
        assert out[who][0]["power_vdd_in"] == [] and out[who][1]["total_power_vdd_in"] == 0
    # heflwr's power sampler dies with a TypeError (no tegrastats): its loop ends after
    # the first sample. edgewatt keeps sampling CPU and memory.
    assert "TypeError" in results["heflwr"].stderr
    assert len(out["heflwr"][0]["cpu_usage"]) == 1
    assert len(out["edgewatt"][0]["cpu_usage"]) >= 2
    assert "Traceback" not in results["edgewatt"].stderr


PROMETHEUS_SCRIPT = """
import sys
from heflwr.monitor.{variant} import PrometheusMonitor

monitor = PrometheusMonitor(port=int(sys.argv[1]), interval=0.5)
monitor.set_metrics(network=False)
monitor.start()
print("started", flush=True)
sys.stdin.readline()
monitor.stop()
"""


def scrape_types(port: int) -> dict[str, str]:
    """{name: TYPE} of every family on /metrics, once the seven gauges are there."""

    def scrape() -> dict[str, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        return kinds if "vdd_soc" in kinds else {}

    return wait_for(scrape, timeout=20)


@pytest.mark.parametrize("variant", VARIANTS)
def test_prometheus_gauge_names(variant: str, heflwr_python: str, tmp_path: Path) -> None:
    served = {}
    for who, command in (
        ("heflwr", [heflwr_python, "-c", PRELUDE]),
        ("edgewatt", [sys.executable]),
    ):
        script = PROMETHEUS_SCRIPT.format(variant=variant)
        if who == "edgewatt":
            script = script.replace("heflwr.monitor", "edgewatt.client")
        path = tmp_path / f"prometheus-{who}.py"  # not heflwr.py: it would shadow the package
        path.write_text(script)
        port = free_port()
        env = {**os.environ, "EDGEWATT_SOCKET": str(tmp_path / "none.sock")}
        with subprocess.Popen(
            [*command, str(path), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                assert proc.stdout.readline() == "started\n"
                served[who] = scrape_types(port)
            finally:
                proc.stdin.write("\n")
                proc.stdin.flush()
                assert proc.wait(timeout=30) == 0
    heflwr_gauges = {"cpu_usage", "memory_usage", "bytes_sent", "bytes_recv", "vdd_in"}
    assert heflwr_gauges | {"vdd_cpu_gpu_cv", "vdd_soc"} <= set(served["heflwr"])
    # The same families, of the same types: heflwr's seven gauges and what its default
    # registry serves besides (process_*, python_*).
    assert served["edgewatt"] == served["heflwr"]


class Receiver:
    """A real HTTP server, as heflwr's users run for /simple_log and /log."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, dict[str, str]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                form = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
                receiver.posts.append((self.path, self.headers["Content-Type"], form))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


REMOTE_SCRIPT = """
import sys, time
from heflwr.monitor.{variant} import RemoteMonitor

monitor = RemoteMonitor(host=sys.argv[1], interval=0.5, identifier="client-1", simple={simple})
monitor.set_metrics(network=False)
monitor.start()
time.sleep(1.2)
monitor.stop()
"""

# The fields of a log record that say where the code is or when it ran: their values
# differ by nature (heflwr's remote_monitor.py, edgewatt's _heflwr.py).
WHERE_AND_WHEN = {
    "pathname", "filename", "module", "lineno", "created", "msecs", "relativeCreated",
    "thread", "threadName", "processName", "process", "asctime", "msg", "message",
}  # fmt: skip


@pytest.mark.parametrize("simple", [True, False], ids=["simple_log", "log"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_remote_monitor_posts_and_echo(
    variant: str, simple: bool, heflwr_python: str, tmp_path: Path, receiver: Receiver
) -> None:
    script = REMOTE_SCRIPT.format(variant=variant, simple=simple)
    received = {}
    results = {}
    for who in ("heflwr", "edgewatt"):
        receiver.posts.clear()
        folder = tmp_path / who
        folder.mkdir()
        text = script if who == "heflwr" else script.replace("heflwr.monitor", "edgewatt.client")
        (folder / "script.py").write_text(text)
        command = [heflwr_python, "-c", PRELUDE] if who == "heflwr" else [sys.executable]
        env = {**os.environ, "EDGEWATT_SOCKET": str(tmp_path / "none.sock")}
        results[who] = subprocess.run(
            [*command, str(folder / "script.py"), f"127.0.0.1:{receiver.port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert results[who].returncode == 0, results[who].stderr
        wait_for(lambda: receiver.posts, timeout=10)
        received[who] = list(receiver.posts)
    heflwr, edgewatt = received["heflwr"], received["edgewatt"]
    path = "/simple_log" if simple else "/log"
    for posts in (heflwr, edgewatt):
        assert {(p, c) for p, c, _ in posts} == {(path, "application/x-www-form-urlencoded")}
    want, got = heflwr[0][2], edgewatt[0][2]
    # taskName is a record field from Python 3.12 on: the same interpreter version here.
    assert list(got) == list(want)
    assert {k: v for k, v in got.items() if k not in WHERE_AND_WHEN} == {
        k: v for k, v in want.items() if k not in WHERE_AND_WHEN
    }
    assert shape(got["message"]) == shape(want["message"]) == "Cpu Usage: N%, Memory Usage: N%, "
    if not simple:
        assert got["name"] == "HeFlwr" and got["args"] == "()"
        assert got["funcName"] == "update_metrics" and got["msg"] == got["message"]
        assert shape(got["asctime"]) == shape(want["asctime"]) == "N-N-N N:N:N,N"
    # Each sample echoed on stdout through the HeFlwr logger, in heflwr's format; the
    # file:line says whose code logged it.
    echoes = {}
    for who, result in results.items():
        lines = [re.sub(r"\| \S+\.py:\d+ \|", "| FILE |", ln) for ln in result.stdout.splitlines()]
        assert lines, who
        echoes[who] = set(runs(lines))
    assert (
        echoes["edgewatt"]
        == echoes["heflwr"]
        == {"INFO HeFlwr N-N-N N:N:N,N | FILE | Cpu Usage: N%, Memory Usage: N%, "}
    )
    assert len(results["edgewatt"].stdout.splitlines()) == len(edgewatt)
