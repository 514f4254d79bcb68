"""NVIDIA GPUs through NVML (the optional ``edgewatt[nvidia]`` extra, nvidia-ml-py).

Per GPU: power (mW), the driver's total energy counter (mJ, Volta and newer), load,
memory, temperature, and per process (host pids) SM load and memory, which the
attribution model uses to give GPU power to the processes that spent it. A call the
GPU does not support leaves that figure absent.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from edgewatt.core.power.source import (
    CannotMeasure,
    Gpu,
    GpuProcess,
    NoData,
    PowerOptions,
    PowerReading,
    PullSource,
    Rail,
)

log = logging.getLogger(__name__)


class NvmlSource(PullSource):
    name = "nvml"
    board = False

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self.handles]
        self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
        self._energy_start = [
            self._try(nvml.nvmlDeviceGetTotalEnergyConsumption, h) for h in self.handles
        ]
        self._last_seen_us = [0] * count

    def _try(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def _processes(self, index: int, handle: Any) -> dict[int, GpuProcess]:
        memory: dict[int, int | None] = {}
        for getter in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            for p in self._try(getattr(self.nvml, getter), handle) or []:
                memory[p.pid] = p.usedGpuMemory
        load: dict[int, float] = {}
        samples = self._try(
            self.nvml.nvmlDeviceGetProcessUtilization, handle, self._last_seen_us[index]
        )
        for sample in sorted(samples or [], key=lambda s: s.timeStamp):
            load[sample.pid] = sample.smUtil / 100.0  # the latest sample per pid wins
            self._last_seen_us[index] = max(self._last_seen_us[index], sample.timeStamp)
        return {
            pid: GpuProcess(utilization=load.get(pid), memory_bytes=memory.get(pid))
            for pid in set(memory) | set(load)
        }

    def read(self) -> PowerReading:
        nvml = self.nvml
        now = time.monotonic()
        gpus, rails, temps = [], [], {}
        for i, handle in enumerate(self.handles):
            milliwatts = self._try(nvml.nvmlDeviceGetPowerUsage, handle)
            millijoules = self._try(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            start = self._energy_start[i]
            energy = (
                None if millijoules is None or start is None else (millijoules - start) / 1000.0
            )
            rates = self._try(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._try(nvml.nvmlDeviceGetMemoryInfo, handle)
            celsius = self._try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            gpu_id = f"nvml:{self.uuids[i]}"
            power = None if milliwatts is None else milliwatts / 1000.0
            rails.append(
                Rail(
                    id=gpu_id,
                    name=f"GPU {i} {self.names[i]}",
                    type="gpu",
                    power_w=power,
                    energy_j=energy,
                )
            )
            gpus.append(
                Gpu(
                    id=gpu_id,
                    name=self.names[i],
                    utilization=None if rates is None else rates.gpu / 100.0,
                    power_w=power,
                    energy_j=energy,
                    memory_used_bytes=None if memory is None else memory.used,
                    memory_total_bytes=None if memory is None else memory.total,
                    processes=self._processes(i, handle),
                )
            )
            if celsius is not None:
                temps[f"GPU {i}"] = float(celsius)
        powers = [g.power_w for g in gpus]
        energies = [g.energy_j for g in gpus]
        return PowerReading(
            source=self.name,
            monotonic=now,
            rails=tuple(rails),
            total_w=None if None in powers else sum(p for p in powers if p is not None),
            total_energy_j=None if None in energies else sum(e for e in energies if e is not None),
            gpus=tuple(gpus),
            temperatures_c=temps,
        )

    def refusal(self) -> str | None:
        """Why no GPU here measures (every one refusing both its power and its energy
        counter: a Tegra board's integrated GPU answers NVML_ERROR_NOT_SUPPORTED), or
        None where one does."""
        refused = []
        for handle in self.handles:
            for call in (
                self.nvml.nvmlDeviceGetPowerUsage,
                self.nvml.nvmlDeviceGetTotalEnergyConsumption,
            ):
                try:
                    call(handle)
                    return None
                except self.nvml.NVMLError as exc:
                    refused.append(str(exc))
        return ", ".join(sorted(set(refused)))

    def close(self) -> None:
        self._try(self.nvml.nvmlShutdown)


def _no_library() -> bool:
    """Whether the installed pynvml (nvidia-ml-py's, from a package directory) would
    find no driver library: a lookup in the linker's cache, where importing pynvml to
    learn it is 8 ms of the first in-process registration. A pynvml from elsewhere (a
    stand-in on the path) or one imported already answers for itself."""
    if not sys.platform.startswith("linux") or "pynvml" in sys.modules:
        return False
    spec = importlib.util.find_spec("pynvml")
    origin = spec.origin if spec is not None else None
    if origin is None or Path(origin).parent.name not in ("site-packages", "dist-packages"):
        return False
    found = library_found(NVML_LIBRARY)
    if found is not None:
        return not found
    import ctypes  # 2 ms to import: only where the linker's cache could not be read

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return True
    return False


# Where the dynamic linker looks after LD_LIBRARY_PATH and its cache (ld.so(8)).
LINKER_CACHE = "/etc/ld.so.cache"
LINKER_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def library_found(
    name: str, cache: str = LINKER_CACHE, environ: Mapping[str, str] = os.environ
) -> bool | None:
    """Whether dlopen would find the library ``name``: in LD_LIBRARY_PATH's folders,
    the linker's cache (each name there ends in a NUL) or its default folders; None
    where the cache cannot be read (then only dlopen can tell)."""
    folders = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if any(os.path.exists(os.path.join(d, name)) for d in (*folders, *LINKER_DIRS)):
        return True
    try:
        with open(cache, "rb") as f:
            return name.encode() + b"\0" in f.read()
    except OSError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# The driver's NVML library, as nvidia-ml-py's pynvml loads it on Linux.
NVML_LIBRARY = "libnvidia-ml.so.1"


def discover(options: PowerOptions) -> NvmlSource:
    if _no_library():
        raise NoData(f"no NVIDIA driver: {NVML_LIBRARY} not found")
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError as exc:
        raise NoData("NVML needs the nvidia extra: pip install 'edgewatt[nvidia]'") from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NoData(f"no NVIDIA driver: {exc}") from exc
    source = NvmlSource(nvml)
    if not source.handles:
        source.close()
        raise NoData("NVML found no GPU")
    refused = source.refusal()
    if refused is not None:
        source.close()
        names = ", ".join(source.names)
        raise CannotMeasure(f"NVML answers {refused!r} for the power and energy of {names}")
    return source
