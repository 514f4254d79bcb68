"""Raspberry Pi 5: the real captures of `vcgencmd pmic_read_adc` parsed to figures
written out by hand from them, malformed output refused by line, the stand-in
vcgencmd read by the source and by the real daemon, and doctor's video-group line."""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.power import pi5
from edgewatt.core.power.rate import auto_rate
from edgewatt.core.power.source import AUTO_BUDGET, NoData, PowerOptions
from tests.conftest import ROOT, DaemonProcess, wait_for

FIXTURES = ROOT / "tests" / "fixtures" / "pi5"
STAND_IN = ROOT / "tests" / "bin" / "vcgencmd"

# (current A, voltage V) per rail, copied from each capture by hand, in printed order.
CAPTURES: dict[str, dict[str, tuple[float, float]]] = {
    "zeus-load": {
        "3V7_WL_SW": (0.09368929, 3.69977600),
        "3V3_SYS": (0.08783370, 3.31003300),
        "1V8_SYS": (0.18054710, 1.80512600),
        "DDR_VDD2": (0.22543980, 1.10476100),
        "DDR_VDDQ": (0.06666720, 0.60146460),
        "1V1_SYS": (0.17566740, 1.11025500),
        "0V8_SW": (0.37670900, 0.80146440),
        "VDD_CORE": (6.22421000, 0.86173300),
        "3V3_DAC": (0.00006105, 3.31318300),
        "3V3_ADC": (0.00036630, 3.30677300),
        "0V8_AON": (0.00305250, 0.80029220),
        "HDMI": (0.02417580, 5.08664000),
    },
    "pilomar": {
        "3V7_WL_SW": (0.05855580, 3.61069200),
        "3V3_SYS": (0.06148359, 3.29982600),
        "1V8_SYS": (0.13272650, 1.81684800),
        "DDR_VDD2": (0.13955800, 1.10109800),
        "DDR_VDDQ": (0.00980400, 0.60366240),
        "1V1_SYS": (0.19811380, 1.10292900),
        "0V8_SW": (0.34157550, 0.80292960),
        "VDD_CORE": (5.03652000, 0.89369880),
        "3V3_DAC": (0.00006105, 3.29944700),
        "3V3_ADC": (0.00054945, 3.30402600),
        "0V8_AON": (0.00531135, 0.79618980),
        "HDMI": (0.02161170, 4.92450000),
    },
}
# The voltage-only channels: the 5 V input and the RTC battery.
VOLTS_ONLY = {"zeus-load": (5.09066000, 0.0), "pilomar": (4.92450000, 0.00341880)}
BOARD_W = {"zeus-load": 7.2398, "pilomar": 5.9216}  # the sums, to 0.1 mW


def capture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_each_capture_parses_to_its_rails_and_their_sum(name: str) -> None:
    sample = pi5.parse_output(capture(name))
    rails = CAPTURES[name]
    assert sample.amps == {rail: a for rail, (a, _) in rails.items()}
    ext5v, batt = VOLTS_ONLY[name]
    assert sample.volts == {
        **{rail: v for rail, (_, v) in rails.items()},
        "EXT5V": ext5v,
        "BATT": batt,
    }
    # V x I per rail paired by name (a rail's two channel numbers differ), summed.
    assert sample.rails_w == {rail: a * v for rail, (a, v) in rails.items()}
    assert sample.total_w == math.fsum(a * v for a, v in rails.values())
    assert round(sample.total_w, 4) == BOARD_W[name]


