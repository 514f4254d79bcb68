"""`edgewatt run --emissions FILE`: codecarbon's emissions.csv, a row appended per run,
with the device's measured energy; read back by codecarbon 3.3.2's own reader in a venv
of its own (tests/bin/fetch-codecarbon, or EDGEWATT_CODECARBON_PYTHON: its interpreter)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgewatt.cli.emissions import COLUMNS, J_PER_KWH, TASK_COLUMNS
from tests.conftest import ROOT, fetched

EDGEWATT = [sys.executable, "-m", "edgewatt.cli"]
STAND_IN = str(ROOT / "tests" / "bin" / "tegrastats")
INTENSITY = 450.0


def test_each_run_appends_a_row_of_codecarbons_columns_with_measured_energy(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
             "EDGEWATT_CARBON_INTENSITY_G_PER_KWH": str(INTENSITY)},
    )  # fmt: skip
    out = tmp_path / "emissions.csv"
    energies = []
    for n in range(2):
        result = subprocess.run(
            [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--label",
             "project=demo", "--emissions", str(out), "--", "sleep", "0.5"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"a row appended to {out}" in result.stderr
        line = next(x for x in result.stderr.splitlines() if "device energy" in x)
        energies.append(float(re.search(r"([\d.]+) J", line)[1]))  # type: ignore[index]
        assert len(out.read_text().splitlines()) == 2 + n  # appended, the header once
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    for row, joules in zip(rows, energies):
        kwh = float(row["energy_consumed"])
        assert kwh == pytest.approx(joules / J_PER_KWH, abs=0.05 / J_PER_KWH)  # table: 0.1 J
        assert float(row["emissions"]) == pytest.approx(kwh * INTENSITY / 1000, rel=1e-3)
        assert 0.5 <= float(row["duration"]) < 30
        assert row["project_name"] == "demo" and row["tracking_mode"] == "machine"
        assert row["cpu_energy"] == "" and row["country_name"] == ""  # not made up
    assert rows[0]["run_id"] != rows[1]["run_id"]


# Two phases opened by the command's own registration (it joins edgewatt run's target).
PHASES = (
    "import time\n"
    "from edgewatt import client\n"
    "reg = client.register()\n"
    "for name in ('load', 'train'):\n"
    "    with reg.phase(name):\n"
    "        time.sleep(0.6)\n"
    "reg.close()\n"
)


def _phases_run(daemon: Any, emissions: Path, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGEWATT, "run", "--socket", daemon.socket, "--interval", "0.2", "--label",
         "experiment=tune", "--emissions", str(emissions), "--output", str(output), "--",
         sys.executable, "-c", PHASES],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip


def test_each_phase_is_a_codecarbon_task_row_beside_the_runs(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """codecarbon's task rows do not fit in emissions.csv (no task_name column: its reader
    would back the file up): they go where codecarbon writes them, a file of their own
    beside it, named after the experiment and the run's run_id, one row per phase with
    the phase's measured device energy."""
    daemon = daemon_factory(
        extra_args=["--tegrastats", STAND_IN],
        env={"FAKE_TEGRASTATS_MODEL": "Jetson AGX Thor",
             "EDGEWATT_CARBON_INTENSITY_G_PER_KWH": str(INTENSITY)},
    )  # fmt: skip
    out, output = tmp_path / "emissions.csv", tmp_path / "run.jsonl"
    result = _phases_run(daemon, out, output)
    assert result.returncode == 0, result.stderr
    with out.open(newline="") as f:
        (run,) = list(csv.DictReader(f))  # the run's row alone in emissions.csv
    tasks = tmp_path / f"emissions_tune_{run['run_id']}.csv"
    assert f"  2 phases in {tasks} (codecarbon's task rows)" in result.stderr
    with tasks.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    # TaskEmissionsData's columns in its order, those empty in every row left out.
    columns = list(reader.fieldnames or [])
    assert columns == [c for c in TASK_COLUMNS if c in columns]
    assert all(any(r[c] for r in rows) for c in columns)
    assert columns[0] == "task_name" and "cpu_energy" not in columns
    records = [json.loads(line) for line in output.read_text().splitlines()]
    phases = [r for r in records if r["type"] == "phase"]
    assert [r["task_name"] for r in rows] == [p["name"] for p in phases] == ["load", "train"]
    for row, phase in zip(rows, phases):
        assert row["run_id"] == run["run_id"] and row["project_name"] == run["project_name"]
        kwh = phase["device_energy_j"] / J_PER_KWH
        assert float(row["energy_consumed"]) == pytest.approx(kwh, rel=1e-12)
        assert float(row["emissions"]) == pytest.approx(kwh * INTENSITY / 1000, rel=1e-12)
        assert float(row["duration"]) == phase["duration_s"]
        assert row["tracking_mode"] == "machine"


