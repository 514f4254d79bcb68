"""A power source that loads but cannot measure steps aside: NVML on a Jetson answers
"Not Supported" for power (a stand-in of nvidia-ml-py's pynvml, tests/nvml_tegra), so
discovery logs it once, doctor names it, and the next source measures."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import power
from edgewatt.core.power import nvml
from edgewatt.core.power.source import CannotMeasure, PowerOptions
from tests.conftest import ROOT, wait_for

STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
NVML_TEGRA = str(ROOT / "tests" / "nvml_tegra")
REASON = "NVML answers 'Not Supported' for the power and energy of Orin (nvgpu)"


@pytest.fixture
def tegra_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(NVML_TEGRA)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    yield
    sys.modules.pop("pynvml", None)  # the stand-in, imported: never another test's pynvml


def test_nvml_answering_not_supported_is_no_source(tegra_nvml: None, tmp_path: Path) -> None:
    with pytest.raises(CannotMeasure, match=re.escape(REASON)):
        nvml.discover(PowerOptions(sysfs_path=str(tmp_path)))


def test_the_next_source_is_used_and_one_line_says_why(
    tegra_nvml: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    aside: dict[str, str] = {}
    options = PowerOptions(
        sources=("nvml", "tegrastats"), sysfs_path=str(tmp_path), tegrastats_path=STAND_IN
    )
    with caplog.at_level(logging.INFO, logger="edgewatt.core.power"):
        found = power.discover(options, aside)
    try:
        assert [s.name for s in found] == ["tegrastats"]
    finally:
        for source in found:
            source.close()
    assert aside == {"nvml": REASON}
    lines = [r for r in caplog.records if "nvml" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in lines] == [
        ("WARNING", f"power source nvml: loads but cannot measure, stepping aside: {REASON}")
    ]


def test_the_daemon_measures_with_the_next_and_doctor_says_nvml_stepped_aside(
    daemon_factory: Any, tmp_path: Path
) -> None:
    path = os.pathsep.join(p for p in (NVML_TEGRA, os.environ.get("PYTHONPATH")) if p)
    daemon = daemon_factory(
        extra_args=["--tegrastats", STAND_IN],
        env={
            "PYTHONPATH": path,
            "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
            "EDGEWATT_POWER_SOURCES": "nvml,tegrastats",
        },
    )
    health = wait_for(lambda: (h := daemon.call("GET", "/healthz")[1])["power_sources"] and h)
    assert health["power_sources"] == ["tegrastats"]
    assert health["power_sources_aside"] == {"nvml": REASON}
    assert daemon.value("hw_host_power_watts", hw_id="host") == 16.802  # the VIN rail's
    assert daemon.log().count("power source nvml: loads but cannot measure") == 1
    doctor = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", daemon.socket],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert (
        f"ok    power sources (the daemon's): tegrastats; nvml steps aside: {REASON}"
        in doctor.stdout.splitlines()
    )


def test_doctor_without_a_daemon_says_nvml_steps_aside(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (NVML_TEGRA, os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
        "EDGEWATT_POWER_SOURCES": "nvml,tegrastats",
        "EDGEWATT_TEGRASTATS": STAND_IN,
    }
    doctor = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", str(tmp_path / "none")],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=env,
    )  # fmt: skip
    assert (
        "ok    power sources (none running; as this user): tegrastats; device total from "
        f"tegrastats; nvml steps aside: {REASON}" in doctor.stdout.splitlines()
    ), doctor.stdout