ZEUS = capture("zeus-load")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            ZEUS.replace("=0.86173300V", "=0.86"),
            "line 20: not a pmic_read_adc line: 'VDD_CORE_V volt(15)=0.86'",
        ),
        (
            ZEUS.replace("current(7)=6.22421000A", "current(7)=6.22421000V"),
            "line 8: VDD_CORE_A with a current in V",
        ),
        (
            ZEUS.replace("VDD_CORE_V volt(15)", "VDD_CORE_V current(15)"),
            "line 20: VDD_CORE_V with a current in V",
        ),
        (ZEUS.replace("=6.22421000A", "=-6.22421000A"), "line 8: not a pmic_read_adc line"),
        (ZEUS.replace("=6.22421000A", "=622.421000A"), "line 8: VDD_CORE 622.421 A is over 100 A"),
        (ZEUS.replace("=5.09066000V", "=509.066000V"), "line 25: EXT5V 509.066 V is over 60 V"),
        (ZEUS.replace("=6.22421000A", "=" + "9" * 5000 + "A"), "line 8: over 128 characters"),
        (ZEUS + "  VDD_CORE_A current(7)=1.00000000A\n", "line 27: VDD_CORE_A printed twice"),
        (
            ZEUS.replace("  VDD_CORE_V volt(15)=0.86173300V\n", ""),
            "a current without its voltage: VDD_CORE",
        ),
        (
            'error=2 error_msg="Invalid arguments"\n',
            "line 1: not a pmic_read_adc line: 'error=2 error_msg=\"Invalid arguments\"'",
        ),
        ("     EXT5V_V volt(24)=5.09066000V\n", "no rail with a current"),
        ("", "no rail with a current"),
        (
            "".join(f"R{i}_A current(0)=0.1A\nR{i}_V volt(1)=1.0V\n" for i in range(65)),
            "over 64 rails",
        ),
    ],
)
def test_malformed_output_is_refused_naming_the_line(text: str, error: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        pi5.parse_output(text)


def test_the_board_model_is_read_from_the_device_tree(tmp_path: Path) -> None:
    model = tmp_path / "firmware" / "devicetree" / "base" / "model"
    model.parent.mkdir(parents=True)
    for text, found in [
        (b"Raspberry Pi 5 Model B Rev 1.0\0", "Raspberry Pi 5 Model B Rev 1.0"),
        (b"Raspberry Pi Compute Module 5 Rev 1.0\0", "Raspberry Pi Compute Module 5 Rev 1.0"),
        (b"Raspberry Pi 500 Rev 1.0\0", "Raspberry Pi 500 Rev 1.0"),
        (b"Raspberry Pi 4 Model B Rev 1.4\0", None),
        (b"NVIDIA Jetson AGX Thor Developer Kit\0", None),
    ]:
        model.write_bytes(text)
        assert pi5.board_model(str(tmp_path)) == found
    assert pi5.board_model(str(tmp_path / "absent")) is None


def test_the_rate_is_the_highest_its_measured_cost_allows() -> None:
    # 0.5 % of one core: a 1 ms spawn (/bin/cat here, benchmarks/pi5_spawn.py) allows
    # 2 Hz, 0.4 ms 10 Hz, the parse alone (the mailbox's share) 20 Hz; the Python
    # stand-in's ~100 ms is over the budget at any rate: one a second.
    rates = {
        cost: auto_rate(cost, AUTO_BUDGET, pi5.RATES_HZ) for cost in (1.02e-3, 4e-4, 2.4e-5, 0.1)
    }
    assert rates == {1.02e-3: 2.0, 4e-4: 10.0, 2.4e-5: 20.0, 0.1: 1.0}


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose only vcgencmd is the stand-in."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "vcgencmd").symlink_to(STAND_IN)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def test_the_source_runs_vcgencmd_once_per_reading(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_VCGENCMD_LOG", str(calls))
    monkeypatch.setenv("FAKE_VCGENCMD_CAPTURE", "pilomar")
    source = pi5.discover(PowerOptions(sample_hz=5.0))  # a configured rate is kept
    try:
        assert source.board and source.pushed and source.period_s == 0.2
        got: list[Any] = []  # each take hands over what arrived since the last
        wait_for(lambda: got.extend(source.arrived()) or len(got) >= 2, timeout=30)
        reading = source.read()
        assert reading is not None and reading.source == "pi5"
        assert reading.total_w == pytest.approx(BOARD_W["pilomar"], abs=1e-4)
        rails = {rail.id: (rail.name, rail.type, rail.power_w) for rail in reading.rails}
        a, v = CAPTURES["pilomar"]["DDR_VDD2"]
        assert rails["pi5:DDR_VDD2"] == ("DDR_VDD2", "memory", a * v)
        assert len(rails) == 12 and "pi5:EXT5V" not in rails
    finally:
        source.close()
    runs = calls.read_text().splitlines()
    assert set(runs) == {"pmic_read_adc"} and len(runs) >= 3  # discovery's, then each reading's
    assert source.child_pid() is None  # every child reaped by its thread


