"""Outages on the push path, against the real engines (Debian 13's vmagent and
VictoriaMetrics): a store that is down loses nothing the gateway can hold; a gateway
that is down costs the daemon nothing but resolution.

About 100 s; in the default run (`make test`). Alone:
    .venv/bin/pytest tests/test_outage.py
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

from tests.conftest import DaemonProcess, PushPath, query, wait_for

PUSH_S = 1.0
WORK = "while True: pass"  # about one core: CPU seconds track wall seconds


def raw_samples(store: str, selector: str) -> list[tuple[float, float]]:
    """(unix s, value) of every sample VictoriaMetrics holds for ``selector``."""
    q = urllib.parse.urlencode({"match[]": selector, "start": "-1h"})
    with urllib.request.urlopen(f"{store}/api/v1/export?{q}", timeout=10) as r:
        lines = [json.loads(line) for line in r.read().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return [(t / 1000, v) for t, v in zip(lines[0]["timestamps"], lines[0]["values"])]


def samples_once_caught_up(
    push_path: PushPath, selector: str, up: float
) -> list[tuple[float, float]]:
    """The samples of ``selector`` once VictoriaMetrics holds some from after ``up``."""
    wait_for(
        lambda: any(t > up + 2 for t, _ in raw_samples(push_path.victoria, selector)),
        timeout=60,
        step=1,
    )
    return raw_samples(push_path.victoria, selector)


def stored_before(push_path: PushPath, selector: str, pushes: int = 3) -> None:
    """Until VictoriaMetrics holds ``pushes`` samples of ``selector``: the seconds before
    an outage, against which a hole would show."""
    wait_for(lambda: len(raw_samples(push_path.victoria, selector)) >= pushes, timeout=30, step=0.5)


def pushing_daemon(daemon_factory: Any, push_path: PushPath, spawn: Any) -> tuple[Any, str]:
    daemon: DaemonProcess = daemon_factory(
        interval=0.5,
        extra_args=["--otlp-endpoint", f"{push_path.vmagent}/opentelemetry"],
        env={
            "EDGEWATT_HOST_NAME": "jetson-a",
            "OTEL_METRIC_EXPORT_INTERVAL": str(int(PUSH_S * 1000)),
            "EDGEWATT_OTLP_TIMEOUT": "1",
        },
    )
    tid = daemon.register(spawn(WORK).pid, labels={"run": "outage"})["id"]
    selector = f'process_cpu_time_seconds_total{{edgewatt_target_id="{tid}",cpu_mode="user"}}'
    wait_for(lambda: query(push_path.victoria, selector), timeout=30, step=0.5)
    return daemon, selector


def test_a_store_down_for_60_s_behind_vmagent_leaves_no_gap(
    push_path: PushPath, daemon_factory: Any, spawn: Any
) -> None:
    _, selector = pushing_daemon(daemon_factory, push_path, spawn)
    stored_before(push_path, selector)
    push_path.stop("victoria-metrics")
    down = time.time()
    time.sleep(60)
    push_path.start("victoria-metrics")
    up = time.time()
    samples = samples_once_caught_up(push_path, selector, up)  # what vmagent buffered too
    during = [t for t, _ in samples if down < t < up]
    assert len(during) >= 40  # about one a second (pushes run late under load)
    # What was lost would show as a hole the outage's length; a push may come a
    # second or two late on two busy cores (seen: 3.0 s once, in CI).
    times = [t for t, _ in samples if down - 3 < t < up + 2]
    assert max(b - a for a, b in zip(times, times[1:])) < 5 * PUSH_S
    values = [v for _, v in samples]
    assert values == sorted(values)  # a counter: never back, no reset


def test_a_gateway_down_costs_resolution_only_and_one_log_line_each_way(
    push_path: PushPath, daemon_factory: Any, spawn: Any
) -> None:
    """The daemon keeps no queue of its own: what it pushes while the gateway is down
    is dropped (OTel SDK, after the export timeout), and the cumulative counters carry
    the work done meanwhile into the first push after it."""
    daemon, selector = pushing_daemon(daemon_factory, push_path, spawn)
    stored_before(push_path, selector)
    push_path.stop("vmagent")
    down = time.time()
    latencies = []
    for _ in range(15):  # 15 s of outage, /metrics scraped every second
        started = time.perf_counter()
        daemon.metrics_text()
        latencies.append(time.perf_counter() - started)
        time.sleep(1)
    push_path.start("vmagent")
    up = time.time()
    samples = samples_once_caught_up(push_path, selector, up)
    assert [t for t, _ in samples if down + PUSH_S * 2 < t < up - PUSH_S * 2] == []  # dropped
    before = max((t, v) for t, v in samples if t < down)
    after = min((t, v) for t, v in samples if t > up)
    # The counter's step over the gap holds the CPU time the target used meanwhile.
    assert after[1] - before[1] > 0.3 * (after[0] - before[0])
    assert max(latencies) < 0.5  # scrapes never wait for the gateway
    log = daemon.log()
    assert log.count("OTLP export to") == 2, log  # failing, then works again
    assert "works again" in log