def test_a_file_of_other_columns_is_left_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "emissions.csv"
    out.write_text("a,b\n1,2\n")
    result = subprocess.run(
        [*EDGEWATT, "run", "--socket", str(tmp_path / "none.sock"), "--emissions", str(out),
         "--", "true"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 74, result.stderr  # EX_IOERR: the command itself succeeded
    assert "other columns than codecarbon's" in result.stderr
    assert out.read_text() == "a,b\n1,2\n"


def codecarbon_python() -> str:
    """codecarbon's interpreter: EDGEWATT_CODECARBON_PYTHON, else the venv of
    tests/bin/fetch-codecarbon (make test runs it)."""
    given = os.environ.get("EDGEWATT_CODECARBON_PYTHON")
    if given:
        return given
    return fetched(
        ROOT / ".cache" / "codecarbon", "bin/python", "codecarbon 3.3.2", "fetch-codecarbon"
    )


def test_codecarbons_own_reader_takes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "emissions.csv"
    for _ in range(2):
        subprocess.run(
            [*EDGEWATT, "run", "--socket", str(tmp_path / "none.sock"), "--emissions", str(out),
             "--", "true"],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
        )  # fmt: skip
    # codecarbon's FileOutput checks a file's header against its EmissionsData before it
    # appends (else it backs the file up); pandas reads what its dashboards read.
    code = (
        "import json, sys, dataclasses, pandas\n"
        "from codecarbon.output_methods.emissions_data import EmissionsData\n"
        "from codecarbon.output_methods.file import FileOutput\n"
        "path = sys.argv[1]\n"
        "fields = [f.name for f in dataclasses.fields(EmissionsData)]\n"
        "output = FileOutput('emissions.csv', sys.argv[2])\n"
        "frame = pandas.read_csv(path)\n"
        "print(json.dumps({'fields': fields, 'valid': output._read_headers() is not None\n"
        "    and sorted(output._read_headers()) == sorted(fields), 'rows': len(frame),\n"
        "    'duration': frame['duration'].dtype.kind}))\n"
    )
    python = codecarbon_python()
    answer = subprocess.run(
        [python, "-c", code, str(out), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(answer.stdout)
    assert tuple(found["fields"]) == COLUMNS
    assert found == {**found, "valid": True, "rows": 2, "duration": "f"}


def test_codecarbons_task_columns_are_the_tasks_file(daemon_factory: Any, tmp_path: Path) -> None:
    """The tasks file's columns are codecarbon's TaskEmissionsData fields in their order
    (those empty in every row left out, as its task_out does); pandas reads each figure
    as a number."""
    daemon = daemon_factory(extra_args=["--tegrastats", STAND_IN])
    out = tmp_path / "emissions.csv"
    result = _phases_run(daemon, out, tmp_path / "run.jsonl")
    assert result.returncode == 0, result.stderr
    (tasks,) = tmp_path.glob("emissions_tune_*.csv")
    code = (
        "import json, sys, dataclasses, pandas\n"
        "from codecarbon.output_methods.emissions_data import TaskEmissionsData\n"
        "frame = pandas.read_csv(sys.argv[1])\n"
        "print(json.dumps({'fields': [f.name for f in dataclasses.fields(TaskEmissionsData)],\n"
        "    'columns': list(frame.columns), 'rows': len(frame),\n"
        "    'kinds': [frame[c].dtype.kind for c in ('duration', 'energy_consumed')]}))\n"
    )
    answer = subprocess.run(
        [codecarbon_python(), "-c", code, str(tasks)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(answer.stdout)
    assert tuple(found["fields"]) == TASK_COLUMNS
    assert found["columns"] == [c for c in TASK_COLUMNS if c in found["columns"]]
    assert found["rows"] == 2 and found["kinds"] == ["f", "f"]
