"""A stand-in of nvidia-ml-py's pynvml as it answers on a Jetson (JetPack 6's NVML on
the integrated GPU): it loads, finds the GPU by name, and answers
NVML_ERROR_NOT_SUPPORTED (its message "Not Supported") for power and energy, as NVIDIA's
forums and jetson_stats report. Put on a daemon's PYTHONPATH by tests."""

from __future__ import annotations

from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return "Not Supported" if self.value == NVML_ERROR_NOT_SUPPORTED else "Unknown Error"


def _not_supported(*args: Any) -> Any:
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlInit() -> None: ...
def nvmlShutdown() -> None: ...
def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return f"handle{index}"


def nvmlDeviceGetName(handle: str) -> str:
    return "Orin (nvgpu)"


def nvmlDeviceGetUUID(handle: str) -> str:
    return "GPU-00000000-0000-0000-0000-000000000000"


nvmlDeviceGetPowerUsage = _not_supported
nvmlDeviceGetTotalEnergyConsumption = _not_supported
nvmlDeviceGetUtilizationRates = _not_supported
nvmlDeviceGetMemoryInfo = _not_supported
nvmlDeviceGetTemperature = _not_supported
nvmlDeviceGetComputeRunningProcesses = _not_supported
nvmlDeviceGetGraphicsRunningProcesses = _not_supported
nvmlDeviceGetProcessUtilization = _not_supported
