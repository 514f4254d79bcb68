"""The device's context (core/platforms/board.py, core/platforms/context.py): each fact read on
its fixture (tests/fixtures/context/, sources in its README), absent facts as None,
a change during a run as an event with its time."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli import device, report
from edgewatt.core.platforms import board, context
from edgewatt.core.platforms.board import Clock, PowerMode, Roots, Zone
from tests.conftest import wait_for

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "context"
BIN = HERE / "bin"


def stand_ins(folder: Path, *names: str) -> str:
    """A PATH holding only these stand-ins of tests/bin."""
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).symlink_to(BIN / name)
    return str(folder)


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def tx2_tree(root: Path) -> Path:
    """A TX2's cpufreq, GPU devfreq and thermal zones (values: the fixtures' README)."""
    files: dict[str, str | bytes] = {}
    current = {0: 2035200, 1: 1113600, 2: 1113600, 3: 1881600, 4: 2035200, 5: 2035200}
    for cpu, cur in current.items():
        base = f"devices/system/cpu/cpu{cpu}"
        files[f"{base}/online"] = "0\n" if cpu in (1, 2) else "1\n"
        files[f"{base}/cpufreq/scaling_cur_freq"] = f"{cur}\n"
        files[f"{base}/cpufreq/scaling_min_freq"] = "345600\n"
        files[f"{base}/cpufreq/scaling_max_freq"] = "2035200\n"
    gpu = "class/devfreq/17000000.gp10b"
    files.update({f"{gpu}/cur_freq": "114750000\n", f"{gpu}/min_freq": "114750000\n"})
    files[f"{gpu}/max_freq"] = "1134750000\n"
    zones = [
        ("BCPU-therm", 37500),
        ("MCPU-therm", 37500),
        ("GPU-therm", 35000),
        ("PLL-therm", 37500),
        ("Tboard_tegra", 32000),
        ("Tdiode_tegra", 34250),
        ("PMIC-Die", 100000),
        ("thermal-fan-est", 36500),
    ]
    for number, (kind, milli) in enumerate(zones):
        files[f"class/thermal/thermal_zone{number}/type"] = f"{kind}\n"
        files[f"class/thermal/thermal_zone{number}/temp"] = f"{milli}\n"
    return write(root, files)


def thor_tree(root: Path) -> Path:
    """Thor after jetson_clocks, with one OC3 event since boot (forum thread 361188)."""
    files: dict[str, str | bytes] = {}
    for cpu in range(14):
        base = f"devices/system/cpu/cpu{cpu}/cpufreq"
        for kind in ("cur", "min", "max"):
            files[f"{base}/scaling_{kind}_freq"] = "2601000\n"
    counts = {"oc1": (0, 0), "oc2": (0, 1), "oc3": (1, 1)}
    for alarm, (events, enabled) in counts.items():
        files[f"class/hwmon/hwmon3/{alarm}_event_cnt"] = f"{events}\n"
        files[f"class/hwmon/hwmon3/{alarm}_throt_en"] = f"{enabled}\n"
    files["class/hwmon/hwmon3/name"] = "soctherm_oc\n"
    return write(root, files)


@pytest.mark.parametrize(
    ("capture", "mode"),
    [
        ("nvpmodel-maxn", PowerMode("MAXN", 0)),
        ("nvpmodel-tx2-warn", PowerMode("MAXP_CORE_ARM", 3)),
        ("nvpmodel-15w", PowerMode("15W", 1)),
    ],
)
def test_power_mode_from_nvpmodel(
    capture: str, mode: PowerMode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert board.parse_power_mode((FIXTURES / f"{capture}.txt").read_text()) == mode
    monkeypatch.setenv("FAKE_NVPMODEL_CAPTURE", capture)
    log = tmp_path / "calls"
    monkeypatch.setenv("FAKE_NVPMODEL_LOG", str(log))
    roots = Roots(path=stand_ins(tmp_path / "bin", "nvpmodel"))
    assert board.power_mode(roots) == mode
    assert log.read_text() == "-q\n"


def test_power_mode_absent_or_failing(tmp_path: Path) -> None:
    assert board.power_mode(Roots(path=str(tmp_path))) is None  # not on PATH
    failing = tmp_path / "fails"
    failing.mkdir()
    (failing / "nvpmodel").write_text("#!/bin/sh\necho 'NV Power Mode: MAXN'\nexit 1\n")
    (failing / "nvpmodel").chmod(0o755)
    assert board.power_mode(Roots(path=str(failing))) is None
    assert board.parse_power_mode("NVPM ERROR: no such file\n") is None
    assert board.parse_power_mode("NV Power Mode: MAXN\n") == PowerMode("MAXN", None)


def test_release_and_model(tmp_path: Path) -> None:
    etc = write(
        tmp_path / "etc", {"nv_tegra_release": (FIXTURES / "nv_tegra_release-r36.txt").read_text()}
    )
    sysfs = write(
        tmp_path / "sys",
        {"firmware/devicetree/base/model": b"NVIDIA Jetson AGX Orin Developer Kit\0"},
    )
    roots = Roots(sysfs=str(sysfs), proc=str(tmp_path / "proc"), etc=str(etc))
    assert board.l4t_release(roots) == "36.4.4"
    assert board.board_model(roots) == "NVIDIA Jetson AGX Orin Developer Kit"
    # /proc's link is read first where it is there
    write(tmp_path / "proc", {"device-tree/model": b"Raspberry Pi 5 Model B Rev 1.0\0"})
    assert board.board_model(roots) == "Raspberry Pi 5 Model B Rev 1.0"
    (etc / "nv_tegra_release").write_text("not a release line\n")
    assert board.l4t_release(roots) is None


def test_tx2_clocks_and_zones(tmp_path: Path) -> None:
    roots = Roots(sysfs=str(tx2_tree(tmp_path)))
    low, high = 345_600_000, 2_035_200_000
    assert board.cpu_clocks(roots) == (  # cpu1 and cpu2 are offline
        Clock("cpu0", 2_035_200_000, low, high),
        Clock("cpu3", 1_881_600_000, low, high),
        Clock("cpu4", 2_035_200_000, low, high),
        Clock("cpu5", 2_035_200_000, low, high),
    )
    gpu = Clock("17000000.gp10b", 114_750_000, 114_750_000, 1_134_750_000)
    assert board.devfreq_clocks(roots) == (gpu,)
    assert board.clocks_pinned((*board.cpu_clocks(roots), gpu)) is False  # type: ignore[misc]
    zones = board.thermal_zones(roots)
    assert zones is not None and len(zones) == 7  # PMIC-Die's constant 100 C left out
    assert board.hottest(zones) == Zone("BCPU-therm", 37.5)
    assert board.overcurrent_events(roots) is None


def test_thor_pinned_with_an_overcurrent_event(tmp_path: Path) -> None:
    roots = Roots(sysfs=str(thor_tree(tmp_path)))
    assert board.overcurrent_events(roots) == {"oc1": 0, "oc2": 0, "oc3": 1}
    clocks = board.cpu_clocks(roots)
    assert clocks is not None and len(clocks) == 14
    assert clocks[13] == Clock("cpu13", 2_601_000_000, 2_601_000_000, 2_601_000_000)
    assert board.clocks_pinned(clocks) is True
    assert board.clocks_pinned(()) is None


@pytest.mark.parametrize(
    ("capture", "value", "flags"),
    [
        ("get_throttled-50000", 0x50000, ("under-voltage-occurred", "throttling-occurred")),
        ("get_throttled-0", 0, ()),
    ],
)
def test_pi_throttled(
    capture: str,
    value: int,
    flags: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VCGENCMD_THROTTLED", capture)
    roots = Roots(path=stand_ins(tmp_path / "bin", "vcgencmd"))
    assert board.pi_throttled(roots) == value
    assert board.throttled_flags(value) == flags
    assert board.parse_throttled('error=1 error_msg="Command not registered"') is None


def test_every_fact_absent_is_none(tmp_path: Path) -> None:
    """An empty tree and no tools: every fact None, no exception; so are files that
    cannot be read (a directory where a file is expected)."""
    roots = Roots(sysfs=str(tmp_path), proc=str(tmp_path), etc=str(tmp_path), path=str(tmp_path))
    found = context.read(roots)
    assert found.absent() == [
        "model",
        "l4t_release",
        "power_mode",
        "clocks_pinned",
        "cpu_clocks",
        "devfreq_clocks",
        "overcurrent_events",
        "hottest_zone",
        "pi_throttled",
    ]
    for broken in (
        "nv_tegra_release/x",
        "device-tree/model/x",
        "class/hwmon/hwmon0/oc1_event_cnt/x",
        "class/thermal/thermal_zone0/temp/x",
        "devices/system/cpu/cpu0/cpufreq/scaling_max_freq/x",
    ):
        write(tmp_path, {broken: "1"})
    found = context.read(roots)
    assert found.model is None and found.l4t_release is None
    assert found.overcurrent_events is None and found.hottest_zone is None
    assert found.cpu_clocks == (Clock("cpu0", None, None, None),)
    assert found.clocks_pinned is None


def test_a_mode_change_is_an_event_with_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mode = tmp_path / "mode"
    mode.write_text("nvpmodel-maxn")
    monkeypatch.setenv("FAKE_NVPMODEL_FILE", str(mode))
    sysfs = thor_tree(tmp_path / "sys")
    roots = Roots(sysfs=str(sysfs), path=stand_ins(tmp_path / "bin", "nvpmodel"))
    temp = write(sysfs, {"class/thermal/thermal_zone0/temp": "70000\n"}) / (
        "class/thermal/thermal_zone0/temp"
    )
    times = itertools.count(1000.0, 10.0)
    log = context.ContextLog(lambda: context.read(roots, lambda: next(times)), interval_s=10)
    assert log.during(0.0, None) is None  # nothing read yet
    log.poll()  # 1000: MAXN, 70 C
    temp.write_text("40000\n")
    log.poll()  # 1010: unchanged settings, no event (a temperature is none)
    mode.write_text("nvpmodel-15w")
    temp.write_text("55000\n")
    log.poll()  # 1020: 15W, 55 C
    run = log.during(1005.0, None)
    assert run is not None
    assert run["start"]["power_mode"] == {"name": "MAXN", "id": 0}
    assert run["end"]["power_mode"] == {"name": "15W", "id": 1}
    assert run["events"] == [
        {
            "time": 1020.0,
            "what": "power_mode",
            "before": {"name": "MAXN", "id": 0},
            "after": {"name": "15W", "id": 1},
        }
    ]
    assert run["start"]["overcurrent_events"] == {"oc1": 0, "oc2": 0, "oc3": 1}
    assert run["highest_temperature_c"] == 55.0  # the reads after its start
    # A run that ended before the change saw none
    ended = log.during(1000.0, 1015.0)
    assert ended is not None and ended["events"] == []
    assert ended["end"]["power_mode"] == {"name": "MAXN", "id": 0}
    assert ended["highest_temperature_c"] == 70.0
    assert log.cost_s is not None and log.cost_s >= 0


def jetson_setup(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The daemon's environment on an AGX Orin-like tree (Thor's clocks and counters,
    L4T 36.4.4, the devkit's model) with the nvpmodel stand-in on its PATH; and the
    file whose content names the mode nvpmodel answers."""
    sysfs = thor_tree(tmp_path / "sys")
    write(sysfs, {"firmware/devicetree/base/model": b"NVIDIA Jetson AGX Orin Developer Kit\0"})
    etc = write(
        tmp_path / "etc", {"nv_tegra_release": (FIXTURES / "nv_tegra_release-r36.txt").read_text()}
    )
    mode = tmp_path / "mode"
    mode.write_text("nvpmodel-maxn")
    env = {
        "EDGEWATT_SYSFS_PATH": str(sysfs),
        "EDGEWATT_ETC_PATH": str(etc),
        "EDGEWATT_CONTEXT_INTERVAL": "1",
        "PATH": f"{stand_ins(tmp_path / 'bin', 'nvpmodel')}:{os.environ['PATH']}",
        "FAKE_NVPMODEL_FILE": str(mode),
    }
    return env, mode


