"""A target's sample rows (`GET /v1/targets/ID/samples`, `edgewatt run --output`, the
plot's power panel) hold the device's energy at each row's instant as the power trace
settles it: an edge's row is taken past a push source's last line (its power held), and
once the line after it has come the row holds the trace's integral up to its instant.
So the rows' differences are the device's energy between them: never below zero,
never above the highest power printed, and they add up to the summary's device energy.
(The ring and the history's part, at unit level: tests/test_row.py, test_history.py.)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from edgewatt import client
from edgewatt.client import DaemonBackend, Options
from tests.conftest import ROOT

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
LOW_MA, HIGH_MA = 1000, 2400  # 5 V times these: 5 W and 12 W


def intervals(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Each pair of adjacent rows' time between them (s) and device energy (J)."""
    return [
        (b["time"] - a["time"], b["device_energy_j"] - a["device_energy_j"])
        for a, b in zip(rows, rows[1:])
        if b["time"] > a["time"]
    ]


def test_sample_rows_hold_the_settled_energy_between_them(
    daemon_factory: Any, tmp_path: Path
) -> None:
    # The board input alternates between 5 W and 12 W every 0.15 s, printed at 10 Hz:
    # a row held past a line at 12 W overshoots the line after it at 5 W.
    current = tmp_path / "curr1_input"
    current.write_text(f"{LOW_MA}\n")
    daemon = daemon_factory(
        interval=1.0,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            "EDGEWATT_POWER_SAMPLE_HZ": "10",
            "FAKE_TEGRASTATS_POWER_FILE": str(current),
        },
    )
    stop = threading.Event()

    def alternate() -> None:
        high = False
        while not stop.wait(0.15):
            high = not high
            current.write_text(f"{HIGH_MA if high else LOW_MA}\n")

    flipper = threading.Thread(target=alternate)
    flipper.start()
    backend = DaemonBackend(daemon.socket, daemon.register(os.getpid(), children=False))
    reg = client.Registration(daemon.socket, Options(os.getpid(), {}), "never", backend)
    target = backend.id
    try:
        step = client.track("step", reg)
        for _ in range(80):  # an edge's row every ~10 ms: several between two lines
            with step:
                pass
            stop.wait(0.01)
    finally:
        stop.set()
        flipper.join()
        reg.close()
    status, summary = daemon.call("GET", f"/v1/targets/{target}/summary?final=5")
    assert status == 200 and summary["final"] is True

    def settled() -> list[dict[str, Any]]:
        status, answer = daemon.call("GET", f"/v1/targets/{target}/samples")
        assert status == 200
        rows = [r for r in answer["samples"] if r["device_energy_j"] is not None]
        # The summary is final to its last row: each row says it is final too.
        assert all(r["final"] is True for r in answer["samples"]), answer["samples"][-3:]
        gaps = intervals(rows)
        # Row times are shown to the ms: a 10 ms interval's power is good to 10 %.
        assert all(j >= 0 and j <= 12.0 * (dt + 0.001) for dt, j in gaps), gaps
        # Every row the summary spans is kept (the ring holds 300).
        assert 160 < len(rows) == summary["samples"], (len(rows), summary["samples"])
        return rows

    # The rows add up to the window they span: the summary's device energy is the
    # trace's integral between the first and the last row (to its rounding, 1 mJ),
    # once the line after the last row has come (the summary waited for it).
    rows = settled()
    across = rows[-1]["device_energy_j"] - rows[0]["device_energy_j"]
    assert abs(across - summary["device_energy_j"]) <= 0.001, (across, summary)
