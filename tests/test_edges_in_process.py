"""Edges never wait in-process either: no daemon, the client's own sampler running the
stand-in tegrastats at 1 Hz (as `sample_hz: 1` runs the real one), its board input
from a file the test writes. A phase's or a tracked call's edges return without
waiting for a line, their figures say they are not final until the line after them
has come and are the trace's integral over exactly their edges after, as through the
daemon (tests/test_edges.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt import client
from tests.conftest import wait_for
from tests.test_edges import (
    STAND_IN,
    WATTS,
    a_phase_over_a_step,
    after_a_line,
    assert_none_waited,
    assert_the_interpolated_integral,
    burn,
    none_printed,
    printed,
)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[client.Registration]:
    registration = register_in_process(monkeypatch, tmp_path)
    yield registration
    registration.close()


def register_in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> client.Registration:
    """This process registered in-process (fallback="always"), its power the stand-in
    tegrastats alone (named by the daemon's variable; an empty sysfs holds no other
    source), printing once a second."""
    current = tmp_path / "curr1_input"
    current.write_text("1000\n")  # 5 V x 1000 mA
    (tmp_path / "sys").mkdir()
    monkeypatch.setenv("EDGEWATT_SYSFS_PATH", str(tmp_path / "sys"))
    monkeypatch.setenv("EDGEWATT_TEGRASTATS", STAND_IN)
    monkeypatch.setenv("EDGEWATT_POWER_SAMPLE_HZ", "1")
    monkeypatch.setenv("FAKE_TEGRASTATS_POWER_FILE", str(current))
    monkeypatch.setenv("FAKE_TEGRASTATS_LINES", str(tmp_path / "lines.log"))
    registration = client.register(fallback="always")
    assert registration.mode == "local"
    # The stand-in runs (started by its reader's thread), this process's child, the one
    # source.
    assert wait_for(registration.helper_pids, timeout=10)
    backend: Any = registration.backend
    assert [s.name for s in backend.sampler.power.sources] == ["tegrastats"]
    return registration


def test_no_edge_waits_and_each_window_becomes_final(
    in_process: client.Registration, tmp_path: Path
) -> None:
    reg = in_process
    costs: list[float] = []
    unfinal = {"phase": 0, "track": 0}
    step = client.track("step", reg)
    for i in range(3):
        after_a_line(tmp_path)  # the next line 0.9 s away: an edge that waited, 0.25 s
        started = time.monotonic()
        reg.phase(f"phase-{i}")
        costs.append(time.monotonic() - started)
        burn(0.05)
        ending = time.monotonic()
        ended = reg.end_phase()
        costs.append(time.monotonic() - ending)
        assert ended is not None
        if none_printed(tmp_path, ending):
            assert ended["final"] is False
            unfinal["phase"] += 1
        entering = time.monotonic()
        step.__enter__()
        leaving = time.monotonic()
        burn(0.05)
        step.__exit__(None, None, None)
        costs += [leaving - entering, time.monotonic() - leaving]
        measured = step.last
        assert measured is not None
        if none_printed(tmp_path, leaving):
            assert measured.final is False
            unfinal["track"] += 1
    assert_none_waited(costs)
    assert min(unfinal.values()) >= 2, unfinal
    summary = reg.summary(final_wait_s=5.0)
    assert summary["final"] is True
    assert summary["device_energy_j"] == pytest.approx(WATTS * summary["duration_s"], rel=0.01)
    assert len(summary["phases"]) == 6
    for phase in summary["phases"]:
        assert phase["final"] is True
        assert phase["device_energy_j"] == pytest.approx(WATTS * phase["duration_s"], rel=0.01)
        assert phase["cpu_user_s"] + phase["cpu_system_s"] >= 0.03  # burn()'s, in ticks


def test_the_first_registration_waits_for_no_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The registration starts the stand-in, whose first line comes a period (1 s) after
    # it starts: the registration and the first phase edge return before that line,
    # their counters taken at the call; the window before the first line is counted
    # all the same, final once the line has come.
    monkeypatch.setenv("FAKE_TEGRASTATS_FIRST_LATE", "1")
    asked = time.time()
    reg = register_in_process(monkeypatch, tmp_path)
    try:
        returned = time.time()
        reg.phase("first")
        entered = time.monotonic()
        lines = printed(tmp_path)
        assert all(t > entered for t, _ in lines), (entered, lines)
        backend: Any = reg.backend
        first = backend.samples()[0]
        assert asked <= first["time"] <= returned
        burn(0.05)
        assert reg.summary()["final"] is False  # no line yet: the energy is not known
        after_a_line(tmp_path)
        ended = reg.end_phase(final_wait_s=5.0)
        summary = reg.summary(final_wait_s=5.0)
    finally:
        reg.close()
    assert ended is not None and ended["final"] is True
    assert ended["device_energy_j"] == pytest.approx(WATTS * ended["duration_s"], rel=0.01)
    assert summary["final"] is True
    assert summary["device_energy_j"] == pytest.approx(WATTS * summary["duration_s"], rel=0.01)
    (phase,) = summary["phases"]
    assert phase["device_energy_j"] == ended["device_energy_j"]
    assert phase["cpu_user_s"] + phase["cpu_system_s"] >= 0.03  # burn()'s, in ticks


def test_a_phase_over_changing_power_is_the_interpolated_integral_over_its_edges(
    in_process: client.Registration, tmp_path: Path
) -> None:
    # As through the daemon: 5 W, then 15 W, then 5 W a second apart; a phase from
    # half a second after the first line to half a second after the second holds
    # 12.5 J, where the held power would give 15 J.
    reg = in_process
    phase, offset = a_phase_over_a_step(reg, tmp_path)
    backend: Any = reg.backend
    assert_the_interpolated_integral(phase, backend.samples(), offset, tmp_path)


def test_a_tracked_call_inside_a_phase_leaves_it_running(in_process: client.Registration) -> None:
    reg = in_process
    step = client.track("step", reg)
    with reg.phase("epoch"):
        burn(0.1)
        with step:
            burn(0.1)
            inner = reg.summary()["phases"]
        burn(0.1)
    assert [(p["name"], p["depth"], p["ended_at"]) for p in inner] == [
        ("epoch", 0, None),
        ("step", 1, None),
    ]
    epoch, call = reg.summary(final_wait_s=5.0)["phases"]
    assert epoch["started_at"] <= call["started_at"] <= call["ended_at"] <= epoch["ended_at"]
    # The kernel's count, in ticks of 10 ms (each edge's a tick off at most).
    call_cpu = call["cpu_user_s"] + call["cpu_system_s"]
    epoch_cpu = epoch["cpu_user_s"] + epoch["cpu_system_s"]
    assert call_cpu >= 0.08 and epoch_cpu >= call_cpu + 0.16, (epoch_cpu, call_cpu)
    assert epoch["final"] is True and call["final"] is True
    assert epoch["device_energy_j"] > call["device_energy_j"] > 0