def test_the_daemon_exports_the_context_and_dates_a_mode_change(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    env, mode = jetson_setup(tmp_path)
    daemon = daemon_factory(env=env)
    ((labels, value),) = daemon.series("edgewatt_device_info")
    assert value == 1
    assert {k: v for k, v in labels.items() if k != "host_name"} == {
        "model": "NVIDIA Jetson AGX Orin Developer Kit",
        "l4t_release": "36.4.4",
        "power_mode": "MAXN",
        "power_mode_id": "0",
        "clocks_pinned": "true",
    }
    child = spawn("import time; time.sleep(60)")
    target = daemon.register(child.pid)
    before = time.time()
    mode.write_text("nvpmodel-15w")
    wait_for(lambda: daemon.series("edgewatt_device_info", power_mode="15W"), timeout=30)
    host = daemon.call("GET", "/v1/host")[1]
    assert host["context"]["power_mode"] == {"name": "15W", "id": 1}
    status, summary = daemon.call("GET", f"/v1/targets/{target['id']}/summary")
    assert status == 200
    run = summary["context"]
    assert run["start"]["power_mode"] == {"name": "MAXN", "id": 0}
    assert run["end"]["power_mode"] == {"name": "15W", "id": 1}
    assert run["start"]["l4t_release"] == "36.4.4"
    assert run["start"]["overcurrent_events"] == {"oc1": 0, "oc2": 0, "oc3": 1}
    (event,) = run["events"]
    assert event["what"] == "power_mode"
    assert (event["before"], event["after"]) == (
        {"name": "MAXN", "id": 0},
        {"name": "15W", "id": 1},
    )
    assert before <= event["time"] <= time.time()
    # edgewatt top shows the setting now, the new mode's.
    top = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "top", "--once", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert top.returncode == 0, top.stderr
    shown = top.stdout[top.stdout.index("device: ") :]
    for part in ("NVIDIA Jetson AGX Orin Developer Kit", "power mode 15W (1)", "L4T 36.4.4",
                 "clocks pinned"):  # fmt: skip
        assert part in shown, top.stdout


def test_doctor_says_what_was_found_and_names_what_is_absent(tmp_path: Path) -> None:
    env, _ = jetson_setup(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "doctor", "--socket", str(tmp_path / "none.sock")],
        capture_output=True, text=True, cwd=HERE.parent, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    (line,) = [line for line in result.stdout.splitlines() if "device context" in line]
    assert line == (
        "ok    device context: model NVIDIA Jetson AGX Orin Developer Kit; L4T 36.4.4; "
        "power mode MAXN (0); clocks pinned; 14 CPU clocks; over-current events 1; "
        "absent: devfreq, thermal zones, vcgencmd get_throttled"
    )


def test_the_run_output_report_and_plot_title_hold_the_context(
    daemon_factory: Any, tmp_path: Path
) -> None:
    env, _ = jetson_setup(tmp_path)
    daemon = daemon_factory(env=env)
    out = tmp_path / "run.jsonl"
    command = [sys.executable, "-m", "edgewatt.cli"]
    result = subprocess.run(
        [*command, "run", "--socket", daemon.socket, "--interval", "0.2", "--output", str(out),
         "--", sys.executable, "-c", "import time; time.sleep(1)"],
        capture_output=True, text=True, cwd=HERE.parent, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    header, samples, phases, summary = report.load(str(out))
    assert summary is not None
    assert summary["context"]["start"]["power_mode"] == {"name": "MAXN", "id": 0}
    assert summary["context"]["events"] == []
    device = "NVIDIA Jetson AGX Orin Developer Kit, power mode MAXN (0), L4T 36.4.4, clocks pinned"
    shown = subprocess.run(
        [*command, "report", str(out)], capture_output=True, text=True, cwd=HERE.parent, timeout=60
    )
    for table in (shown.stdout, result.stderr):  # report's, and the one edgewatt run prints
        (row,) = [line for line in table.splitlines() if line.startswith("  device ")]
        assert row.split(None, 1)[1] == device
    assert report.layout(header, samples, phases, summary).title.splitlines()[-1] == device


def test_the_report_names_the_changes() -> None:
    context = {
        "start": {"power_mode": {"name": "MAXN", "id": 0}, "clocks_pinned": False},
        "events": [{"time": 1.0, "what": "power_mode"}, {"time": 2.0, "what": "clock_limits"}],
    }
    assert device.context_line(context) == (
        "power mode MAXN (0), clocks not pinned, 2 change(s) during the run: clock_limits, "
        "power_mode"
    )
    assert device.context_line(None) is None
    assert device.context_line({"start": {}}) is None


def test_throttling_and_clock_limits_are_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An over-current event, a capped CPU (its limits moved, so the clocks are no
    longer pinned) and a Pi's throttled bits: each an event; the current rate, which
    moves all the time, none."""
    sysfs = thor_tree(tmp_path / "sys")
    roots = Roots(sysfs=str(sysfs), path=stand_ins(tmp_path / "bin", "vcgencmd"))
    monkeypatch.setenv("FAKE_VCGENCMD_THROTTLED", "get_throttled-0")
    times = itertools.count(2000.0, 10.0)
    log = context.ContextLog(lambda: context.read(roots, lambda: next(times)), interval_s=10)
    log.poll()
    cpu3 = sysfs / "devices/system/cpu/cpu3/cpufreq"
    (cpu3 / "scaling_cur_freq").write_text("972000\n")
    assert log.poll().cpu_clocks[3].cur_hz == 972_000_000  # type: ignore[index]
    (sysfs / "class/hwmon/hwmon3/oc1_event_cnt").write_text("4\n")
    (cpu3 / "scaling_min_freq").write_text("729600\n")  # the kernel keeps min <= max
    (cpu3 / "scaling_max_freq").write_text("1350000\n")
    monkeypatch.setenv("FAKE_VCGENCMD_THROTTLED", "get_throttled-50000")
    log.poll()
    run = log.during(2000.0, None)
    assert run is not None
    assert run["start"]["pi_throttled"] == {"value": "0x0", "flags": []}
    assert run["end"]["pi_throttled"] == {
        "value": "0x50000",
        "flags": ["under-voltage-occurred", "throttling-occurred"],
    }
    assert run["events"] == [
        {"time": 2020.0, "what": "clocks_pinned", "before": True, "after": False},
        {
            "time": 2020.0,
            "what": "clock_limits",
            "before": {"cpu3": [2_601_000_000, 2_601_000_000]},
            "after": {"cpu3": [729_600_000, 1_350_000_000]},
        },
        {
            "time": 2020.0,
            "what": "overcurrent_events",
            "before": {"oc1": 0, "oc2": 0, "oc3": 1},
            "after": {"oc1": 4, "oc2": 0, "oc3": 1},
        },
        {"time": 2020.0, "what": "pi_throttled", "before": "0x0", "after": "0x50000"},
    ]
