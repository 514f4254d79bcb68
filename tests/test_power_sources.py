"""Power sources against trees laid out like the real kernel's, and a stand-in NVML."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core import options as opt
from edgewatt.core import power
from edgewatt.core.power import ina3221, nvml, rapl, tegra_gpu
from edgewatt.core.power.source import SOURCE_NAMES, NoData, PowerOptions


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def options(sysfs: Path, **kw: Any) -> PowerOptions:
    return PowerOptions(sysfs_path=str(sysfs), tegrastats_path=str(sysfs / "none"), **kw)


# Jetson Nano, JetPack 4: the ina3221x IIO driver, powers in mW, 0-based channels.
NANO_IIO = {
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_0": "POM_5V_IN",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power0_input": "2830",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_current0_input": "566",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_voltage0_input": "5000",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_1": "POM_5V_GPU",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power1_input": "41",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_2": "POM_5V_CPU",
    "bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power2_input": "943",
}

# Orin Nano, JetPack 6: hwmon, bus mV x mA, 1-based; NC channel and in7 shunt sum.
ORIN_HWMON = {
    "class/hwmon/hwmon0/name": "thermal",
    "class/hwmon/hwmon3/name": "ina3221",
    "class/hwmon/hwmon3/in1_label": "VDD_IN",
    "class/hwmon/hwmon3/in1_input": "5064",
    "class/hwmon/hwmon3/curr1_input": "2464",
    "class/hwmon/hwmon3/in2_label": "VDD_CPU_GPU_CV",
    "class/hwmon/hwmon3/in2_input": "5072",
    "class/hwmon/hwmon3/curr2_input": "920",
    "class/hwmon/hwmon3/in3_label": "NC",
    "class/hwmon/hwmon3/in3_input": "0",
    "class/hwmon/hwmon3/curr3_input": "0",
    "class/hwmon/hwmon3/in7_label": "sum of shunt voltages",
    "class/hwmon/hwmon3/in7_input": "12",
}

# Thor: an INA3221 for the sub-rails and an INA238 (power in uW) for the input.
THOR = {
    "class/hwmon/hwmon1/name": "ina3221",
    "class/hwmon/hwmon1/in1_label": "VDD_GPU",
    "class/hwmon/hwmon1/in1_input": "0",
    "class/hwmon/hwmon1/curr1_input": "0",
    "class/hwmon/hwmon1/in2_label": "VDD_CPU_SOC_MSS",
    "class/hwmon/hwmon1/in2_input": "5000",
    "class/hwmon/hwmon1/curr2_input": "1107",
    "class/hwmon/hwmon1/in3_label": "VIN_SYS_5V0",
    "class/hwmon/hwmon1/in3_input": "5040",
    "class/hwmon/hwmon1/curr3_input": "1000",
    "class/hwmon/hwmon2/name": "ina238",
    "class/hwmon/hwmon2/in1_input": "19200",
    "class/hwmon/hwmon2/curr1_input": "875",
    "class/hwmon/hwmon2/power1_input": "16802000",
}


def rails(reading: Any) -> dict[str, float]:
    return {r.name: r.power_w for r in reading.rails}


def test_the_power_sources_key_knows_each_registered_source_in_order() -> None:
    # The key's parser sits below the sensors: it reads their names, not the registry,
    # and the registry takes each name's module's discover.
    assert tuple(power.SOURCES) == SOURCE_NAMES
    assert power.SOURCES["ina3221"] is ina3221.discover
    assert power.SOURCES["nvml"] is nvml.discover
    assert power.SOURCES["tegra_gpu"] is tegra_gpu.discover
    parse = opt.lookup(PowerOptions, "sources").parse
    assert parse("rapl, nvml") == ("rapl", "nvml")
    known = "ina3221, tegrastats, tegra_gpu, pi5, rapl, nvml, powermetrics$"
    with pytest.raises(ValueError, match="unknown power source 'ina'; known: " + known):
        parse("ina")


def test_nano_jetpack4_iio_layout(tmp_path: Path) -> None:
    write(tmp_path, NANO_IIO)
    reading = ina3221.discover(options(tmp_path)).read()
    assert rails(reading) == {"POM_5V_IN": 2.83, "POM_5V_GPU": 0.041, "POM_5V_CPU": 0.943}
    assert reading.total_w == 2.83
    assert {r.id for r in reading.rails} == {
        "ina3221:POM_5V_IN",
        "ina3221:POM_5V_GPU",
        "ina3221:POM_5V_CPU",
    }


def test_orin_hwmon_layout_skips_nc_and_shunt_sum(tmp_path: Path) -> None:
    write(tmp_path, ORIN_HWMON)
    reading = ina3221.discover(options(tmp_path)).read()
    assert rails(reading) == pytest.approx({"VDD_IN": 12.477696, "VDD_CPU_GPU_CV": 4.66624})
    assert reading.total_w == pytest.approx(12.477696)


def test_thor_ina238_input_in_microwatts(tmp_path: Path) -> None:
    write(tmp_path, THOR)
    reading = ina3221.discover(options(tmp_path)).read()
    assert rails(reading) == pytest.approx(
        {"VDD_GPU": 0.0, "VDD_CPU_SOC_MSS": 5.535, "VIN_SYS_5V0": 5.04, "VIN": 16.802}
    )
    assert reading.total_w == pytest.approx(16.802)  # VIN, not the sum of the rails


def test_hwmon_numbers_do_not_matter(tmp_path: Path) -> None:
    renumbered = {k.replace("hwmon3", "hwmon9"): v for k, v in ORIN_HWMON.items()}
    write(tmp_path, renumbered)
    assert "VDD_IN" in rails(ina3221.discover(options(tmp_path)).read())


def test_no_monitor_is_no_data(tmp_path: Path) -> None:
    write(tmp_path, {"class/hwmon/hwmon0/name": "coretemp"})
    with pytest.raises(NoData, match="no INA3221/INA238 power monitor"):
        ina3221.discover(options(tmp_path))


# -- RAPL ------------------------------------------------------------------------


def rapl_tree(root: Path, package_uj: int, dram_uj: int, psys_uj: int | None = None) -> None:
    files = {
        "class/powercap/intel-rapl:0/name": "package-0",
        "class/powercap/intel-rapl:0/energy_uj": str(package_uj),
        "class/powercap/intel-rapl:0/max_energy_range_uj": "262143328850",
        "class/powercap/intel-rapl:0:0/name": "core",
        "class/powercap/intel-rapl:0:0/energy_uj": "1000",
        "class/powercap/intel-rapl:0:0/max_energy_range_uj": "262143328850",
        "class/powercap/intel-rapl:0:1/name": "dram",
        "class/powercap/intel-rapl:0:1/energy_uj": str(dram_uj),
        "class/powercap/intel-rapl:0:1/max_energy_range_uj": "65712999613",
    }
    if psys_uj is not None:
        files["class/powercap/intel-rapl:1/name"] = "psys"
        files["class/powercap/intel-rapl:1/energy_uj"] = str(psys_uj)
        files["class/powercap/intel-rapl:1/max_energy_range_uj"] = "262143328850"
    write(root, files)


def test_rapl_counters_wrap_around(tmp_path: Path) -> None:
    rapl_tree(tmp_path, package_uj=262143328850 - 1_000_000, dram_uj=5_000_000)
    source = rapl.discover(options(tmp_path))
    # 3 J later the package counter has wrapped past its range; dram gained 0.5 J.
    rapl_tree(tmp_path, package_uj=1_999_999, dram_uj=5_500_000)
    reading = source.read()
    energy = {r.name: r.energy_j for r in reading.rails}
    assert energy["package-0"] == pytest.approx(3.0)
    assert energy["intel-rapl:0:1 dram"] == pytest.approx(0.5)
    assert reading.total_energy_j == pytest.approx(3.5)  # package + dram
    assert {r.type for r in reading.rails} == {"cpu", "memory"}


def test_rapl_psys_is_the_platform_total(tmp_path: Path) -> None:
    rapl_tree(tmp_path, package_uj=0, dram_uj=0, psys_uj=10_000_000)
    source = rapl.discover(options(tmp_path))
    rapl_tree(tmp_path, package_uj=2_000_000, dram_uj=1_000_000, psys_uj=17_000_000)
    assert source.read().total_energy_j == pytest.approx(7.0)


def test_no_rapl_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData, match="no RAPL zones"):
        rapl.discover(options(tmp_path))


# -- NVML ------------------------------------------------------------------------


class FakeNvml(types.ModuleType):
    """The calls and units of nvidia-ml-py's pynvml, for one GPU with two processes."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.energy_mj = 1_000_000
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"handle{i}"

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return "GPU-1234"

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 245_500  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        return self.energy_mj

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return types.SimpleNamespace(gpu=80, memory=30)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return types.SimpleNamespace(total=150_000_000_000, used=20_000_000_000, free=0)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 41

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [types.SimpleNamespace(pid=100, usedGpuMemory=8_000_000_000)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[Any]:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetProcessUtilization(self, h: str, last_seen: int) -> list[Any]:
        return [
            types.SimpleNamespace(
                pid=100, timeStamp=10, smUtil=50, memUtil=1, encUtil=0, decUtil=0
            ),
            types.SimpleNamespace(
                pid=100, timeStamp=20, smUtil=60, memUtil=1, encUtil=0, decUtil=0
            ),
            types.SimpleNamespace(
                pid=200, timeStamp=20, smUtil=20, memUtil=1, encUtil=0, decUtil=0
            ),
        ]


def test_nvml_gpu_power_energy_and_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = nvml.discover(options(tmp_path))
    fake.energy_mj += 2_500  # 2.5 J spent since discovery
    reading = source.read()
    (gpu,) = reading.gpus
    assert (gpu.id, gpu.name, gpu.utilization) == ("nvml:GPU-1234", "NVIDIA H200", 0.8)
    assert gpu.power_w == 245.5 and gpu.energy_j == 2.5
    assert gpu.memory_used_bytes == 20_000_000_000
    assert gpu.processes[100].utilization == 0.6  # the latest sample wins
    assert gpu.processes[100].memory_bytes == 8_000_000_000
    assert gpu.processes[200].memory_bytes is None
    assert reading.total_w == 245.5 and reading.total_energy_j == 2.5
    assert reading.temperatures_c == {"GPU 0": 41.0}
    source.close()
    assert fake.shut


def test_real_pynvml_reads_gpus_or_says_there_is_no_driver(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    try:
        source = nvml.discover(options(tmp_path))
    except NoData as exc:
        assert "no NVIDIA driver" in str(exc)  # this machine: no GPU, no driver
        return
    try:  # a machine with a GPU: the real library's figures
        reading = source.read()
        assert reading.gpus and all(g.power_w is None or g.power_w > 0 for g in reading.gpus)
    finally:
        source.close()


def test_without_the_driver_library_pynvml_is_not_imported() -> None:
    """No driver here: discovery says so from the library's absence, without importing
    nvidia-ml-py's pynvml (8 ms of a first in-process registration); where the driver
    is (a GPU machine), the test above reads it."""
    pytest.importorskip("pynvml")
    code = (
        "import sys\n"
        "from edgewatt.core.power import nvml\n"
        "from edgewatt.core.power.source import NoData, PowerOptions\n"
        "try:\n"
        "    nvml.discover(PowerOptions())\n"
        "except NoData as exc:\n"
        "    print(exc, 'pynvml' in sys.modules, 'ctypes' in sys.modules)\n"
        "else:\n"
        "    print('found')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    if out.stdout.strip() == "found":
        pytest.skip("an NVIDIA driver is here")
    # Nor ctypes (2 ms): the linker's cache tells.
    assert out.stdout.strip() == "no NVIDIA driver: libnvidia-ml.so.1 not found False False"


def test_a_library_is_found_where_the_dynamic_linker_would_find_it(tmp_path: Path) -> None:
    """LD_LIBRARY_PATH's folders, then the linker's cache (NUL-ended names); None where
    the cache cannot be read."""
    from edgewatt.core.power.nvml import library_found

    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"glibc-ld.so.cache1.1\0libnvidia-ml.so.1\0/usr/lib/libnvidia-ml.so.1\0")
    name = "libnvidia-ml.so.1"
    assert library_found(name, str(cache), {}) is True
    assert library_found("libnvidia-ml.so", str(cache), {}) is False  # a name, not a prefix
    assert library_found(name, str(tmp_path / "none"), {}) is None
    folder = tmp_path / "lib"
    folder.mkdir()
    (folder / name).write_bytes(b"")
    environ = {"LD_LIBRARY_PATH": f"/nonexistent::{folder}"}
    assert library_found(name, str(tmp_path / "none"), environ) is True


# -- discovery ---------------------------------------------------------------------


def test_ina3221_is_preferred_over_tegrastats(tmp_path: Path) -> None:
    write(tmp_path, ORIN_HWMON)
    stand_in = Path(__file__).parent / "bin" / "tegrastats"
    found = power.discover(PowerOptions(sysfs_path=str(tmp_path), tegrastats_path=str(stand_in)))
    try:
        assert [s.name for s in found][:1] == ["ina3221"]
        assert "tegrastats" not in [s.name for s in found]
    finally:
        for s in found:
            s.close()
    forced = power.discover(
        PowerOptions(
            sysfs_path=str(tmp_path), tegrastats_path=str(stand_in), sources=("tegrastats",)
        )
    )
    try:
        assert [s.name for s in forced] == ["tegrastats"]
    finally:
        for s in forced:
            s.close()


# The GPU's load in per mille, where nvgpu puts it.
NANO_GPU_LOAD = {"devices/gpu.0/load": "523"}  # JetPack 4 and 5 (Nano, TX2, Xavier)
ORIN_GPU_LOAD = {  # JetPack 6: the GPU's devfreq device
    "class/devfreq/15a50000.nvdla/device/load": "999",  # not the GPU: never read
    "class/devfreq/17000000.gpu/device/load": "0",
}


@pytest.mark.parametrize(
    ("tree", "busy"), [(NANO_GPU_LOAD, 0.523), (ORIN_GPU_LOAD, 0.0)], ids=["nano", "orin"]
)
def test_the_jetson_gpu_load_file(tmp_path: Path, tree: dict[str, str], busy: float) -> None:
    write(tmp_path, tree)
    source = tegra_gpu.discover(options(tmp_path))
    try:
        reading = source.read()
        assert reading.total_w is None and reading.rails == ()  # never the device's total
        (gpu,) = reading.gpus
        assert (gpu.id, gpu.utilization) == ("tegra_gpu:GPU", busy)
        (tmp_path / next(iter(tree))).write_text("1000\n")  # read anew each time
        if tree is NANO_GPU_LOAD:
            assert source.read().gpus[0].utilization == 1.0
    finally:
        source.close()


def test_a_gpu_load_that_is_not_one_is_no_data(tmp_path: Path) -> None:
    write(tmp_path, {"devices/gpu.0/load": "-5"})
    with pytest.raises(NoData, match="not a GPU load in per mille"):
        tegra_gpu.discover(options(tmp_path))
    with pytest.raises(NoData, match="no Jetson GPU load file"):
        tegra_gpu.discover(options(tmp_path / "elsewhere"))


def test_the_gpu_load_is_read_beside_the_ina3221s_only(tmp_path: Path) -> None:
    write(tmp_path, {**ORIN_HWMON, **ORIN_GPU_LOAD})
    found = power.discover(options(tmp_path))
    try:
        assert [s.name for s in found][:2] == ["ina3221", "tegra_gpu"]
    finally:
        for s in found:
            s.close()
    alone = tmp_path / "no-monitors"
    write(alone, ORIN_GPU_LOAD)  # no board monitor: no load without a device total
    assert "tegra_gpu" not in [s.name for s in power.discover(options(alone))]
