"""Every energy figure says where it comes from (docs/attribution.md, Provenance): the
real daemon with a push source (the stand-in tegrastats), a pull source (INA3221
monitors laid out as the kernel does) and none, in its summaries, in `edgewatt run`'s
table and --output file, and in `edgewatt report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgewatt.cli.rounds import rounds_table
from edgewatt.client.fl_record import client_figures
from edgewatt.core import energy_source
from edgewatt.core.power.provenance import NO_SOURCE
from tests.conftest import ROOT, DaemonProcess, wait_for
from tests.test_otlp import Received, http_receiver  # noqa: F401 - a fixture
from tests.test_power_sources import ORIN_HWMON, write

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
RULE = "dynamic-by-cpu-gpu-time"
# The stand-in's AGX Thor line: VIN is the board input; under the automatic rate
# tegrastats runs at 10 Hz (source.py, AUTO_PUSH_HZ).
THOR_SENSORS = [{"source": "tegrastats", "rail": "VIN", "read": "printed", "rate_hz": 10.0}]


def measured(sensors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"method": "measured", "sensors": sensors, "rule": None, "reason": None}


def attributed(sensors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"method": "attributed", "sensors": sensors, "rule": RULE, "reason": None}


def summary_with_energy(daemon: DaemonProcess, tid: str) -> dict[str, Any]:
    """The target's summary once its energy figures are there."""
    return wait_for(
        lambda: (
            (s := daemon.call("GET", f"/v1/targets/{tid}/summary")[1])["energy_j"] is not None
            and s["phases"]
            and s["phases"][0]["energy_j"] is not None
            and s
        )
    )


def test_push_source_names_tegrastats_its_input_rail_and_rate(
    daemon_factory: Any, spawn: Any
) -> None:
    daemon = daemon_factory(
        interval=0.25,
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_POWER_SOURCES": "tegrastats"},
    )
    tid = daemon.register(spawn("while True: pass").pid)["id"]
    daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "epoch-1"})
    summary = summary_with_energy(daemon, tid)
    assert summary["device_energy_provenance"] == measured(THOR_SENSORS)
    assert summary["energy_provenance"] == attributed(THOR_SENSORS)
    (phase,) = summary["phases"]
    assert phase["device_energy_provenance"] == measured(THOR_SENSORS)
    assert phase["energy_provenance"] == attributed(THOR_SENSORS)
    ((labels, value),) = daemon.series("edgewatt_energy_source_info")
    assert value == 1
    assert {k: v for k, v in labels.items() if k != "host_name"} == {
        "method": "measured",
        "source": "tegrastats",
        "rail": "VIN",
        "read": "printed",
        "rate_hz": "10",
        "rule": RULE,
    }
    once = subprocess.run(
        [*EDGEWATT, "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    assert once.stdout.splitlines()[1].endswith(" J since start; tegrastats VIN at 10 Hz")


def test_pull_source_names_the_monitors_input_rail_and_the_readers_rate(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    write(tmp_path / "sys", ORIN_HWMON)
    daemon = daemon_factory(
        interval=0.25,
        env={
            "EDGEWATT_SYSFS_PATH": str(tmp_path / "sys"),
            "EDGEWATT_POWER_SOURCES": "ina3221",
            "EDGEWATT_POWER_SAMPLE_HZ": "20",
        },
    )
    tid = daemon.register(spawn("while True: pass").pid)["id"]
    daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "epoch-1"})
    sensors = [{"source": "ina3221", "rail": "VDD_IN", "read": "stream", "rate_hz": 20.0}]
    summary = summary_with_energy(daemon, tid)
    assert summary["device_energy_provenance"] == measured(sensors)
    assert summary["energy_provenance"] == attributed(sensors)


def test_no_source_says_unknown_and_why(daemon_factory: Any, spawn: Any, tmp_path: Path) -> None:
    daemon = daemon_factory(
        interval=0.25,
        extra_args=["--tegrastats", str(tmp_path / "none")],
        env={"EDGEWATT_SYSFS_PATH": str(tmp_path)},  # nothing laid out: no monitor, no RAPL
    )
    tid = daemon.register(spawn("import time; time.sleep(60)").pid)["id"]
    daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "epoch-1"})
    summary = wait_for(
        lambda: (s := daemon.call("GET", f"/v1/targets/{tid}/summary")[1])["samples"] >= 2 and s
    )
    none = {"method": "unknown", "sensors": [], "rule": None, "reason": NO_SOURCE}
    assert summary["energy_j"] is None and summary["device_energy_j"] is None
    assert summary["energy_provenance"] == none
    assert summary["device_energy_provenance"] == none
    assert summary["phases"][0]["energy_provenance"] == none
    ((labels, value),) = daemon.series("edgewatt_energy_source_info")
    assert value == 1
    assert {k: v for k, v in labels.items() if k != "host_name"} == {
        "method": "unknown",
        "reason": NO_SOURCE,
    }


