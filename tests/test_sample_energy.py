"""A target's sample rows (`GET /v1/targets/ID/samples`, `edgewatt run --output`, the
plot's power panel) hold the device's energy at each row's instant as the power trace
settles it: an edge's row is taken past a push source's last line (its power held), and
once the line after it has come the row holds the trace's integral up to its instant.
So the rows' differences are the device's energy between them: never below zero,
never above the highest power printed, and they add up to the summary's device energy.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

from edgewatt import client
from edgewatt.client import DaemonBackend, Options
from edgewatt.core.targets.history import MAX_YOUNG_ROWS, History
from edgewatt.core.targets.row import RowRing, SampleRow, row_of
from tests.conftest import ROOT, wait_for
from tests.snapshots import process

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
        for _ in range(120):  # an edge's row every ~10 ms: several between two lines
            with step:
                pass
            stop.wait(0.01)
    finally:
        stop.set()
        flipper.join()
        reg.close()
    status, summary = daemon.call("GET", f"/v1/targets/{target}/summary?final=5")
    assert status == 200 and summary["final"] is True

    def settled() -> list[dict[str, Any]] | None:
        status, answer = daemon.call("GET", f"/v1/targets/{target}/samples")
        assert status == 200
        rows = [r for r in answer["samples"] if r["device_energy_j"] is not None]
        gaps = intervals(rows)
        # Row times are shown to the ms: a 10 ms interval's power is good to 10 %.
        if all(j >= 0 and j <= 12.0 * (dt + 0.001) for dt, j in gaps):
            return rows
        return None

    rows = wait_for(settled, timeout=10.0, step=0.2)
    assert len(rows) > 200
    # The rows add up to the window they span: the summary's device energy is the
    # trace's integral between the first and the last row (to its rounding, 1 mJ).
    across = rows[-1]["device_energy_j"] - rows[0]["device_energy_j"]
    assert abs(across - summary["device_energy_j"]) <= 0.001, (across, summary)


def _row(at: float, device_j: float | None) -> SampleRow:
    """A row read at ``at`` s (monotonic) with the device's energy then."""
    sample = dataclasses.replace(process(0), time=1_700_000_000.0 + at, device_energy_j=device_j)
    return row_of(sample, at)


def test_a_ring_row_takes_its_settled_energy_in_place_after_the_ring_wraps() -> None:
    ring = RowRing(3)
    for i in range(5):  # rows 2, 3 and 4 kept: the records wrapped
        ring.append(_row(float(i), 10.0 * i))
    assert [ring.device_energy(i) for i in range(3)] == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0)]
    ring.settle_device_energy(1, 27.5)
    assert [r.device_energy_j for r in ring] == [20.0, 27.5, 40.0]
    assert [r.monotonic for r in ring] == [2.0, 3.0, 4.0]
    assert ring[1]._replace(device_energy_j=30.0) == _row(3.0, 30.0)  # nothing else moved


def test_young_rows_settle_oldest_first_up_to_the_first_not_final() -> None:
    history = History(10)
    for i, joules in enumerate([1.0, None, 3.5, 4.5, 6.0]):
        history.add(_row(float(i), joules))
    assert history.young == 5
    # The trace has a reading up to 3.2 s: rows at 0..3 s settle, the one at 4 s waits.
    truth = {0.0: 0.5, 2.0: 3.0, 3.0: 4.0}
    assert history.settle_rows(lambda t: truth.get(t) if t <= 3.2 else None) is False
    assert history.young == 1
    # The row without a sensor's energy stays without one; the others are the trace's.
    assert [r.device_energy_j for r in history.rows] == [0.5, None, 3.0, 4.0, 6.0]
    assert history.settle_rows(lambda t: 5.25) is True
    assert [r.device_energy_j for r in history.rows] == [0.5, None, 3.0, 4.0, 5.25]
    assert history.young == 0


def test_young_rows_are_bounded() -> None:
    history = History(2 * MAX_YOUNG_ROWS)
    for i in range(MAX_YOUNG_ROWS + 6):
        history.add(_row(float(i), float(i)))
    assert history.young == MAX_YOUNG_ROWS
    history.settle_rows(lambda t: t + 0.5)
    # The six oldest were past the bound: they keep the energy their pass saw.
    assert [r.device_energy_j for r in history.rows][:7] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.5]
