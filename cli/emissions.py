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