@pytest.mark.parametrize(
    ("hook", "reason"),
    [
        (
            {"FAKE_VCGENCMD_FAIL": "VCHI initialization failed"},
            "exited with status 255: 'VCHI initialization failed'",
        ),
        ({"FAKE_VCGENCMD_MALFORMED": "1"}, "line 20: not a pmic_read_adc line"),
    ],
)
def test_a_vcgencmd_that_gives_no_rails_is_no_source(
    on_path: Path, monkeypatch: pytest.MonkeyPatch, hook: dict[str, str], reason: str
) -> None:
    for key, value in hook.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(
        NoData, match="vcgencmd pmic_read_adc gives no PMIC rails: .*" + re.escape(reason)
    ):
        pi5.discover(PowerOptions())


def test_a_run_that_fails_is_logged_once_and_retried_until_it_reads_again(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger=pi5.__name__)
    core_amps = tmp_path / "core-amps"
    core_amps.write_text("6.22421")
    monkeypatch.setenv("FAKE_VCGENCMD_CORE_A_FILE", str(core_amps))
    source = pi5.discover(PowerOptions(sample_hz=5.0))
    reader = source._reader
    try:
        core_amps.write_text("broken")  # the stand-in then fails: a traceback, status 1
        wait_for(lambda: reader.failures >= 2, timeout=30)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "pmic_read_adc exited with status 1" in warnings[0]
        core_amps.write_text("1.0")
        core_v = CAPTURES["zeus-load"]["VDD_CORE"][1]
        source.arrived()
        wait_for(
            lambda: any(
                rail.id == "pi5:VDD_CORE" and rail.power_w == pytest.approx(core_v)
                for reading in source.arrived()
                for rail in reading.rails
            ),
            timeout=60,
        )
        assert reader.failures == 0
        assert any("is back after" in r.getMessage() for r in caplog.records)
    finally:
        source.close()


def test_a_run_is_bounded_in_output_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def executable(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return str(path)

    with pytest.raises(ValueError, match=r"^output over 8192 bytes$"):
        pi5.read_once(executable("loud", "exec yes"))  # killed at the bound, reaped
    monkeypatch.setattr(pi5, "TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^no output end within 0\.5 s$"):
        pi5.read_once(executable("hung", "exec sleep 60"))
    assert time.monotonic() - started < 30  # killed, not waited for


def test_no_vcgencmd_on_path_is_no_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NoData, match="no vcgencmd on PATH"):
        pi5.discover(PowerOptions())


