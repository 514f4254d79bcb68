"""Every real tegrastats line in the fixtures, parsed to values written out by hand
from the line itself (milliwatts in the line, watts in the sample)."""

from __future__ import annotations

import random
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.power.tegrastats import TegrastatsSample, parse_line

FIXTURES = Path(__file__).parent / "fixtures" / "tegrastats-samples.txt"


def fixture_lines() -> list[str]:
    lines = FIXTURES.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


CASES: list[dict[str, Any]] = [
    # Jetson Nano 4GB
    {
        "ram_used_mb": 1446,
        "ram_total_mb": 3957,
        "cpu_percent": [17, 11, 21, 12],
        "cpu_freq_mhz": [1428, 1428, 1428, 1428],
        "gpu_percent": 0,
        "gpu_freq_mhz": 76,
        "emc_percent": 2,
        "emc_freq_mhz": 1600,
        "rails_w": {"POM_5V_IN": 2.83, "POM_5V_GPU": 0.041, "POM_5V_CPU": 0.943},
        "temperatures_c": {
            "PLL": 20.5,
            "CPU": 24.5,
            "PMIC": 100.0,
            "GPU": 21.0,
            "AO": 29.5,
            "thermal": 22.25,
        },
        "total_w": 2.83,
    },
    # Jetson Nano 4GB
    {
        "ram_used_mb": 417,
        "ram_total_mb": 3964,
        "swap_used_mb": 0,
        "swap_total_mb": 1982,
        "cpu_percent": [0, 0, 0, 0],
        "cpu_freq_mhz": [1428, 1428, 1428, 1428],
        "gpu_percent": 0,
        "gpu_freq_mhz": 921,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "rails_w": {"POM_5V_IN": 1.828, "POM_5V_GPU": 0.121, "POM_5V_CPU": 0.243},
        "temperatures_c": {
            "PLL": 15.5,
            "CPU": 20.0,
            "PMIC": 100.0,
            "GPU": 17.5,
            "AO": 24.5,
            "thermal": 18.75,
        },
        "total_w": 1.828,
    },
    # Jetson Nano 4GB
    {
        "ram_used_mb": 417,
        "ram_total_mb": 3964,
        "swap_used_mb": 0,
        "swap_total_mb": 1982,
        "cpu_percent": [0, 0, 0, 0],
        "cpu_freq_mhz": [1428, 1428, 1428, 1428],
        "gpu_percent": 0,
        "gpu_freq_mhz": 921,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "rails_w": {"POM_5V_IN": 1.828, "POM_5V_GPU": 0.121, "POM_5V_CPU": 0.243},
        "temperatures_c": {
            "PLL": 15.0,
            "CPU": 19.5,
            "PMIC": 100.0,
            "GPU": 17.5,
            "AO": 24.0,
            "thermal": 18.5,
        },
        "total_w": 1.828,
    },
    # Jetson Nano 4GB
    {
        "ram_used_mb": 1180,
        "ram_total_mb": 3965,
        "swap_used_mb": 149,
        "swap_total_mb": 1024,
        "cpu_percent": [30, 33, 28, 26],
        "cpu_freq_mhz": [1036, 1036, 1036, 1036],
        "gpu_percent": 0,
        "gpu_freq_mhz": 76,
        "emc_percent": 10,
        "emc_freq_mhz": 1600,
        "rails_w": {"POM_5V_IN": 4.52, "POM_5V_GPU": 0.0, "POM_5V_CPU": 1.078},
        "temperatures_c": {
            "PLL": 57.0,
            "CPU": 60.5,
            "PMIC": 100.0,
            "GPU": 59.0,
            "AO": 65.0,
            "thermal": 59.75,
        },
        "total_w": 4.52,
    },
    # Jetson Nano 4GB
    {
        "ram_used_mb": 534,
        "ram_total_mb": 3964,
        "swap_used_mb": 5,
        "swap_total_mb": 1982,
        "cpu_percent": [16, 9, 0, 0],
        "cpu_freq_mhz": [204, 204, 204, 204],
        "gpu_percent": 0,
        "gpu_freq_mhz": 76,
        "emc_percent": 0,
        "emc_freq_mhz": 204,
        "rails_w": {"POM_5V_IN": 1.022, "POM_5V_GPU": 0.0, "POM_5V_CPU": 0.204},
        "temperatures_c": {
            "PLL": 34.0,
            "CPU": 36.5,
            "PMIC": 100.0,
            "GPU": 36.0,
            "AO": 39.5,
            "thermal": 36.25,
        },
        "total_w": 1.022,
    },
    # Jetson Nano 4GB
    {
        "ram_used_mb": 1923,
        "ram_total_mb": 3964,
        "swap_used_mb": 191,
        "swap_total_mb": 1982,
        "cpu_percent": [5, 4, 3, 6],
        "cpu_freq_mhz": [1224, 1224, 1224, 1224],
        "gpu_percent": 0,
        "gpu_freq_mhz": 76,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "rails_w": {"POM_5V_IN": 1.75, "POM_5V_GPU": 0.0, "POM_5V_CPU": 0.366},
        "temperatures_c": {
            "PLL": 37.0,
            "CPU": 40.0,
            "PMIC": 50.0,
            "GPU": 40.0,
            "AO": 45.0,
            "thermal": 40.0,
        },
        "total_w": 1.75,
    },
    # Jetson TX1
    {
        "ram_used_mb": 3468,
        "ram_total_mb": 3983,
        "swap_used_mb": 873,
        "swap_total_mb": 8192,
        "cpu_percent": [17, 13, 29, 5],
        "cpu_freq_mhz": [408, 408, 408, 408],
        "gpu_percent": 3,
        "gpu_freq_mhz": 76,
        "emc_percent": 1,
        "emc_freq_mhz": 408,
        "total_w": None,
    },
    # Jetson TX2
    {
        "ram_used_mb": 2417,
        "ram_total_mb": 6660,
        "cpu_percent": [0, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [1996, 2035, 2035, 1996, 1996, 1996],
        "total_w": None,
    },
    # Jetson TX2
    {
        "ram_used_mb": 2440,
        "ram_total_mb": 6660,
        "cpu_percent": [0, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [1994, 2035, 2035, 1993, 1992, 1996],
        "gpu_percent": 5,
        "gpu_freq_mhz": 1275,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "total_w": None,
    },
    # Jetson TX2
    {
        "ram_used_mb": 1345,
        "ram_total_mb": 7829,
        "swap_used_mb": 0,
        "swap_total_mb": 512,
        "cpu_percent": [2, None, None, None, None, None],
        "cpu_freq_mhz": [345, None, None, None, None, None],
        "gpu_percent": 0,
        "gpu_freq_mhz": 114,
        "emc_percent": 13,
        "emc_freq_mhz": 40,
        "rails_w": {
            "VDD_IN": 2.003,
            "VDD_CPU": 0.32,
            "VDD_GPU": 0.4,
            "VDD_SOC": 0.4,
            "VDD_WIFI": 0.0,
            "VDD_DDR": 0.24,
        },
        "temperatures_c": {
            "BCPU": 35.0,
            "MCPU": 35.0,
            "GPU": 41.0,
            "PLL": 35.0,
            "AO": 35.5,
            "Tboard": 35.0,
            "Tdiode": 36.0,
            "PMIC": 100.0,
            "thermal": 35.5,
        },
        "total_w": 2.003,
    },
    # Jetson TX2
    {
        "ram_used_mb": 2020,
        "ram_total_mb": 7852,
        "cpu_percent": [9, 21, 25, 3, 1, 1],
        "cpu_freq_mhz": [345, 345, 345, 345, 345, 345],
        "gpu_percent": 0,
        "emc_percent": 0,
        "rails_w": {
            "VDD_SYS_GPU": 0.153,
            "VDD_SYS_SOC": 0.536,
            "VDD_4V0_WIFI": 0.633,
            "VDD_IN": 3.14,
            "VDD_SYS_CPU": 0.536,
            "VDD_SYS_DDR": 0.557,
        },
        "temperatures_c": {
            "PLL": 42.5,
            "MCPU": 42.5,
            "PMIC": 100.0,
            "Tboard": 40.0,
            "GPU": 41.0,
            "BCPU": 42.5,
            "thermal": 41.9,
            "Tdiode": 41.25,
        },
        "total_w": 3.14,
    },
    # Jetson TX2
    {
        "ram_used_mb": 2344,
        "ram_total_mb": 7852,
        "swap_used_mb": 0,
        "swap_total_mb": 3926,
        "cpu_percent": [1, None, None, 1, 0, 2],
        "cpu_freq_mhz": [345, None, None, 345, 345, 345],
        "gpu_percent": 0,
        "gpu_freq_mhz": 624,
        "emc_percent": 4,
        "emc_freq_mhz": 1600,
        "rails_w": {
            "VDD_SYS_GPU": 0.152,
            "VDD_SYS_SOC": 0.687,
            "VDD_4V0_WIFI": 0.0,
            "VDD_IN": 3.056,
            "VDD_SYS_CPU": 0.152,
            "VDD_SYS_DDR": 0.883,
        },
        "temperatures_c": {
            "PLL": 37.5,
            "MCPU": 37.5,
            "PMIC": 100.0,
            "Tboard": 32.0,
            "GPU": 35.0,
            "BCPU": 37.5,
            "thermal": 36.5,
            "Tdiode": 34.25,
        },
        "total_w": 3.056,
    },
    # Jetson TX2 8GB
    {
        "ram_used_mb": 896,
        "ram_total_mb": 7859,
        "swap_used_mb": 0,
        "swap_total_mb": 3929,
        "cpu_percent": [4, 4, 4, 1, 0, 0],
        "cpu_freq_mhz": [2035, 345, 345, 2035, 2035, 2035],
        "gpu_percent": 0,
        "emc_percent": 0,
        "rails_w": {
            "VDD_SYS_GPU": 0.153,
            "VDD_SYS_SOC": 0.383,
            "VDD_4V0_WIFI": 0.0,
            "VDD_IN": 1.84,
            "VDD_SYS_CPU": 0.306,
            "VDD_SYS_DDR": 0.269,
        },
        "temperatures_c": {
            "PLL": 34.5,
            "MCPU": 34.5,
            "PMIC": 100.0,
            "Tboard": 29.0,
            "GPU": 31.0,
            "BCPU": 34.5,
            "thermal": 32.8,
            "Tdiode": 30.5,
        },
        "total_w": 1.84,
    },
    # Jetson TX2 8GB
    {
        "ram_used_mb": 3276,
        "ram_total_mb": 7859,
        "swap_used_mb": 1626,
        "swap_total_mb": 12122,
        "cpu_percent": [44, 49, 67, 17, 25, 8],
        "cpu_freq_mhz": [1421, 2031, 2034, 1420, 1419, 1420],
        "gpu_percent": 0,
        "gpu_freq_mhz": 114,
        "emc_percent": 1,
        "emc_freq_mhz": 1866,
        "rails_w": {
            "VDD_SYS_GPU": 0.182,
            "VDD_SYS_SOC": 0.73,
            "VDD_4V0_WIFI": 0.0,
            "VDD_IN": 5.297,
            "VDD_SYS_CPU": 1.917,
            "VDD_SYS_DDR": 1.241,
        },
        "temperatures_c": {
            "PLL": 42.5,
            "MCPU": 42.5,
            "PMIC": 50.0,
            "Tboard": 38.0,
            "GPU": 39.5,
            "BCPU": 42.5,
            "thermal": 41.3,
            "Tdiode": 39.25,
        },
        "total_w": 5.297,
    },
    # Jetson TX2 4GB or TX2 NX (3830MB, 6 cores; model inferred)
    {
        "ram_used_mb": 1873,
        "ram_total_mb": 3830,
        "cpu_percent": [8, 26, 24, 7, 7, 6],
        "cpu_freq_mhz": [2016, 2034, 2035, 2026, 2034, 2034],
        "gpu_percent": 0,
        "gpu_freq_mhz": 114,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "rails_w": {
            "VDD_SYS_GPU": 0.077,
            "VDD_SYS_SOC": 0.539,
            "VDD_IN": 2.93,
            "VDD_SYS_CPU": 0.539,
            "VDD_SYS_DDR": 0.727,
        },
        "temperatures_c": {
            "PLL": 39.0,
            "MCPU": 39.0,
            "PMIC": 50.0,
            "Tboard": 35.0,
            "GPU": 37.0,
            "BCPU": 39.0,
            "thermal": 38.5,
            "Tdiode": 37.0,
        },
        "total_w": 2.93,
    },
    # Jetson TX2 4GB or TX2 NX (3825MB, 6 cores; model inferred)
    {
        "ram_used_mb": 1689,
        "ram_total_mb": 3825,
        "swap_used_mb": 0,
        "swap_total_mb": 1913,
        "cpu_percent": [3, None, None, 0, 1, 1],
        "cpu_freq_mhz": [345, None, None, 345, 345, 345],
        "gpu_percent": 0,
        "emc_percent": 0,
        "temperatures_c": {
            "PLL": 50.5,
            "MCPU": 50.5,
            "PMIC": 50.0,
            "GPU": 50.0,
            "BCPU": 50.5,
            "thermal": 50.3,
        },
        "total_w": None,
    },
    # Jetson AGX Xavier 16GB
    {
        "ram_used_mb": 1736,
        "ram_total_mb": 15827,
        "cpu_percent": [1, 2, 0, 0, None, None, None, None],
        "cpu_freq_mhz": [1160, 1161, 1189, 1189, None, None, None, None],
        "gpu_percent": 0,
        "gpu_freq_mhz": 114,
        "emc_percent": 0,
        "emc_freq_mhz": 665,
        "rails_w": {
            "GPU": 0.466,
            "CPU": 0.466,
            "SOC": 0.932,
            "CV": 0.0,
            "VDDRQ": 0.0,
            "SYS5V": 1.854,
        },
        "temperatures_c": {
            "AO": 29.0,
            "GPU": 30.0,
            "iwlwifi": 34.0,
            "Tboard": 30.0,
            "Tdiode": 33.0,
            "AUX": 29.0,
            "CPU": 30.0,
            "thermal": 29.45,
            "PMIC": 100.0,
        },
        "total_w": 3.718,
    },
    # Jetson AGX Xavier 16GB
    {
        "ram_used_mb": 1733,
        "ram_total_mb": 15827,
        "cpu_percent": [1, 0, 0, 0, None, None, None, None],
        "cpu_freq_mhz": [1190, 1190, 1190, 1190, None, None, None, None],
        "gpu_percent": 4,
        "emc_percent": 0,
        "rails_w": {
            "GPU": 0.621,
            "CPU": 0.465,
            "SOC": 1.397,
            "CV": 0.0,
            "VDDRQ": 0.0,
            "SYS5V": 2.053,
        },
        "temperatures_c": {
            "AO": 25.5,
            "GPU": 26.5,
            "iwlwifi": 32.0,
            "Tboard": 27.0,
            "Tdiode": 29.75,
            "AUX": 25.5,
            "CPU": 26.5,
            "thermal": 26.1,
            "PMIC": 100.0,
        },
        "total_w": 4.536,
    },
    # Jetson AGX Xavier 16GB
    {
        "ram_used_mb": 1903,
        "ram_total_mb": 15692,
        "cpu_percent": [1, 1, 2, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [1190, 1190, 1190, 1190, 1190, 1190, 1190, 1190],
        "gpu_percent": 0,
        "emc_percent": 0,
        "rails_w": {
            "GPU": 0.0,
            "CPU": 0.216,
            "SOC": 0.864,
            "CV": 0.0,
            "VDDRQ": 0.144,
            "SYS5V": 1.889,
        },
        "temperatures_c": {
            "AO": 32.5,
            "GPU": 32.0,
            "Tboard": 32.0,
            "Tdiode": 34.75,
            "AUX": 31.5,
            "CPU": 33.5,
            "thermal": 32.9,
            "PMIC": 100.0,
        },
        "total_w": 3.113,
    },
    # Jetson AGX Xavier 32GB
    {
        "ram_used_mb": 721,
        "ram_total_mb": 31927,
        "swap_used_mb": 0,
        "swap_total_mb": 15963,
        "cpu_percent": [2, 0, 0, 0, None, None, None, None],
        "cpu_freq_mhz": [1190, 1190, 1190, 1190, None, None, None, None],
        "gpu_percent": 0,
        "gpu_freq_mhz": 318,
        "emc_percent": 0,
        "emc_freq_mhz": 665,
        "rails_w": {
            "GPU": 0.0,
            "CPU": 0.311,
            "SOC": 0.932,
            "CV": 0.0,
            "VDDRQ": 0.621,
            "SYS5V": 1.482,
        },
        "temperatures_c": {
            "AO": 37.5,
            "GPU": 37.5,
            "Tdiode": 40.0,
            "PMIC": 100.0,
            "AUX": 36.0,
            "CPU": 37.5,
            "thermal": 36.9,
            "Tboard": 37.0,
        },
        "total_w": 3.346,
    },
    # Jetson AGX Xavier 32GB (MODE_15W_DESKTOP)
    {
        "ram_used_mb": 3149,
        "ram_total_mb": 31920,
        "swap_used_mb": 0,
        "swap_total_mb": 15960,
        "cpu_percent": [57, 56, 57, 63, None, None, None, None],
        "cpu_freq_mhz": [2188, 2188, 2188, 2188, None, None, None, None],
        "gpu_percent": 39,
        "emc_percent": 0,
        "temperatures_c": {
            "AO": 35.0,
            "GPU": 35.0,
            "Tdiode": 37.75,
            "PMIC": 50.0,
            "AUX": 34.5,
            "CPU": 37.5,
            "thermal": 35.55,
            "Tboard": 35.0,
        },
        "total_w": None,
    },
    # Jetson Xavier NX 8GB
    {
        "ram_used_mb": 4412,
        "ram_total_mb": 7772,
        "swap_used_mb": 139,
        "swap_total_mb": 3886,
        "cpu_percent": [9, 6, 6, 5, 4, 8],
        "cpu_freq_mhz": [1190, 1190, 1190, 1190, 1190, 1267],
        "gpu_percent": 62,
        "gpu_freq_mhz": 306,
        "emc_percent": 10,
        "emc_freq_mhz": 1600,
        "rails_w": {"VDD_IN": 4.067, "VDD_CPU_GPU_CV": 0.738, "VDD_SOC": 1.353},
        "temperatures_c": {
            "AO": 41.5,
            "GPU": 43.0,
            "PMIC": 100.0,
            "AUX": 41.5,
            "CPU": 43.5,
            "thermal": 42.55,
        },
        "total_w": 4.067,
    },
    # Jetson Xavier NX 8GB
    {
        "ram_used_mb": 5246,
        "ram_total_mb": 7771,
        "swap_used_mb": 983,
        "swap_total_mb": 20269,
        "cpu_percent": [47, 23, 32, 22, 31, 96],
        "cpu_freq_mhz": [1420, 1420, 1420, 1420, 1420, 1420],
        "gpu_percent": 0,
        "gpu_freq_mhz": 1109,
        "emc_percent": 2,
        "emc_freq_mhz": 1600,
        "rails_w": {"VDD_IN": 6.14, "VDD_CPU_GPU_CV": 2.706, "VDD_SOC": 1.074},
        "temperatures_c": {
            "AO": 29.0,
            "GPU": 31.5,
            "PMIC": 100.0,
            "AUX": 30.0,
            "CPU": 33.5,
            "thermal": 31.35,
        },
        "total_w": 6.14,
    },
    # Jetson Orin NX 8GB (7620MB, 6 cores, NVDLA0+NVENC present; model inferred)
    {
        "timestamp": datetime(2025, 5, 15, 18, 30, 28),
        "ram_used_mb": 6982,
        "ram_total_mb": 7620,
        "swap_used_mb": 2640,
        "swap_total_mb": 16384,
        "cpu_percent": [97, 95, 95, 91, 88, 93],
        "cpu_freq_mhz": [1984, 1984, 1984, 1984, 1984, 247],
        "gpu_percent": 84,
        "gpu_freq_mhz": 713,
        "emc_percent": 18,
        "emc_freq_mhz": 3199,
        "rails_w": {"VDD_IN": 17.946, "VDD_CPU_GPU_CV": 8.896, "VDD_SOC": 3.923},
        "temperatures_c": {
            "cv0": 63.031,
            "cpu": 65.562,
            "soc2": 64.156,
            "soc0": 63.031,
            "cv1": 62.937,
            "gpu": 63.5,
            "tj": 65.562,
            "soc1": 64.718,
            "cv2": 60.875,
        },
        "total_w": 17.946,
    },
    # Jetson Orin NX 16GB (15598MB, 8 cores; model inferred)
    {
        "timestamp": datetime(2026, 10, 1, 20, 36, 35),
        "ram_used_mb": 2432,
        "ram_total_mb": 15598,
        "swap_used_mb": 0,
        "swap_total_mb": 6144,
        "cpu_percent": [55, 9, 24, 64, None, None, 0, 0],
        "cpu_freq_mhz": [1036, 1036, 1036, 1036, None, None, 729, 729],
        "gpu_percent": 0,
        "rails_w": {"VDD_IN": 7.28},
        "temperatures_c": {
            "cv0": 56.281,
            "cpu": 57.156,
            "soc2": 56.593,
            "soc0": 57.781,
            "cv1": 56.125,
            "gpu": 55.343,
            "tj": 59.687,
            "soc1": 59.687,
            "cv2": 56.281,
        },
        "total_w": 7.28,
    },
    # Jetson Orin Nano 8GB
    {
        "timestamp": datetime(2024, 11, 15, 8, 38, 9),
        "ram_used_mb": 6185,
        "ram_total_mb": 7620,
        "swap_used_mb": 851,
        "swap_total_mb": 3810,
        "cpu_percent": [15, 11, 14, 13, 11, 8],
        "cpu_freq_mhz": [729, 729, 729, 729, 729, 729],
        "gpu_percent": 63,
        "gpu_freq_mhz": 621,
        "emc_percent": 43,
        "emc_freq_mhz": 2133,
        "rails_w": {"VDD_IN": 12.479, "VDD_CPU_GPU_CV": 4.667, "VDD_SOC": 2.817},
        "temperatures_c": {
            "cpu": 53.968,
            "soc2": 52.437,
            "soc0": 50.75,
            "gpu": 53.343,
            "tj": 53.968,
            "soc1": 51.656,
        },
        "total_w": 12.479,
    },
    # Jetson Orin Nano 8GB
    {
        "timestamp": datetime(2025, 6, 18, 11, 25, 24),
        "ram_used_mb": 3452,
        "ram_total_mb": 7620,
        "swap_used_mb": 1518,
        "swap_total_mb": 16384,
        "cpu_percent": [1, 2, 0, 2, 2, 1],
        "cpu_freq_mhz": [1420, 1420, 1420, 1420, 729, 729],
        "gpu_percent": 0,
        "rails_w": {"VDD_IN": 4.824, "VDD_CPU_GPU_CV": 0.518, "VDD_SOC": 1.475},
        "temperatures_c": {
            "cpu": 50.031,
            "soc2": 49.031,
            "soc0": 50.0,
            "gpu": 49.031,
            "tj": 50.25,
            "soc1": 50.25,
        },
        "total_w": 4.824,
    },
    # Jetson Orin Nano Super devkit (7W/15W/25W/MAXN modes)
    {
        "timestamp": datetime(2026, 4, 27, 14, 59, 41),
        "ram_used_mb": 775,
        "ram_total_mb": 7620,
        "swap_used_mb": 0,
        "swap_total_mb": 3810,
        "cpu_percent": [1, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [729, 729, 729, 729, 729, 729],
        "gpu_percent": 0,
        "rails_w": {"VDD_IN": 4.761, "VDD_CPU_GPU_CV": 0.515, "VDD_SOC": 1.428},
        "temperatures_c": {
            "cpu": 48.468,
            "soc2": 47.531,
            "soc0": 48.062,
            "gpu": 48.562,
            "tj": 49.156,
            "soc1": 49.156,
        },
        "total_w": 4.761,
    },
    # Jetson Orin Nano (7546MB, 6 cores)
    {
        "timestamp": datetime(2026, 10, 1, 20, 36, 32),
        "ram_used_mb": 974,
        "ram_total_mb": 7546,
        "swap_used_mb": 0,
        "swap_total_mb": 5821,
        "cpu_percent": [0, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [729, 729, 883, 883, 729, 729],
        "gpu_percent": 12,
        "rails_w": {"VDD_IN": 4.548, "VDD_CPU_GPU_CV": 0.483, "VDD_SOC": 1.489},
        "temperatures_c": {
            "cpu": 49.843,
            "soc2": 49.156,
            "soc0": 50.187,
            "gpu": 50.875,
            "tj": 50.875,
            "soc1": 50.218,
        },
        "total_w": 4.548,
    },
    # Jetson AGX Orin 64GB
    {
        "timestamp": datetime(2025, 10, 26, 5, 10, 54),
        "ram_used_mb": 6879,
        "ram_total_mb": 62841,
        "swap_used_mb": 0,
        "swap_total_mb": 31421,
        "cpu_percent": [5, 1, 0, 9, 1, 3, 5, 0, 3, 1, 1, 7],
        "cpu_freq_mhz": [729, 729, 729, 729, 729, 729, 729, 729, 729, 729, 729, 729],
        "gpu_percent": 0,
        "gpu_freq_mhz": 305,
        "emc_percent": 0,
        "emc_freq_mhz": 2133,
        "rails_w": {
            "VDD_GPU_SOC": 2.801,
            "VDD_CPU_CV": 0.4,
            "VIN_SYS_5V0": 4.536,
            "VDDQ_VDD2_1V8AO": 0.604,
        },
        "temperatures_c": {
            "cpu": 47.687,
            "tboard": 36.75,
            "soc2": 44.312,
            "tdiode": 37.5,
            "soc0": 45.718,
            "gpu": 43.218,
            "tj": 47.687,
            "soc1": 45.125,
        },
        "total_w": 8.341,
    },
    # Jetson AGX Orin 64GB
    {
        "timestamp": datetime(2025, 10, 26, 5, 12, 7),
        "ram_used_mb": 7029,
        "ram_total_mb": 62841,
        "swap_used_mb": 0,
        "swap_total_mb": 31421,
        "cpu_percent": [31, 29, 30, 36, 28, 28, 46, 47, 42, 33, 39, 32],
        "cpu_freq_mhz": [1190, 1190, 1190, 1190, 1113, 1113, 1113, 1113, 806, 806, 806, 806],
        "gpu_percent": 87,
        "gpu_freq_mhz": 305,
        "emc_percent": 6,
        "emc_freq_mhz": 2133,
        "rails_w": {
            "VDD_GPU_SOC": 3.601,
            "VDD_CPU_CV": 2.4,
            "VIN_SYS_5V0": 5.644,
            "VDDQ_VDD2_1V8AO": 1.31,
        },
        "temperatures_c": {
            "cpu": 49.062,
            "tboard": 37.0,
            "soc2": 44.843,
            "tdiode": 38.0,
            "soc0": 46.125,
            "gpu": 44.156,
            "tj": 48.937,
            "soc1": 45.531,
        },
        "total_w": 12.955,
    },
    # Jetson AGX Orin 64GB
    {
        "timestamp": datetime(2025, 11, 4, 1, 46, 53),
        "ram_used_mb": 7822,
        "ram_total_mb": 62841,
        "swap_used_mb": 0,
        "swap_total_mb": 31421,
        "cpu_percent": [25, 20, 40, 0, 33, 0, 25, 25, 50, 33, 25, 25],
        "cpu_freq_mhz": [2201, 2201, 2201, 2201, 729, 1190, 1190, 1190, 1574, 729, 729, 729],
        "gpu_percent": 31,
        "gpu_freq_mhz": 305,
        "emc_percent": 1,
        "emc_freq_mhz": 2133,
        "rails_w": {
            "VDD_GPU_SOC": 3.188,
            "VDD_CPU_CV": 2.39,
            "VIN_SYS_5V0": 4.614,
            "VDDQ_VDD2_1V8AO": 0.802,
        },
        "temperatures_c": {
            "cpu": 50.281,
            "tboard": 38.5,
            "soc2": 46.375,
            "tdiode": 39.5,
            "soc0": 47.562,
            "gpu": 45.5,
            "tj": 50.281,
            "soc1": 46.843,
        },
        "total_w": 10.994,
    },
    # Jetson AGX Orin 64GB
    {
        "ram_used_mb": 2448,
        "ram_total_mb": 62840,
        "swap_used_mb": 0,
        "swap_total_mb": 31420,
        "cpu_percent": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        "cpu_freq_mhz": [2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201],
        "gpu_percent": 0,
        "rails_w": {"VDD_GPU_SOC": 4.94, "VDD_CPU_CV": 0.988, "VIN_SYS_5V0": 4.442},
        "temperatures_c": {
            "cpu": 42.0,
            "soc2": 37.843,
            "soc0": 39.187,
            "gpu": 37.75,
            "tj": 42.0,
            "soc1": 37.937,
        },
        "total_w": 10.37,
    },
    # Jetson AGX Orin Developer Kit 64GB
    {
        "timestamp": datetime(2026, 7, 25, 9, 8, 28),
        "ram_used_mb": 20642,
        "ram_total_mb": 62817,
        "cpu_percent": [23, 10, 4, 14, 30, 18, 10, 10, 33, 7, 5, 27],
        "cpu_freq_mhz": [2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201, 2201],
        "gpu_percent": 12,
        "gpu_freq_mhz": 1300,
        "emc_percent": 3,
        "emc_freq_mhz": 3199,
        "rails_w": {"VDD_GPU_SOC": 5.139, "VDD_CPU_CV": 3.268, "VIN_SYS_5V0": 5.5},
        "temperatures_c": {"cpu": 52.968, "soc2": 48.406, "soc0": 49.531, "gpu": 47.625},
        "total_w": 13.907,
    },
    # Jetson AGX Thor
    {
        "timestamp": datetime(2026, 1, 20, 22, 46, 22),
        "ram_used_mb": 17842,
        "ram_total_mb": 125772,
        "cpu_percent": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        "cpu_freq_mhz": [972, 972, 1566, 1566, 972, 972, 972, 972, 972, 972, 972, 972, 972, 972],
        "rails_w": {"VDD_GPU": 0.0, "VDD_CPU_SOC_MSS": 5.535, "VIN_SYS_5V0": 5.04, "VIN": 16.802},
        "temperatures_c": {"cpu": 30.468, "tj": 31.218, "soc012": 30.218, "soc345": 31.218},
        "total_w": 16.802,
    },
    # Tegra X1 running L4T, likely Nintendo Switch (LCPU/Charger/max170xx sensors)
    {
        "ram_used_mb": 2594,
        "ram_total_mb": 3483,
        "swap_used_mb": 366,
        "swap_total_mb": 4096,
        "cpu_percent": [9, 9, 12, 8],
        "cpu_freq_mhz": [306, 306, 306, 306],
        "gpu_percent": 2,
        "temperatures_c": {
            "LCPU": 36.5,
            "CPU": 33.0,
            "Charger": 115.0,
            "Tdiode": 40.0,
            "PLL": 32.0,
            "GPU": 32.5,
            "thermal": 39.0,
            "AO": 41.5,
            "max170xx": 38.9,
            "PMIC": 100.0,
            "Tboard": 39.0,
        },
        "total_w": None,
    },
    # Jetson Xavier NX 8GB (6854MB)
    {
        "ram_used_mb": 2690,
        "ram_total_mb": 6854,
        "swap_used_mb": 479,
        "swap_total_mb": 3427,
        "cpu_percent": [3, 7, 1, 0, None, None],
        "cpu_freq_mhz": [1904, 1906, 1905, 1907, None, None],
        "gpu_percent": 0,
        "gpu_freq_mhz": 510,
        "emc_percent": 0,
        "emc_freq_mhz": 1600,
        "rails_w": {"VDD_IN": 5.079, "VDD_CPU_GPU_CV": 0.696, "VDD_SOC": 1.104},
        "temperatures_c": {"AUX": 39.0, "CPU": 39.5, "AO": 37.5, "GPU": 37.5, "PMIC": 50.0},
        "total_w": 5.079,
    },
]


def test_the_fixture_file_is_the_shared_one() -> None:
    shared = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / FIXTURES.name
    if not shared.exists():
        pytest.skip("../shared is not beside this checkout")
    assert shared.read_text() == FIXTURES.read_text()


def test_one_case_per_fixture_line() -> None:
    assert len(CASES) == len(fixture_lines()) == 37


@pytest.mark.parametrize("index", range(len(CASES)))
def test_fixture_line_parses_exactly(index: int) -> None:
    sample = parse_line(fixture_lines()[index])
    expected = CASES[index]
    for f in fields(TegrastatsSample):
        default = getattr(TegrastatsSample(), f.name)
        assert getattr(sample, f.name) == expected.get(f.name, default), f.name
    assert sample.total_w == expected["total_w"]


def test_trailing_spaces_irregular_spacing_and_any_order() -> None:
    line = fixture_lines()[25]  # Orin Nano, JetPack 6
    reference = parse_line(line)
    timestamp, rest = line[:19], line[20:]
    tokens = rest.split()
    pairs = [tokens[i : i + 2] for i in range(0, len(tokens) - 1, 2)]
    # Shuffle whole "NAME value" pairs where the pairing is unambiguous.
    rails = [p for p in pairs if p[0].startswith("VDD_")]
    shuffled = rails[::-1]
    mangled = (
        f"{timestamp}   {' '.join('  '.join(p) for p in shuffled)}\t"
        + " ".join(t for t in tokens if not t.startswith("VDD_") and "mW/" not in t)
        + "   \n"
    )
    sample = parse_line(mangled)
    assert sample.rails_w == reference.rails_w
    assert sample.total_w == 12.479
    assert sample.cpu_percent == reference.cpu_percent
    assert sample.temperatures_c == reference.temperatures_c
    assert sample.timestamp == datetime(2024, 11, 15, 8, 38, 9)


def test_fields_are_recognised_in_random_order() -> None:
    line = fixture_lines()[36]  # Xavier NX: no timestamp
    tokens = line.split()
    groups: list[list[str]] = []
    i = 0
    while i < len(tokens):
        # Keep value tokens with the name before them.
        if i + 1 < len(tokens) and not tokens[i + 1][0].isalpha() and "@" not in tokens[i]:
            groups.append(tokens[i : i + 2])
            i += 2
        else:
            groups.append([tokens[i]])
            i += 1
    random.Random(7).shuffle(groups)
    shuffled = parse_line(" ".join(" ".join(g) for g in groups))
    reference = parse_line(line)
    assert shuffled.rails_w == reference.rails_w
    assert shuffled.cpu_percent == reference.cpu_percent
    assert (shuffled.ram_used_mb, shuffled.gpu_percent) == (2690, 0.0)


def test_unknown_tokens_are_tolerated() -> None:
    sample = parse_line("RAM 100/200MB FUTURE_ENGINE 3%@99 NEWTHING [x] VDD_IN 5000mW/4000mW ZZ")
    assert sample.ram_used_mb == 100 and sample.rails_w == {"VDD_IN": 5.0}


def test_sensor_off_and_negative_temperatures() -> None:
    sample = parse_line("RAM 1/2MB PLL@-256C CPU@-12.5C GPU@-256C/-256C tj@40C/41C")
    assert sample.temperatures_c == {"CPU": -12.5, "tj": 40.0}


def test_nc_rails_are_dropped_even_twice() -> None:
    sample = parse_line("VDD_IN 3000mW/3000mW NC 0mW/0mW NC 12mW/12mW VDD_SOC 900mW/900mW")
    assert sample.rails_w == {"VDD_IN": 3.0, "VDD_SOC": 0.9}
    assert sample.total_w == 3.0


def test_total_prefers_vin_then_pom_then_vdd_in_else_sums() -> None:
    assert parse_line("VDD_IN 1/1 POM_5V_IN 2/2 VIN 3/3").total_w == 0.003
    assert parse_line("VDD_IN 1/1 POM_5V_IN 2/2").total_w == 0.002
    assert parse_line("GPU 100/1 CPU 200/1 SOC 300/1").total_w == 0.6
    assert parse_line("RAM 1/2MB").total_w is None


@pytest.mark.parametrize(
    "line",
    ["", "   ", "hello world", "Traceback (most recent call last):", "RAM lots", "12:00 ok"],
)
def test_non_tegrastats_lines_raise_a_clear_error(line: str) -> None:
    with pytest.raises(ValueError, match="not a tegrastats line"):
        parse_line(line)


def test_values_out_of_any_real_range_are_not_taken() -> None:
    huge = "9" * 5000
    sample = parse_line(
        f"RAM 100/200MB VDD_IN {huge}mW/1mW VDD_GPU 20000000mW/1mW GR3D_FREQ 250% "
        f"EMC_FREQ {huge}% cpu@{huge}C gpu@1500C tj@41.5C VDD_CPU 1200mW/1200mW"
    )
    # 20 kW is not a rail of a Jetson, 250 % is not a load, 1500 C is not a temperature.
    assert sample.rails_w == {"VDD_CPU": 1.2}
    assert sample.gpu_percent is None and sample.emc_percent is None
    assert sample.temperatures_c == {"tj": 41.5}


def test_rails_and_zones_are_bounded_per_line() -> None:
    line = " ".join(f"R{i} {i}mW/{i}mW z{i}@{i % 90}C" for i in range(20_000))
    sample = parse_line(line)
    assert list(sample.rails_w) == [f"R{i}" for i in range(32)]
    assert list(sample.temperatures_c) == [f"z{i}" for i in range(32)]


def test_replacement_characters_from_invalid_utf8_are_just_unknown_tokens() -> None:
    line = b"RAM \xff\xfe/\x00MB VDD_IN 5000mW/5000mW \xc3(".decode("utf-8", "replace")
    assert parse_line(line).rails_w == {"VDD_IN": 5.0}
