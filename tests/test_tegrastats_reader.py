"""The long-running tegrastats reader against the stand-in replaying real lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.power.tegrastats import TegrastatsReader, TegrastatsSource
from tests.conftest import wait_for

STAND_IN = Path(__file__).parent / "bin" / "tegrastats"
# The four Orin Nano lines of the fixtures, in file order: their VDD_IN in watts.
ORIN_NANO_VDD_IN = [12.479, 4.824, 4.761, 4.548]


@pytest.fixture
def invocations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "invocations.log"
    monkeypatch.setenv("FAKE_TEGRASTATS_LOG", str(log))
    return log


def test_reader_delivers_each_replayed_line(invocations: Path) -> None:
    reader = TegrastatsReader(str(STAND_IN), interval_s=0.05)
    seen: list[float] = []
    reader.start()
    try:

        def collect() -> bool:
            latest = reader.latest
            if latest is not None and (not seen or latest.sample.rails_w["VDD_IN"] != seen[-1]):
                seen.append(latest.sample.rails_w["VDD_IN"])
            return len(seen) >= 6

        wait_for(collect, timeout=10, step=0.01)
    finally:
        reader.close()
    start = ORIN_NANO_VDD_IN.index(seen[0])
    cycle = ORIN_NANO_VDD_IN * 3
    assert seen == cycle[start : start + len(seen)]
    assert invocations.read_text().splitlines() == ["--interval 50"]


def test_reader_restarts_a_crashed_tegrastats(invocations: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("FAKE_TEGRASTATS_EXIT_AFTER", "2")
    reader = TegrastatsReader(str(STAND_IN), interval_s=0.02, max_backoff_s=0.2)
    reader.start()
    try:
        wait_for(lambda: reader.restarts >= 2, timeout=15)
        source = TegrastatsSource(reader)
        reading = source.read()
        assert reading is not None and reading.total_w in ORIN_NANO_VDD_IN
    finally:
        reader.close()
    runs = invocations.read_text().splitlines()
    assert len(runs) >= 2  # the first run and at least one restart
    assert all(run == "--interval 20" for run in runs)  # never --stop


def test_close_terminates_only_its_own_child(invocations: Path) -> None:
    reader = TegrastatsReader(str(STAND_IN), interval_s=0.05)
    reader.start()
    wait_for(lambda: reader.latest is not None, timeout=10)
    proc = reader._proc
    assert proc is not None and proc.poll() is None
    reader.close()
    assert proc.poll() is not None
    assert "--stop" not in invocations.read_text()


def test_missing_executable_is_retried_quietly(tmp_path: Path) -> None:
    reader = TegrastatsReader(str(tmp_path / "nope"), interval_s=0.05, max_backoff_s=0.1)
    reader.start()
    try:
        wait_for(lambda: reader.restarts >= 2, timeout=10)
        assert reader.latest is None
    finally:
        reader.close()


def test_source_reports_rails_gpu_and_temperatures() -> None:
    reader = TegrastatsReader(str(STAND_IN), interval_s=0.05)
    reader.start()
    try:
        wait_for(lambda: reader.latest is not None, timeout=10)
        reading = TegrastatsSource(reader).read()
    finally:
        reader.close()
    assert reading is not None
    names = {r.name: r.type for r in reading.rails}
    assert names == {"VDD_IN": "power_supply", "VDD_CPU_GPU_CV": "gpu", "VDD_SOC": "power_supply"}
    assert reading.gpus[0].id == "tegrastats:GR3D"
    assert set(reading.temperatures_c) >= {"cpu", "gpu", "tj"}


def test_lines_are_bounded_and_an_overlong_one_is_skipped_to_its_end() -> None:
    import io

    from edgewatt.core.power.tegrastats import bounded_lines

    stream = io.BufferedReader(io.BytesIO(b"ok 1\n" + b"x" * 100_000 + b"\nok 2\nlast"))
    assert list(bounded_lines(stream, 4096)) == [b"ok 1\n", None, b"ok 2\n", b"last"]
    exact = io.BufferedReader(io.BytesIO(b"y" * 4096 + b"\n"))
    assert list(bounded_lines(exact, 4096)) == [b"y" * 4096 + b"\n"]