@pytest.fixture
def board(daemon_factory: Any, tmp_path: Path) -> tuple[DaemonProcess, Path]:
    """The real daemon, sources discovered as on a Pi 5: the stand-in on its PATH, an
    empty sysfs (no RAPL of this machine's)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "vcgencmd").symlink_to(STAND_IN)
    core_amps = tmp_path / "core-amps"
    core_amps.write_text(str(CAPTURES["zeus-load"]["VDD_CORE"][0]))
    (tmp_path / "sys").mkdir()
    daemon = daemon_factory(
        interval=0.25,
        env={
            "PATH": f"{folder}:{os.environ['PATH']}",
            "EDGEWATT_SYSFS_PATH": str(tmp_path / "sys"),
            "FAKE_VCGENCMD_CORE_A_FILE": str(core_amps),
        },
    )
    return daemon, core_amps


def test_the_daemon_exports_each_rail_and_the_boards_power_and_energy(
    board: tuple[DaemonProcess, Path], spawn: Any
) -> None:
    daemon, core_amps = board
    assert daemon.call("GET", "/healthz")[1]["power_sources"] == ["pi5"]
    sleeper = spawn("import time; time.sleep(120)")
    tid = daemon.register(sleeper.pid)["id"]
    wait_for(lambda: daemon.value("hw_energy_joules_total", hw_id="pi5:VDD_CORE"), timeout=30)
    rails = {lbl["hw_id"]: (lbl["hw_name"], v) for lbl, v in daemon.series("hw_power_watts")}
    expected = CAPTURES["zeus-load"]
    assert rails.keys() == {f"pi5:{name}" for name in expected}
    for name, (a, v) in expected.items():
        assert rails[f"pi5:{name}"] == (name, pytest.approx(a * v, abs=1e-12))
    assert daemon.value("hw_host_power_watts", hw_id="host") == pytest.approx(
        BOARD_W["zeus-load"], abs=1e-4
    )
    energies = {lbl["hw_id"]: v for lbl, v in daemon.series("hw_energy_joules_total")}
    assert energies.keys() == rails.keys() and energies["pi5:VDD_CORE"] > 0

    # The device's energy grows at the board's power: the counter at two passes over
    # the time between them (the target's samples carry both).
    first = wait_for(lambda: daemon.call("GET", f"/v1/targets/{tid}")[1]["latest"], timeout=30)
    wait_for(
        lambda: daemon.call("GET", f"/v1/targets/{tid}")[1]["latest"]["time"] > first["time"] + 2,
        timeout=60,
    )
    last = daemon.call("GET", f"/v1/targets/{tid}")[1]["latest"]
    rate = (last["device_energy_j"] - first["device_energy_j"]) / (last["time"] - first["time"])
    assert rate == pytest.approx(BOARD_W["zeus-load"], rel=0.05)

    # The board's power follows the PMIC: VDD_CORE at 1 A instead of 6.2 A.
    core_amps.write_text("1.0")
    core_v = expected["VDD_CORE"][1]
    lower = BOARD_W["zeus-load"] - (expected["VDD_CORE"][0] - 1.0) * core_v
    wait_for(
        lambda: daemon.value("hw_power_watts", hw_id="pi5:VDD_CORE") == pytest.approx(core_v),
        timeout=30,
    )
    assert daemon.value("hw_host_power_watts", hw_id="host") == pytest.approx(lower, abs=1e-4)


def doctor(*args: str, env: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    return [line for line in result.stdout.splitlines() if "power" in line or "PMIC" in line]


def pi5_sysfs(tmp_path: Path, model: bytes = b"Raspberry Pi 5 Model B Rev 1.0\0") -> str:
    path = tmp_path / "sys" / "firmware" / "devicetree" / "base" / "model"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model)
    return str(tmp_path / "sys")


FIX = (
    "/dev/vcio is root:video 0660: add the daemon's user to the video group (sudo usermod "
    "-aG video USER; in a systemd unit, SupplementaryGroups=video and the device allowed)"
)


def test_doctor_names_the_video_group_on_a_pi5_without_the_mailbox(tmp_path: Path) -> None:
    # No daemon: this user's view. /dev/vcio is absent on this machine (not a Pi).
    assert not os.path.exists(pi5.VCIO)
    env = {"EDGEWATT_SYSFS_PATH": pi5_sysfs(tmp_path), "PATH": "/usr/bin:/bin"}
    lines = doctor("--socket", str(tmp_path / "none.sock"), env=env)
    assert lines == [
        "warn  this Raspberry Pi 5 Model B Rev 1.0's PMIC cannot be read as this user: there is "
        "no /dev/vcio (in a container, pass the device: --device /dev/vcio); " + FIX
    ]
    # Not a Pi 5: no such line.
    env["EDGEWATT_SYSFS_PATH"] = pi5_sysfs(tmp_path, b"Raspberry Pi 4 Model B Rev 1.4\0")
    (line,) = doctor("--socket", str(tmp_path / "none.sock"), env=env)
    assert "video" not in line


def test_doctor_names_the_video_group_when_the_daemon_reads_no_pmic(
    daemon_factory: Any, tmp_path: Path
) -> None:
    sysfs = pi5_sysfs(tmp_path)
    daemon = daemon_factory(env={"EDGEWATT_SYSFS_PATH": sysfs, "PATH": "/usr/bin:/bin"})
    lines = doctor("--socket", daemon.socket, env={"EDGEWATT_SYSFS_PATH": sysfs})
    assert lines[1:] == [
        "warn  the daemon does not read this Raspberry Pi 5 Model B Rev 1.0's PMIC (it runs "
        "vcgencmd pmic_read_adc from its PATH, which opens /dev/vcio): " + FIX
    ]
