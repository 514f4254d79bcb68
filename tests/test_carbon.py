"""Carbon beside energy: intensity x energy exactly, and nothing at all without an
intensity. The real daemon with the stand-in tegrastats (AGX Thor line, 16.802 W)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from edgewatt.core import carbon
from tests.conftest import ROOT, DaemonProcess, wait_for

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
INTENSITY = 350.0


def device(daemon_factory: Any, **env: str) -> DaemonProcess:
    return daemon_factory(
        interval=0.1,
        extra_args=["--tegrastats", STAND_IN],
        env={
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "EDGEWATT_IDLE_POWER_W": "4",
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            **env,
        },
    )


def test_country_table_loads_and_every_entry_has_a_source() -> None:
    table = carbon.countries()
    assert len(table) >= 30
    for alpha3, entry in table.items():
        assert len(alpha3) == 3 and len(entry["alpha2"]) == 2
        assert 0 <= entry["g_per_kwh"] <= 1500
        assert entry["year"] >= 2020 and "Our World in Data" in entry["source"]
    assert carbon.country("de") == carbon.country("DEU")
    assert carbon.country("FR").g_per_kwh == 67.39
    with pytest.raises(ValueError, match=r"no carbon intensity for country 'XX'.*DE"):
        carbon.country("XX")
    assert carbon.resolve_carbon(None, "") is None
    assert carbon.resolve_carbon(350, "FR").g_per_kwh == 350  # a value wins


def test_carbon_equals_intensity_times_energy(daemon_factory: Any, spawn: Any) -> None:
    daemon = device(daemon_factory, EDGEWATT_CARBON_INTENSITY_G_PER_KWH=str(INTENSITY))
    burner = spawn("while True: pass")
    tid = daemon.register(burner.pid)["id"]
    wait_for(lambda: daemon.value("edgewatt_process_energy_joules_total", edgewatt_target_id=tid))
    # One scrape: energy and carbon from the same snapshot.
    families = {}
    for line in daemon.metrics_text().splitlines():
        if line.startswith(("hw_host_energy", "edgewatt_host_carbon", "edgewatt_process_")):
            name, value = line.rsplit(" ", 1)
            families[name.split("{")[0]] = float(value)
    energy, grams = (
        families["hw_host_energy_joules_total"],
        families["edgewatt_host_carbon_grams_total"],
    )
    assert grams == pytest.approx(energy * INTENSITY / 3.6e6, rel=1e-12)
    mine = families["edgewatt_process_energy_joules_total"]
    assert families["edgewatt_process_carbon_grams_total"] == pytest.approx(
        mine * INTENSITY / 3.6e6, rel=1e-12
    )
    info = next(
        line for line in daemon.metrics_text().splitlines() if line.startswith("target_info")
    )
    assert 'edgewatt_carbon_intensity="350.0"' in info
    assert 'edgewatt_carbon_intensity_source="configured (carbon_intensity_g_per_kwh)"' in info
    # Per phase in the summary, and the host document for clients.
    assert daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "train"})[0] == 201
    daemon.wait_passes(tid, 6)
    summary = daemon.call("GET", f"/v1/targets/{tid}/summary")[1]
    assert summary["carbon_intensity_g_per_kwh"] == INTENSITY
    assert summary["carbon_g"] == pytest.approx(summary["energy_j"] * INTENSITY / 3.6e6, rel=1e-9)
    (phase,) = summary["phases"]
    assert phase["energy_j"] > 0
    assert phase["carbon_g"] == pytest.approx(phase["energy_j"] * INTENSITY / 3.6e6, rel=1e-9)
    host = daemon.call("GET", "/v1/host")[1]
    assert host["carbon"]["intensity_g_per_kwh"] == INTENSITY
    assert host["carbon"]["host_g"] == pytest.approx(
        host["power"]["host_energy_j"] * INTENSITY / 3.6e6, rel=1e-12
    )


def test_nothing_carbon_related_without_an_intensity(daemon_factory: Any, spawn: Any) -> None:
    daemon = device(daemon_factory)
    burner = spawn("while True: pass")
    tid = daemon.register(burner.pid)["id"]
    wait_for(lambda: daemon.value("edgewatt_process_energy_joules_total", edgewatt_target_id=tid))
    assert daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "train"})[0] == 201
    daemon.wait_passes(tid, 3)
    assert "carbon" not in daemon.metrics_text()
    assert "carbon" not in json.dumps(daemon.call("GET", f"/v1/targets/{tid}/summary")[1])
    assert "carbon" not in json.dumps(daemon.call("GET", "/v1/host")[1])
    assert "carbon" not in json.dumps(daemon.call("GET", f"/v1/targets/{tid}/samples")[1])


TRACKED = """
import json, time
from edgewatt import client

