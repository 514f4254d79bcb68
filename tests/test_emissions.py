"""`edgewatt run --emissions FILE`: codecarbon's emissions.csv, a row appended per run,
with the device's measured energy; read back by codecarbon's own reader where a venv
holding codecarbon is given (EDGEWATT_CODECARBON_PYTHON: its interpreter)."""

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

from edgewatt.cli.emissions import COLUMNS, J_PER_KWH
from tests.conftest import ROOT

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


@pytest.mark.skipif(
    not os.environ.get("EDGEWATT_CODECARBON_PYTHON"), reason="no venv holding codecarbon given"
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
    python = os.environ["EDGEWATT_CODECARBON_PYTHON"]
    answer = subprocess.run(
        [python, "-c", code, str(out), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(answer.stdout)
    assert tuple(found["fields"]) == COLUMNS
    assert found == {**found, "valid": True, "rows": 2, "duration": "f"}
