"""The daemon's memory under process churn: the budget is flat RSS (growth under 5 MiB)
across 5,000 register/exit cycles, with the real daemon scraped as Prometheus would,
both on its own and pushing OTLP (where the SDK's per-series state is what could grow)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.measure import otlp_sink, rss_bytes
from tests.conftest import wait_for

BATCH = 250
CYCLES = 5000
MIB = 2**20


@pytest.fixture
def otlp_receiver() -> Iterator[str]:
    server = otlp_sink()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _churn(daemon: Any, warmup: int) -> None:
    """``warmup`` cycles, then CYCLES more, over which RSS may grow by under 5 MiB."""
    rss: dict[int, int] = {}
    done = 0
    while done < warmup + CYCLES:
        procs = [subprocess.Popen(["sleep", "60"]) for _ in range(BATCH)]
        for i, p in enumerate(procs):
            daemon.register(p.pid, labels={"run": f"churn-{done + i}"})
        # Sampled and scraped, so their series exist.
        last, first = f'run="churn-{done + BATCH - 1}"', f'run="churn-{done}"'
        wait_for(lambda: last in daemon.metrics_text())  # noqa: B023 - used at once
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        wait_for(lambda: first not in daemon.metrics_text())  # noqa: B023 - exits noticed
        done += BATCH
        if done % 1000 == 0:
            rss[done] = rss_bytes(daemon.proc.pid)
    growth = rss[warmup + CYCLES] - rss[warmup]
    readings = ", ".join(f"{k}: {v / MIB:.1f}" for k, v in rss.items())
    assert growth < 5 * MIB, f"RSS in MiB after so many cycles: {readings}"


def test_rss_is_flat_across_5000_register_exit_cycles(daemon_factory: Any) -> None:
    # The first 1,000 cycles fill the allocator's pools and the exited-target table
    # (bounded by max_targets); from then on nothing may accumulate.
    _churn(daemon_factory(interval=0.1), warmup=1000)


def test_rss_is_flat_across_5000_cycles_with_otlp_push(
    daemon_factory: Any, otlp_receiver: str
) -> None:
    daemon = daemon_factory(
        interval=0.1,
        extra_args=["--otlp-endpoint", otlp_receiver],
        env={"EDGEWATT_OTLP_INTERVAL": "1"},  # the SDK collects and exports every second
    )
    # The pipeline is rebuilt (new threads, new exporter) every 200 exits and takes
    # ~2,000 cycles to reach its high-water mark: benchmarks/churn.py read 56.4 MiB at
    # 1,000 cycles, then 57.6 to 60.6 MiB from 2,000 to 10,000.
    _churn(daemon, warmup=2000)
    # The SDK's state was released along the way, not just small: the pipeline was
    # rebuilt after every series_rotation (default 200) exited targets.
    assert "rebuilt the OTel pipeline" in daemon.log()