@client.track("work")
def work(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "done"

assert work(1.0) == "done"
with client.track("idle") as idle:
    time.sleep(0.5)
print(json.dumps({"work": work.track.last._asdict(), "idle": idle.last._asdict()}))
"""


@pytest.mark.parametrize("intensity", [INTENSITY, None], ids=["with intensity", "without"])
def test_track_reports_duration_energy_and_carbon_per_call(
    daemon_factory: Any, intensity: float | None
) -> None:
    env = {"EDGEWATT_CARBON_INTENSITY_G_PER_KWH": str(intensity)} if intensity else {}
    daemon = device(daemon_factory, **env)
    result = subprocess.run(
        [sys.executable, "-c", TRACKED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "EDGEWATT_SOCKET": daemon.socket},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    work, idle = out["work"], out["idle"]
    # 1 s of CPU cannot take less wall time; a 0.5 s sleep takes at least that.
    assert work["name"] == "work" and work["duration_s"] >= 1.0 - 0.02
    assert work["cpu_s"] == pytest.approx(1.0, abs=0.03)
    assert idle["duration_s"] >= 0.5 and idle["cpu_s"] <= 0.03
    # A busy call gets a share of the power above idle (16.802 - 4 W); sleeping, little.
    assert 0 < work["energy_j"] <= 12.8 * work["duration_s"] * 1.1
    assert idle["energy_j"] < work["energy_j"] / 3
    if intensity:
        assert work["carbon_g"] == pytest.approx(work["energy_j"] * intensity / 3.6e6, rel=1e-9)
    else:
        assert work["carbon_g"] is None and idle["carbon_g"] is None


BURN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"


@pytest.mark.parametrize("intensity", [INTENSITY, None], ids=["with intensity", "without"])
def test_edgewatt_run_prints_carbon_only_when_configured(
    daemon_factory: Any, tmp_path: Any, intensity: float | None
) -> None:
    env = {"EDGEWATT_CARBON_INTENSITY_G_PER_KWH": str(intensity)} if intensity else {}
    daemon = device(daemon_factory, **env)
    out = tmp_path / "run.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--socket", daemon.socket,
         "--interval", "0.2", "--output", str(out), "--", sys.executable, "-c", BURN],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    energy_line = next(line for line in result.stderr.splitlines() if "device energy" in line)
    assert " J (" in energy_line and " Wh)" in energy_line
    if intensity:
        grams = summary["energy_j"] * intensity / 3.6e6
        assert summary["total_carbon_g"] == pytest.approx(grams, rel=1e-12)
        line = next(
            line for line in result.stderr.splitlines() if line.strip().startswith("carbon")
        )
        assert f"{grams:.4f} gCO2e of the device energy (at 350 gCO2e/kWh)" in line
    else:
        assert "carbon" not in result.stderr and "carbon" not in out.read_text()


def test_client_reads_the_same_variables_and_never_raises(caplog: Any) -> None:
    env = carbon.from_environment
    assert env({}) is None
    assert env({"EDGEWATT_CARBON_INTENSITY_G_PER_KWH": "350"}).g_per_kwh == 350
    assert env({"EDGEWATT_CARBON_COUNTRY": "us"}).g_per_kwh == 379.26
    assert env({"EDGEWATT_CARBON_INTENSITY_G_PER_KWH": "lots"}) is None
    assert env({"EDGEWATT_CARBON_INTENSITY_G_PER_KWH": "-1"}) is None
    assert env({"EDGEWATT_CARBON_COUNTRY": "Atlantis"}) is None
    assert "no carbon intensity for country 'Atlantis'" in caplog.text
