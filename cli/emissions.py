"""`edgewatt run --emissions FILE`: one row per run in codecarbon's ``emissions.csv``, the
file its users' notebooks, dashboards and papers read.

The columns, their order and units are codecarbon's (3.3.2,
``codecarbon/output_methods/emissions_data.py``: ``EmissionsData``): durations in s,
energy in kWh, power in W, emissions in kg CO2eq, rates in kg/s, RAM in GB (2**30 B).
Where codecarbon estimates, edgewatt writes what it measured: ``energy_consumed`` is
the device's energy over the run from its power sensors (``tracking_mode`` "machine",
as codecarbon's default: the whole device), ``emissions`` that energy at the grid
intensity edgewatt was configured with. What edgewatt does not measure apart (the
CPU's, GPU's and RAM's own power and energy, the location) is left empty, never a
made-up figure. A row is appended; a file with other columns is left as it is.

Phases are codecarbon's tasks (``start_task``/``stop_task``), whose rows never go in
``emissions.csv``: its columns have no task name, and codecarbon's reader backs up a file
whose header differs. codecarbon writes them to a file of their own beside it,
``emissions_<experiment>_<run_id>.csv`` (``FileOutput.task_out``: ``TaskEmissionsData``'s
columns, those empty in every row left out, the file written whole); so does
:func:`write_tasks`, one row per phase with its measured device energy, under the run
row's ``run_id``.
"""

from __future__ import annotations

import csv
import os
import platform
import time
import uuid
from typing import Any

COLUMNS = (
    "timestamp", "project_name", "run_id", "experiment_id", "duration", "emissions",
    "emissions_rate", "cpu_power", "gpu_power", "ram_power", "cpu_energy", "gpu_energy",
    "ram_energy", "energy_consumed", "water_consumed", "country_name", "country_iso_code",
    "region", "cloud_provider", "cloud_region", "os", "python_version", "codecarbon_version",
    "cpu_count", "cpu_model", "gpu_count", "gpu_model", "longitude", "latitude",
    "ram_total_size", "tracking_mode", "cpu_utilization_percent", "gpu_utilization_percent",
    "ram_utilization_percent", "ram_used_gb", "on_cloud", "pue", "wue",
)  # fmt: skip
J_PER_KWH = 3_600_000.0
# TaskEmissionsData's fields, in its order (a task has no experiment_id).
TASK_COLUMNS = ("task_name", *(c for c in COLUMNS if c not in ("experiment_id", "pue", "wue")))


def row(summary: dict[str, Any], labels: dict[str, str], ended_at: float) -> dict[str, Any]:
    """The run's row from its summary (edgewatt run's); ``labels``: `project` and
    `experiment` name codecarbon's project and experiment."""
    duration = summary.get("duration_s") or 0.0
    energy = summary.get("energy_j", summary.get("energy_vdd_in_j"))
    grams = summary.get("total_carbon_g")
    kg = None if grams is None else grams / 1000
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ended_at)),
        "project_name": labels.get("project", "edgewatt"),
        "run_id": str(uuid.uuid4()),
        "experiment_id": labels.get("experiment", ""),
        "duration": duration,
        "emissions": kg,
        "emissions_rate": kg / duration if kg is not None and duration > 0 else None,
        "energy_consumed": None if energy is None else energy / J_PER_KWH,
        "water_consumed": 0.0,  # codecarbon's at its default water usage (wue 0)
        "os": platform.platform(),
        "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_total_size": _ram_gb(),
        "tracking_mode": "machine",
        "on_cloud": "N",
        "pue": 1,
        "wue": 0,
    }


def task_rows(
    run: dict[str, Any], phases: list[dict[str, Any]], g_per_kwh: float | None
) -> list[dict[str, Any]]:
    """One task row per measured phase (the daemon's summary items), with the run row's
    identity and machine columns; emissions at ``g_per_kwh`` (None: left empty)."""
    rows = []
    for phase in phases:
        duration = phase.get("duration_s") or 0.0
        energy = phase.get("device_energy_j")
        kwh = None if energy is None else energy / J_PER_KWH
        kg = None if kwh is None or g_per_kwh is None else kwh * g_per_kwh / 1000
        ended = phase.get("ended_at") or phase.get("started_at") or 0.0
        same = {c: run.get(c) for c in TASK_COLUMNS if c in run}
        rows.append({
            **same,
            "task_name": phase.get("name", ""),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ended)),
            "duration": duration,
            "emissions": kg,
            "emissions_rate": kg / duration if kg is not None and duration > 0 else None,
            "energy_consumed": kwh,
        })  # fmt: skip
    return rows


def task_path(path: str, experiment: str, run_id: str) -> str:
    """codecarbon's file of a run's tasks, beside its emissions.csv (``experiment``:
    "base" where none is named, as codecarbon's default)."""
    name = f"emissions_{experiment or 'base'}_{run_id}.csv"
    return os.path.join(os.path.dirname(path) or ".", name)


def write_tasks(path: str, rows: list[dict[str, Any]]) -> str | None:
    """The tasks file, written whole as codecarbon writes it (its columns empty in
    every row left out); why not, where it cannot be written."""
    columns = [c for c in TASK_COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for r in rows:
                writer.writerow({k: "" if v is None else v for k, v in r.items()})
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return None


def append(path: str, values: dict[str, Any]) -> str | None:
    """Append ``values`` as a row (the header first in a new or empty file); why not,
    where the file has other columns (it is left as it is) or cannot be written."""
    try:
        with open(path, "a+", newline="", encoding="utf-8") as f:
            f.seek(0)
            header = next(csv.reader(f), None)
            if header is not None and sorted(header) != sorted(COLUMNS):
                return f"{path} has other columns than codecarbon's emissions.csv: left as it is"
            writer = csv.DictWriter(f, fieldnames=header or COLUMNS, restval="")
            if header is None:
                writer.writeheader()
            writer.writerow({k: "" if v is None else v for k, v in values.items()})
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor()


def _ram_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (OSError, ValueError):
        return None
