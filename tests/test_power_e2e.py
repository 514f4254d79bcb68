"""The daemon end to end with the stand-in tegrastats replaying a real Jetson line."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, DaemonProcess, query, rounded_quotient, wait_for

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
THOR_VIN_W = 16.802  # the AGX Thor fixture line: VIN 16802mW
IDLE_W = 4.0


@pytest.fixture
def thor(daemon_factory: Any) -> DaemonProcess:
    return daemon_factory(
        interval=0.25,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "EDGEWATT_IDLE_POWER_W": str(IDLE_W),
            "EDGEWATT_POWER_SOURCES": "tegrastats",
        },
    )


def test_device_rails_and_target_energy_exported(thor: DaemonProcess, spawn: Any) -> None:
    burner = spawn("while True: pass")
    tid = thor.register(burner.pid, labels={"run": "power"})["id"]
    wait_for(lambda: thor.value("edgewatt_process_energy_joules_total", edgewatt_target_id=tid))
    assert thor.value("hw_host_power_watts", hw_id="host") == THOR_VIN_W
    rails = {lbl["hw_name"]: v for lbl, v in thor.series("hw_power_watts")}
    assert rails == {"VDD_GPU": 0.0, "VDD_CPU_SOC_MSS": 5.535, "VIN_SYS_5V0": 5.04, "VIN": 16.802}
    assert thor.value("edgewatt_host_idle_power_watts") == IDLE_W
    assert thor.call("GET", "/healthz")[1]["power_sources"] == ["tegrastats"]
    temps = {lbl["hw_name"]: v for lbl, v in thor.series("hw_temperature_celsius")}
    assert temps == {"cpu": 30.468, "tj": 31.218, "soc012": 30.218, "soc345": 31.218}

    energies, host_energies, powers = [], [], []
    first = thor.call("GET", f"/v1/targets/{tid}")[1]["latest"]
    for _ in range(8):
        thor.wait_passes(tid)
        energies.append(thor.value("edgewatt_process_energy_joules_total", edgewatt_target_id=tid))
        host_energies.append(thor.value("hw_host_energy_joules_total"))
        powers.append(thor.value("edgewatt_process_power_watts", edgewatt_target_id=tid))
    # Never more than the power above idle; a busy target gets some of it (its share
    # of the host's busy CPU, which other work on the machine can make small).
    assert all(p is not None and 0 <= p <= THOR_VIN_W - IDLE_W + 1e-9 for p in powers), powers
    assert max(powers) > 0  # type: ignore[type-var]
    assert energies == sorted(energies) and energies[-1] > energies[0]
    assert all(e <= h for e, h in zip(energies, host_energies))
    # The device's counter grows at the measured 16.802 W, exactly: the stand-in's one
    # line, integrated over the sensor's instants, asked at the two passes' own (not over
    # the test's waits, which a busy machine stretches). A row's instant is its wall time
    # moved by the offset of the two clocks, read one after the other at its pass: they
    # agree to a microsecond (a ms where the sampler is preempted between the two reads).
    last = thor.call("GET", f"/v1/targets/{tid}")[1]["latest"]
    joules = last["device_energy_j"] - first["device_energy_j"]
    assert joules / THOR_VIN_W == pytest.approx(last["time"] - first["time"], abs=0.001)


def test_health_says_how_power_is_read_and_names_a_source_gone_silent(
    thor: DaemonProcess,
) -> None:
    # tegrastats prints on its own: nothing is streamed, so no reader runs and the
    # automatic rate stays where it starts, unmeasured.
    health = wait_for(lambda: (h := thor.call("GET", "/healthz")[1])["power_sources"] and h)
    power = {k: v for k, v in health.items() if k.startswith("power_")}
    assert health["status"] == "ok"
    assert power == {
        "power_sources": ["tegrastats"],
        "power_sources_silent": [],
        "power_sources_aside": {},
        "power_sample_hz": 50.0,
        "power_reader": "none",
        "power_reader_priority": None,
        "power_reading_cpu_us": None,
        "power_window_hz": 200.0,
        "power_window_readings": 0,
        "power_windows_refused": 0,
    }
    assert thor.proc is not None
    children = " ".join(
        p.read_text() for p in Path(f"/proc/{thor.proc.pid}/task").glob("*/children")
    )
    (child,) = [int(pid) for pid in children.split()]  # the stand-in, the only child
    os.kill(child, signal.SIGSTOP)  # silent, not dead: nothing restarts it
    try:
        # Past max_gap_s (5 s here) it drops out of the snapshot, and health says so.
        wait_for(
            lambda: thor.call("GET", "/healthz")[1]["power_sources_silent"] == ["tegrastats"],
            timeout=30,
            step=0.5,
        )
        health = thor.call("GET", "/healthz")[1]
        assert health["status"] == "degraded" and health["power_sources"] == []
    finally:
        os.kill(child, signal.SIGCONT)
    wait_for(lambda: thor.call("GET", "/healthz")[1]["status"] == "ok", timeout=30, step=0.5)


def test_summary_reports_energy_per_phase(thor: DaemonProcess, spawn: Any) -> None:
    burner = spawn("while True: pass")
    tid = thor.register(burner.pid)["id"]
    wait_for(lambda: thor.value("edgewatt_process_energy_joules_total", edgewatt_target_id=tid))
    for name in ("warmup", "train"):
        assert thor.call("POST", f"/v1/targets/{tid}/phase", {"name": name})[0] == 201
        thor.wait_passes(tid, 4)  # a second of them
    summary = thor.call("GET", f"/v1/targets/{tid}/summary")[1]
    assert [p["name"] for p in summary["phases"]] == ["warmup", "train"]
    for phase in summary["phases"]:
        assert phase["energy_j"] > 0
        # Energy is counted over sensor timestamps, duration over sample timestamps:
        # their ratio can exceed the power above idle by the jitter between the two.
        assert 0 < phase["power_avg_w"] <= (THOR_VIN_W - IDLE_W) * 1.02
        # The same energy over the same duration, each shown to the millijoule and the
        # millisecond, the average to the milliwatt: equal but for those roundings.
        low, high = rounded_quotient(phase["energy_j"], phase["duration_s"])
        assert low - 0.0005 <= phase["power_avg_w"] <= high + 0.0005, phase
        # The device's energy over it: the stand-in's constant VIN, read since well
        # before the phase began, integrated over the sensor's instants and asked at the
        # phase's edges. Exact, so its average rounds to the line's 16.802 W.
        assert phase["device_power_avg_w"] == THOR_VIN_W, phase
        low, high = rounded_quotient(phase["device_energy_j"], phase["duration_s"])
        assert low <= THOR_VIN_W <= high, phase
        # Busy all along: CPU time in each phase, however much of a core it got.
        assert phase["cpu_user_s"] + phase["cpu_system_s"] > 0.02
    assert summary["energy_j"] >= sum(p["energy_j"] for p in summary["phases"]) - 1e-6
    samples = thor.call("GET", f"/v1/targets/{tid}/samples")[1]
    assert samples["units"]["energy_j"].startswith("joules")
    assert samples["samples"][-1]["energy_j"] > 0


def test_prometheus_queries_device_and_process_energy(
    thor: DaemonProcess, spawn: Any, prometheus_factory: Any
) -> None:
    url = prometheus_factory(thor)
    burner = spawn("while True: pass")
    tid = thor.register(burner.pid, labels={"run": "prom-power"})["id"]
    host = wait_for(lambda: query(url, "hw_host_power_watts"), timeout=30, step=0.5)
    assert float(host[0]["value"][1]) == THOR_VIN_W
    # The whole device as the conventions name it: hw.id required (v1.44), one series.
    assert [r["metric"]["hw_id"] for r in host] == ["host"]
    device = wait_for(lambda: query(url, "hw_host_energy_joules_total"), timeout=30, step=0.5)
    assert [r["metric"]["hw_id"] for r in device] == ["host"]
    energy = wait_for(
        lambda: query(url, 'edgewatt_process_energy_joules_total{run="prom-power"}'),
        timeout=30,
        step=0.5,
    )
    assert energy[0]["metric"]["edgewatt_target_id"] == tid
    assert float(energy[0]["value"][1]) > 0


def test_without_power_sources_no_power_series(daemon: DaemonProcess, spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    tid = daemon.register(child.pid)["id"]
    wait_for(lambda: daemon.series("process_memory_usage_bytes", edgewatt_target_id=tid))
    text = daemon.metrics_text()
    assert "hw_host_power_watts" not in text and "edgewatt_process_energy" not in text
    summary = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
    assert summary["energy_j"] is None and summary["power_avg_w"] is None