def test_run_output_and_report_say_where_the_energy_comes_from(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor", "EDGEWATT_POWER_SOURCES": "tegrastats"},
    )
    out = tmp_path / "run.jsonl"
    work = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass"
    ran = subprocess.run(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--output", str(out),
         "--", sys.executable, "-c", work],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    line = (
        "energy from        measured by tegrastats VIN at 10 Hz; attributed by "
        f"{RULE} (docs/attribution.md)"
    )
    assert line in ran.stderr
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["type"] == "summary"
    assert summary["energy_provenance"] == attributed(THOR_SENSORS)
    assert summary["device_energy_provenance"] == measured(THOR_SENSORS)
    report = subprocess.run(
        [*EDGEWATT, "report", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert report.returncode == 0, report.stderr
    assert line in report.stdout


def test_otlp_carries_the_energy_source_as_attributes(daemon_factory: Any, request: Any) -> None:
    received: Received
    endpoint, received = request.getfixturevalue("http_receiver")
    daemon_factory(
        interval=0.2,
        extra_args=["--tegrastats", STAND_IN, "--otlp-endpoint", endpoint],
        env={
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "EDGEWATT_POWER_SOURCES": "tegrastats",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        },
    )
    points = wait_for(lambda: received.points("edgewatt.energy.source.info"), timeout=20)
    assert points[-1][0] == {  # an int gauge's 1, as edgewatt.device.info's
        "method": "measured",
        "source": "tegrastats",
        "rail": "VIN",
        "read": "printed",
        "rate_hz": "10",
        "rule": RULE,
    }


def test_each_kind_as_one_line_and_in_a_flower_round_record() -> None:
    pull = [{"source": "ina3221", "rail": "VDD_IN", "read": "stream", "rate_hz": 50.0}]
    counters = [
        {"source": "rapl", "rail": "package-0+dram", "read": "counter", "rate_hz": None},
        {"source": "nvml", "rail": "GPU 0 NVIDIA H200", "read": "counter", "rate_hz": None},
    ]
    none = {"method": "unknown", "sensors": [], "rule": None, "reason": NO_SOURCE}
    lines = {
        "push": energy_source.line(attributed(THOR_SENSORS)),
        "pull": energy_source.line(measured(pull)),
        "counters": energy_source.line(measured(counters)),
        "none": energy_source.line(none),
    }
    assert lines == {
        "push": f"measured by tegrastats VIN at 10 Hz; attributed by {RULE} (docs/attribution.md)",
        "pull": "measured by ina3221 VDD_IN at 50 Hz",
        "counters": "measured by rapl package-0+dram counter and nvml GPU 0 NVIDIA H200 counter",
        "none": f"unknown: {NO_SOURCE}",
    }
    # The mod's record (client/flower.py) carries them as text: the server keeps them.
    record = {"energy_provenance": lines["push"], "device_energy_provenance": lines["none"]}
    assert client_figures(record) == (record, [])
    # ... and `edgewatt report` of the round file says it under the table.
    rounds = [{"round": 1, "kind": "train", "node_id": n, **record} for n in (1, 2)]
    assert rounds_table(rounds, "t").splitlines()[-1] == f"  energy: {lines['push']}"
