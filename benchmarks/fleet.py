"""A simulated fleet: N daemons pushing OTLP through vmagent into VictoriaMetrics.

Each daemon has its own host name (dev-00, dev-01, ...) and machine id
(OTEL_RESOURCE_ATTRIBUTES service.instance.id), the stand-in tegrastats (AGX Orin
lines) and two registered targets; half push gzip-compressed (the default), half with
OTEL_EXPORTER_OTLP_COMPRESSION=none, each through its own byte-counting TCP relay, so
the bytes on the wire per export are measured for both in one run. Then the fleet
dashboard's device list and top-10 table and the recording rules are queried in
VictoriaMetrics, and the series per device counted there.

    tests/bin/fetch-stores      # Debian 13's vmagent and VictoriaMetrics
    .venv/bin/python benchmarks/fleet.py [--devices 20] [--duration 60] [--push-interval 5]
        [--json out.json]

Bytes per device-hour are given at the default push interval (otlp_interval, 60 s):
bytes per export x 60. Not a CI test: it runs for minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
STORES = ROOT / ".cache" / "stores" / "usr" / "bin"
STAND_IN = ROOT / "tests" / "bin" / "tegrastats"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CountingRelay:
    """TCP relays from a local port each to one upstream, counting the bytes each
    relay carries towards the upstream (the requests: what a device sends)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sent: dict[int, int] = {}  # listening port -> bytes towards upstream
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True).start()

    def listen(self) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        server.setblocking(False)
        port = int(server.getsockname()[1])
        self.sent[port] = 0
        with self._lock:
            self._selector.register(server, selectors.EVENT_READ, ("accept", port))
        return port

    def _loop(self) -> None:
        while True:
            with self._lock:
                events = self._selector.select(timeout=0.05) if self._selector.get_map() else []
            for key, _ in events:
                kind, data = key.data
                if kind == "accept":
                    try:
                        client, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    except BlockingIOError:
                        continue
                    try:
                        upstream = socket.create_connection(self.upstream)
                    except OSError:  # the gateway is gone (the run is ending)
                        client.close()
                        continue
                    client.setblocking(False)
                    upstream.setblocking(False)
                    with self._lock:
                        self._selector.register(
                            client, selectors.EVENT_READ, ("up", (upstream, data))
                        )
                        self._selector.register(
                            upstream, selectors.EVENT_READ, ("down", (client, None))
                        )
                    continue
                peer, port = data
                try:
                    chunk = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    with self._lock:
                        for s in (key.fileobj, peer):
                            with contextlib.suppress(KeyError, ValueError):
                                self._selector.unregister(s)
                            s.close()
                    continue
                if kind == "up":
                    self.sent[port] += len(chunk)
                peer.setblocking(True)
                peer.sendall(chunk)
                peer.setblocking(False)


def get(url: str, path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=30) as r:
        return json.load(r)["data"]


def wait_healthy(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of pushing")
    parser.add_argument("--push-interval", type=float, default=5.0, help="seconds per export")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    for name in ("victoria-metrics", "vmagent"):
        if not (STORES / name).exists():
            raise SystemExit(f"{STORES / name} missing: run tests/bin/fetch-stores")
    work = Path(tempfile.mkdtemp(prefix="edgewatt-fleet-"))
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], name: str, **kw: Any) -> subprocess.Popen[bytes]:
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kw)
        procs.append(proc)
        return proc

    try:
        vm_port, agent_port = free_port(), free_port()
        vm, agent = f"http://127.0.0.1:{vm_port}", f"http://127.0.0.1:{agent_port}"
        start([str(STORES / "victoria-metrics"), f"-httpListenAddr=127.0.0.1:{vm_port}",
               f"-storageDataPath={work / 'vm'}", "-search.latencyOffset=1s"], "vm")  # fmt: skip
        wait_healthy(f"{vm}/health")
        start([str(STORES / "vmagent"), f"-httpListenAddr=127.0.0.1:{agent_port}",
               "-opentelemetry.usePrometheusNaming", f"-remoteWrite.url={vm}/api/v1/write",
               f"-remoteWrite.tmpDataPath={work / 'vmagent'}",
               "-remoteWrite.flushInterval=1s"], "vmagent")  # fmt: skip
        wait_healthy(f"{agent}/health")
        relay = CountingRelay(("127.0.0.1", agent_port))
        devices = []
        for n in range(args.devices):
            host = f"dev-{n:02d}"
            gzipped = n % 2 == 0
            port = relay.listen()
            env = {
                **os.environ,
                "EDGEWATT_HOST_NAME": host,
                "EDGEWATT_POWER_SOURCES": "tegrastats",
                "EDGEWATT_IDLE_POWER_W": "4",
                "FAKE_TEGRASTATS_MODEL": "AGX Orin",
                "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id=fleet-bench-{n:02d}",
                "OTEL_METRIC_EXPORT_INTERVAL": str(int(args.push_interval * 1000)),
            }
            if not gzipped:
                env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "none"
            sock = work / f"{host}.sock"
            start([sys.executable, "-m", "edgewatt.cli", "serve", "--socket", str(sock),
                   "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(work / host),
                   "--tegrastats", str(STAND_IN), "--otlp-endpoint",
                   f"http://127.0.0.1:{port}/opentelemetry"], host, env=env, cwd=ROOT)  # fmt: skip
            devices.append((host, gzipped, port, sock))
        from edgewatt.core import transport

        for host, _, _, sock in devices:
            deadline = time.monotonic() + 60
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            for i in range(2):
                worker = start(["sleep", "3600"], f"{host}-worker{i}")
                status, body = transport.call(
                    str(sock), "POST", "/v1/targets",
                    {"pid": worker.pid, "labels": {"run": f"{host}-run{i}"}},
                )  # fmt: skip
                assert status == 201, body
        relay.sent = dict.fromkeys(relay.sent, 0)  # count from here: steady pushes only
        started = time.monotonic()
        time.sleep(args.duration)
        elapsed = time.monotonic() - started
        exports = elapsed / args.push_interval
        per_export = {
            gz: statistics.mean(relay.sent[p] / exports for _, g, p, _ in devices if g == gz)
            for gz in (True, False)
        }
        time.sleep(3)  # the last remote writes
        listed = get(vm, "/api/v1/label/host_name/values", **{"match[]": "edgewatt_targets"})
        top = get(vm, "/api/v1/query", query=(
            "topk(10, sum by (host_name, edgewatt_target_id, process_executable_name) "
            "(increase(edgewatt_process_energy_joules_total[5m])))"))["result"]  # fmt: skip
        series = get(vm, "/api/v1/query", query='count by (host_name) ({host_name=~"dev-.*"})')
        per_device = sorted(int(r["value"][1]) for r in series["result"])
        rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/recording.yml").read_text())
        evaluated = {
            rule["record"]: len(get(vm, "/api/v1/query", query=rule["expr"])["result"])
            for group in rules["groups"]
            for rule in group["rules"]
        }
        result = {
            "devices": args.devices,
            "devices_listed": len(listed),
            "top10_rows": len(top),
            "recording_rules_with_results": evaluated,
            "series_per_device_min_median_max": [
                per_device[0],
                statistics.median(per_device),
                per_device[-1],
            ],
            "bytes_per_export_gzip": round(per_export[True]),
            "bytes_per_export_plain": round(per_export[False]),
            "bytes_per_device_hour_at_60s_gzip": round(per_export[True] * 60),
            "bytes_per_device_hour_at_60s_plain": round(per_export[False] * 60),
            "push_interval_s": args.push_interval,
            "measured_s": round(elapsed, 1),
        }
        print(json.dumps(result, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
