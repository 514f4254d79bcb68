"""The attribution model: exact cases, and its invariants under random traces."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewatt.core.power.attribution import (
    Attribution,
    Baseline,
    PassEnergy,
    PassInputs,
    TargetUse,
    Usage,
    accounted,
    gpu_busy,
    gpu_totals,
    gpu_use,
    rail_weights,
    split,
)
from edgewatt.core.power.source import Gpu, GpuProcess
from edgewatt.core.power.values import PowerSnapshot, RailState


def test_dynamic_power_split_by_cpu_share() -> None:
    # 10 W for 2 s with 4 W idle: 12 J above idle. The host was busy 1.5 CPU-s,
    # target a used 1.0 and b 0.25 of it; the rest (0.25) was unregistered work.
    measured = PassEnergy(seconds=2.0, device_j=20.0, host_busy_cpu_s=1.5)
    got = split(measured, 4.0, {}, {"a": Usage(1.0), "b": Usage(0.25)})
    assert got == pytest.approx({"a": 8.0, "b": 2.0})


def test_targets_busier_than_the_host_reading_share_everything() -> None:
    # Per-process and host CPU counters are read at slightly different instants.
    measured = PassEnergy(seconds=1.0, device_j=10.0, host_busy_cpu_s=0.5)
    got = split(measured, 0.0, {}, {"a": Usage(0.6), "b": Usage(0.6)})
    assert got == pytest.approx({"a": 5.0, "b": 5.0})


def test_gpu_energy_goes_to_gpu_users() -> None:
    # 300 J in 1 s, idle 100 W; the GPU drew 150 J with 50 W idle: 100 J GPU dynamic.
    measured = PassEnergy(
        seconds=1.0, device_j=300.0, host_busy_cpu_s=1.0, gpu_j={"g": 150.0}, gpu_load={"g": 0.8}
    )
    usage = {"trainer": Usage(0.5, {"g": 0.6}), "logger": Usage(0.5, {"g": 0.0})}
    got = split(measured, 100.0, {"g": 50.0}, usage)
    # CPU part 100 J split evenly; GPU part 100 J: trainer 0.6 of 0.8 load.
    assert got == pytest.approx({"trainer": 50.0 + 75.0, "logger": 50.0})


def test_the_gpu_rail_weights_its_holders_by_cpu_time_equally_at_none() -> None:
    # By CPU time while any holder counted some; a holder at 0 then gets none.
    assert rail_weights({"a": 0.02, "b": 0.0}) == {"a": 0.02, "b": 0.0}
    # Every holder at 0 ticks (waiting on the GPU): equal shares, not no one's.
    assert rail_weights({"a": 0.0, "b": 0.0}) == {"a": 1.0, "b": 1.0}
    assert rail_weights({}) == {}


def test_below_idle_nothing_is_attributed() -> None:
    measured = PassEnergy(seconds=1.0, device_j=3.0, host_busy_cpu_s=1.0)
    assert split(measured, 4.0, {}, {"a": Usage(1.0)}) == {"a": 0.0}


def test_baseline_is_the_sliding_minimum() -> None:
    b = Baseline(None, window_s=10.0)
    assert [b.observe(t, w) for t, w in [(0, 6.0), (1, 5.0), (2, 7.0), (12, 8.0), (13, 9.0)]] == [
        6.0,
        5.0,
        5.0,
        7.0,  # 5.0 (t=1) left the window
        8.0,
    ]
    assert Baseline(4.2, 10.0).observe(0, 1.0) == 4.2


def test_the_baseline_in_use_is_the_configured_or_the_window_minimum() -> None:
    assert Baseline(4.2, 10.0).value == 4.2
    b = Baseline(None, window_s=10.0)
    assert b.value is None  # nothing seen yet
    b.observe(0, 5.0)
    b.observe(1, 6.0)  # kept behind 5.0: the minimum once 5.0 leaves the window
    assert b.value == 5.0
    # A reading exactly window_s old is still in the window; one older has left it.
    assert b.observe(10, 7.0) == 5.0
    assert b.observe(10.5, 7.0) == 6.0
    assert b.value == 6.0


def test_split_exact_across_cpu_and_two_gpus() -> None:
    # 100 J in 2 s, idle 10 W: 80 J above idle. GPU g1 drew 30 J above its 5 W idle
    # (20 J dynamic); g2, whose idle is not known yet, 12 J (all dynamic). The GPU
    # part is 32 J, the CPU part 48 J.
    measured = PassEnergy(
        seconds=2.0,
        device_j=100.0,
        host_busy_cpu_s=0.5,
        gpu_j={"g1": 30.0, "g2": 12.0},
        gpu_load={"g1": 0.5, "g2": 0.8},
    )
    usage = {
        "a": Usage(0.5, {"g1": 0.25}),
        "b": Usage(0.25, {"g2": 0.4, "g1": 0.0}),
        # A counter read backwards gives nothing and takes nothing from the others.
        "c": Usage(-0.1, {"g2": -0.2}),
    }
    got = split(measured, 10.0, {"g1": 5.0}, usage)
    # CPU: the targets' 0.75 CPU-s exceed the host's 0.5, so they share all 48 J.
    # g1: a holds 0.25 of its 0.5 load (half of 20 J); g2: b holds 0.4 of 0.8 (half of 12).
    assert got == pytest.approx({"a": 32.0 + 10.0, "b": 16.0 + 6.0, "c": 0.0}, rel=1e-12)


def test_a_gpu_at_its_idle_leaves_all_of_the_dynamic_energy_to_cpu_time() -> None:
    # The GPU drew 8 J in 2 s, its idle 4 W: none above idle, so its holder gets no GPU
    # share; the 20 J above the device's 5 W idle all go by CPU time.
    measured = PassEnergy(seconds=2.0, device_j=30.0, host_busy_cpu_s=1.0, gpu_j={"g": 8.0})
    usage = {"cpu": Usage(1.0), "gpu": Usage(0.0, {"g": 1.0})}
    assert split(measured, 5.0, {"g": 4.0}, usage) == {"cpu": 20.0, "gpu": 0.0}


def test_a_gpu_below_a_joule_above_its_idle_still_goes_to_its_users() -> None:
    # g1 at its idle (listed first) is skipped; g2's 0.5 J above idle go to its user
    # by load: 0.25 of the GPU's 0.5 (the other half was no target's).
    measured = PassEnergy(
        seconds=1.0,
        device_j=10.0,
        host_busy_cpu_s=1.0,
        gpu_j={"g1": 2.0, "g2": 0.5},
        gpu_load={"g1": 0.5, "g2": 0.5},
    )
    usage = {"cpu": Usage(1.0), "gpu": Usage(0.0, {"g1": 0.5, "g2": 0.25})}
    got = split(measured, 4.0, {"g1": 2.0, "g2": 0.0}, usage)
    assert got == {"cpu": 5.5, "gpu": 0.25}


def test_shares_rounded_above_a_small_dynamic_energy_are_brought_back_under_it() -> None:
    # 0.49 J shared 1:7:1 adds up, in floats, to 0.49000000000000005: scaled back, the
    # targets never get more than was measured above idle.
    measured = PassEnergy(seconds=1.0, device_j=0.49, host_busy_cpu_s=0.0)
    got = split(measured, 0.0, {}, {"a": Usage(0.1), "b": Usage(0.7), "c": Usage(0.1)})
    assert math.fsum(got.values()) <= 0.49
    assert got == pytest.approx({"a": 0.49 / 9, "b": 0.49 * 7 / 9, "c": 0.49 / 9}, rel=1e-12)


def test_a_gpu_with_no_load_reported_goes_to_its_users_by_their_loads() -> None:
    # No GPU load measured (gpu_load empty): the users' own loads are the whole.
    measured = PassEnergy(seconds=1.0, device_j=10.0, host_busy_cpu_s=0.0, gpu_j={"g": 6.0})
    usage = {"a": Usage(0.0, {"g": 0.3}), "b": Usage(0.0, {"g": 0.1})}
    assert split(measured, 4.0, {"g": 0.0}, usage) == pytest.approx({"a": 4.5, "b": 1.5})


def test_an_empty_pass_attributes_nothing() -> None:
    # A pass of no length (two edges at one instant): its energy is no one's.
    measured = PassEnergy(seconds=0.0, device_j=5.0, host_busy_cpu_s=1.0)
    assert split(measured, 0.0, {}, {"a": Usage(1.0)}) == {"a": 0.0}
    assert split(PassEnergy(1.0, 5.0, 1.0), 0.0, {}, {}) == {}


def test_the_parts_of_a_pass_are_exact() -> None:
    measured = PassEnergy(seconds=2.0, device_j=30.0, host_busy_cpu_s=1.0)
    assert accounted(measured, 4.0, {"a": 10.0, "b": 5.0}) == {
        "attributed": 15.0,
        "idle": 8.0,
        "unattributed": 7.0,
    }
    # Idle above what was measured: all of it idle, nothing left to attribute.
    assert accounted(measured, 20.0, {"a": 10.0}) == {
        "attributed": 0.0,
        "idle": 30.0,
        "unattributed": 0.0,
    }
    # Shares above what is left after idle are capped to it.
    assert accounted(measured, 4.0, {"a": 25.0}) == {
        "attributed": 22.0,
        "idle": 8.0,
        "unattributed": 0.0,
    }
    # A counter read backwards measures nothing; a negative idle is none.
    backwards = PassEnergy(seconds=2.0, device_j=-3.0, host_busy_cpu_s=1.0)
    assert accounted(backwards, 4.0, {}) == {"attributed": 0.0, "idle": 0.0, "unattributed": 0.0}
    assert accounted(measured, -1.0, {}) == {"attributed": 0.0, "idle": 0.0, "unattributed": 30.0}


def test_attribution_across_passes_with_estimated_idles() -> None:
    model = Attribution(None, window_s=600.0)
    # First pass: 5 W device, GPU 2 W; each is its own idle: nothing above it.
    first = PassEnergy(2.0, 10.0, 1.0, gpu_j={"g": 4.0}, gpu_load={"g": 0.5})
    model.update(2.0, first, {"a": Usage(1.0), "b": Usage(0.0, {"g": 0.5})})
    assert model.energy_j == {"a": 0.0, "b": 0.0}
    assert model.idle_w_in_use == 5.0
    # Second: 15 W (20 J above idle), GPU 5 W (6 J above its 2 W idle): b holds all
    # of the GPU's load, a all of the host's CPU time.
    second = PassEnergy(2.0, 30.0, 1.0, gpu_j={"g": 10.0}, gpu_load={"g": 0.5})
    model.update(4.0, second, {"a": Usage(1.0), "b": Usage(0.0, {"g": 0.5})})
    assert model.energy_j == {"a": 14.0, "b": 6.0}
    assert model.power_w == {"a": 7.0, "b": 3.0}
    assert model.parts_j == {"attributed": 20.0, "idle": 20.0, "unattributed": 0.0}
    # A pass of no length changes nothing.
    model.update(4.0, PassEnergy(0.0, 3.0, 1.0), {"a": Usage(1.0)})
    assert model.energy_j == {"a": 14.0, "b": 6.0}
    assert model.parts_j == {"attributed": 20.0, "idle": 20.0, "unattributed": 0.0}
    # Counters add up; power is the last pass's.
    model.update(5.0, PassEnergy(1.0, 9.0, 2.0), {"a": Usage(1.0)})
    assert model.energy_j == {"a": 16.0, "b": 6.0}
    assert model.power_w == {"a": 2.0, "b": 3.0}
    assert model.parts_j == {"attributed": 22.0, "idle": 25.0, "unattributed": 2.0}
    model.forget("a")
    assert model.energy_j == {"b": 6.0} and model.power_w == {"b": 3.0}
    model.forget("gone")  # an unknown target: nothing to forget


def test_a_reload_sets_the_idle_and_its_window() -> None:
    model = Attribution(None, window_s=600.0)
    model.update(1.0, PassEnergy(1.0, 4.0, 1.0, gpu_j={"g": 1.0}), {"a": Usage(1.0)})
    model.update(5.0, PassEnergy(1.0, 6.0, 1.0, gpu_j={"g": 3.0}), {"a": Usage(1.0)})
    assert model.idle_w_in_use == 4.0
    model.set_idle(3.0)
    assert (model.idle_w, model.idle_w_in_use) == (3.0, 3.0)
    model.set_idle(None)  # estimated again: the lowest seen
    assert (model.idle_w, model.idle_w_in_use) == (None, 4.0)
    # A 2 s window: at t=6 the 4 W of t=1 and the GPU's 1 W have left it.
    model.set_window(2.0)
    assert model.window_s == 2.0
    unattributed = model.parts_j["unattributed"]
    model.update(6.0, PassEnergy(1.0, 7.0, 1.0, gpu_j={"g": 3.0}), {"b": Usage(0.0, {"g": 1.0})})
    assert model.idle_w_in_use == 6.0
    # The GPU's idle is now its 3 W of t=5: nothing above it; the device's 1 J above
    # idle goes by CPU time, and b used none.
    assert model.energy_j["b"] == 0.0
    assert model.parts_j["unattributed"] == unattributed + 1.0


def rail(rail_id: str, source: str, energy_j: float | None, name: str = "") -> RailState:
    return RailState(rail_id, name or rail_id, "gpu", source, None, energy_j)


def snapshot(
    at: float | None,
    device_j: float | None,
    rails: tuple[RailState, ...] = (),
    gpus: tuple[Gpu, ...] = (),
) -> PowerSnapshot:
    return PowerSnapshot(
        host_power_w=None, host_energy_j=device_j, rails=rails, gpus=gpus, measured_at=at
    )


def test_pass_inputs_share_what_a_new_reading_measured() -> None:
    inputs = PassInputs(lambda pid: False)
    used = {"a": TargetUse(cpu_s=0.3, pids=(10, 11)), "b": TargetUse(cpu_s=0.1, pids=(20,))}

    def gpu(load: float | None, energy: float) -> Gpu:
        procs = {11: GpuProcess(0.25, 100), 20: GpuProcess(None, None), 99: GpuProcess(0.5, 7)}
        return Gpu(id="nvml:0", name="GPU", utilization=load, energy_j=energy, processes=procs)

    def reading(at: float | None, device_j: float, gpu_j: float, load: float | None) -> Any:
        rails = (rail("nvml:0", "nvml", gpu_j), rail("rapl:pkg", "rapl", 1.0))
        return snapshot(at, device_j, rails, (gpu(load, gpu_j),))

    # No reading, or none of the device's energy: nothing to share, nothing kept.
    assert inputs.measure(1.0, None, 1.0, used) is None
    assert inputs.measure(1.0, snapshot(1.0, None), 1.0, used) is None
    # The first reading is only the start of the first pass.
    assert inputs.measure(1.0, reading(1.0, 100.0, 40.0, 0.5), 1.0, used) is None
    # No new reading since (the same instant, or an earlier one): nothing new.
    assert inputs.measure(2.0, reading(1.0, 120.0, 50.0, 0.5), 1.0, used) is None
    assert inputs.measure(2.0, reading(0.5, 120.0, 50.0, 0.5), 1.0, used) is None
    got = inputs.measure(3.0, reading(2.5, 130.0, 46.0, None), 0.8, used)
    assert got is not None
    at, measured, usage = got
    assert at == 2.5
    # The GPU's load unknown reads 0; a rail that is no GPU's is not one.
    assert measured == PassEnergy(1.5, 30.0, 0.8, gpu_j={"nvml:0": 6.0}, gpu_load={"nvml:0": 0.0})
    assert usage == {"a": Usage(0.3, {"nvml:0": 0.25}), "b": Usage(0.1, {"nvml:0": 0.0})}
    # A reading with no instant is taken at the pass's; the device counter read lower
    # (a reset) measures 0, and a GPU first seen has no energy before it.
    rails = (rail("nvml:1", "nvml", 9.0),)
    gpus = (Gpu(id="nvml:1", name="GPU", utilization=0.5),)
    got = inputs.measure(4.0, snapshot(None, 125.0, rails, gpus), 1.0, used)
    assert got is not None
    assert got[:2] == (4.0, PassEnergy(1.5, 0.0, 1.0, {"nvml:1": 0.0}, {"nvml:1": 0.5}))
    # Without the host's CPU time nothing is shared, but the reading starts the next pass.
    assert inputs.measure(5.0, snapshot(5.0, 127.0), None, used) is None
    got = inputs.measure(6.0, snapshot(6.0, 128.0), 1.0, used)
    assert got is not None and got[:2] == (6.0, PassEnergy(1.0, 1.0, 1.0))


def board(gr3d: float | None, device_j: float, gpu_j: float, at: float) -> PowerSnapshot:
    """A Jetson's reading: its GPU-only rail, a rail shared with the CPU, GR3D's load."""
    rails = (
        rail("ina3221:VDD_GPU", "ina3221", gpu_j, "VDD_GPU"),
        rail("ina3221:VDD_CPU_GPU_CV", "ina3221", 50.0 + gpu_j, "VDD_CPU_GPU_CV"),
        rail("rapl:GPU", "rapl", 3.0, "GPU"),  # a GPU rail, but not a board's
    )
    return snapshot(at, device_j, rails, (Gpu(id="tegra_gpu:GPU", name="GPU", utilization=gr3d),))


def test_the_board_gpu_rail_goes_to_its_holders_by_cpu_time_while_gr3d_is_busy() -> None:
    scans: list[int] = []

    def holds_gpu(pid: int) -> bool:
        scans.append(pid)
        return pid in (10, 30)

    inputs = PassInputs(holds_gpu)
    used = {
        "a": TargetUse(cpu_s=0.3, pids=(10, 11)),
        "b": TargetUse(cpu_s=0.2, pids=(20,)),
        "c": TargetUse(cpu_s=0.1, pids=(30,)),
    }
    assert inputs.measure(1.0, board(0.5, 10.0, 1.0, 1.0), 1.0, used) is None
    got = inputs.measure(2.0, board(0.5, 20.0, 4.0, 2.0), 1.0, used)
    assert got is not None
    _, measured, usage = got
    assert measured.gpu_j == {"ina3221:VDD_GPU": 3.0}
    assert measured.gpu_load == {}
    rail_id = "ina3221:VDD_GPU"
    assert usage == {
        "a": Usage(0.3, {rail_id: 0.3}),
        "b": Usage(0.2, {}),
        "c": Usage(0.1, {rail_id: 0.1}),
    }
    assert scans == [10, 11, 20, 30]
    # A pid found holding a GPU is not scanned again; the others are. c's member left:
    # it is forgotten, and scanned again when it comes back.
    without_c = {t: used[t] for t in ("a", "b")}
    got = inputs.measure(3.0, board(0.5, 30.0, 6.0, 3.0), 1.0, without_c)
    assert got is not None and got[2] == {"a": Usage(0.3, {rail_id: 0.3}), "b": Usage(0.2, {})}
    assert scans == [10, 11, 20, 30, 11, 20]
    # GR3D at 0: the rail's dynamic part is no holder's (and no one is scanned).
    got = inputs.measure(4.0, board(0.0, 40.0, 8.0, 4.0), 1.0, used)
    assert got is not None
    assert got[2] == {"a": Usage(0.3, {}), "b": Usage(0.2, {}), "c": Usage(0.1, {})}
    # GR3D unknown: taken for busy.
    used["c"] = TargetUse(0.0, (30,))
    got = inputs.measure(5.0, board(None, 50.0, 9.0, 5.0), 1.0, used)
    assert got is not None
    assert got[2]["a"] == Usage(0.3, {rail_id: 0.3})
    assert got[2]["c"] == Usage(0.0, {rail_id: 0.0})
    assert scans == [10, 11, 20, 30, 11, 20, 11, 20, 30]


def test_a_targets_gpu_figures_sum_its_processes_on_each_gpu() -> None:
    per_process = Gpu(
        id="nvml:0",
        name="GPU",
        utilization=0.9,
        processes={
            1: GpuProcess(0.25, 2**20),
            2: GpuProcess(0.5, None),
            3: GpuProcess(None, 3 * 2**20),
            4: GpuProcess(0.125, 5),
        },
    )
    other = Gpu(id="nvml:1", name="GPU", utilization=0.2, processes={4: GpuProcess(0.75, None)})
    silent = Gpu(id="tegra_gpu:GPU", name="GPU", utilization=0.4)  # no per-process figures
    power = snapshot(1.0, 0.0, gpus=(per_process, silent, other))
    assert gpu_use(power, (1, 2, 3)) == [(per_process, 0.75, 4 * 2**20), (other, 0.0, None)]
    assert gpu_use(power, (2, 4)) == [(per_process, 0.625, 5), (other, 0.75, None)]
    assert gpu_totals(power, (1, 3, 4)) == (1.125, 4 * 2**20 + 5)
    assert gpu_totals(power, (2,)) == (0.5, 0)  # a load, no memory reported
    assert gpu_totals(power, (8,)) == (0.0, 0)
    assert gpu_totals(snapshot(1.0, 0.0, gpus=(silent,)), (1,)) == (None, None)
    assert gpu_totals(None, (1,)) == (None, None)


def test_the_board_gpu_is_busy_while_gr3d_reads_above_zero_or_is_unknown() -> None:
    def gpus(*loads: tuple[str, float | None]) -> PowerSnapshot:
        return snapshot(
            1.0, 0.0, gpus=tuple(Gpu(id=i, name="GPU", utilization=u) for i, u in loads)
        )

    assert gpu_busy(gpus(("tegra_gpu:GPU", 0.0), ("nvml:0", 0.9))) is False
    assert gpu_busy(gpus(("tegra_gpu:GPU", 0.0), ("tegrastats:GR3D", 0.01))) is True
    assert gpu_busy(gpus(("tegrastats:GR3D", None), ("tegra_gpu:GPU", 0.0))) is False
    assert gpu_busy(gpus(("tegrastats:GR3D", None))) is True
    assert gpu_busy(gpus()) is True


passes = st.lists(
    st.tuples(
        st.floats(0.05, 5.0),  # seconds
        st.floats(0.0, 60.0),  # average device watts
        st.floats(0.0, 8.0),  # host busy CPU-s per second
        st.lists(st.floats(0.0, 2.0), min_size=1, max_size=6),  # targets' CPU-s per second
        st.floats(0.0, 40.0),  # GPU watts
        st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),  # targets' GPU load
    ),
    min_size=1,
    max_size=40,
)


def pass_energy(
    seconds: float, watts: float, busy: float, cpus: list[float], gpu_w: float, loads: list[float]
) -> PassEnergy:
    """What one pass of a random trace measured: the device at ``watts``, the host busy
    ``busy`` CPU-s a second, one GPU at ``gpu_w`` loaded by the targets present."""
    return PassEnergy(
        seconds=seconds,
        device_j=watts * seconds,
        host_busy_cpu_s=busy * seconds,
        gpu_j={"g": gpu_w * seconds},
        gpu_load={"g": min(1.0, sum(loads[: len(cpus)]))},
    )


@settings(max_examples=300, deadline=None)
@given(passes, st.one_of(st.none(), st.floats(0.0, 30.0)))
def test_attributed_power_never_exceeds_device_power(trace, idle_w) -> None:
    model = Attribution(idle_w, window_s=600.0)
    t = 0.0
    energy_before: dict[str, float] = {}
    for seconds, watts, busy, cpus, gpu_w, loads in trace:
        t += seconds
        targets = {f"t{i}": Usage(c * seconds, {"g": loads[i]}) for i, c in enumerate(cpus)}
        measured = pass_energy(seconds, watts, busy, cpus, gpu_w, loads)
        model.update(t, measured, targets)
        attributed = math.fsum(model.power_w[k] for k in targets)
        assert attributed <= watts * (1 + 1e-9) + 1e-12
        assert all(v >= 0 for v in model.power_w.values())
        for k in targets:
            assert model.energy_j[k] >= energy_before.get(k, 0.0)
        energy_before = dict(model.energy_j)


@settings(max_examples=300, deadline=None)
@given(passes, st.one_of(st.none(), st.floats(0.0, 30.0)), st.booleans())
def test_every_measured_joule_is_attributed_idle_or_unattributed(trace, idle_w, holders) -> None:
    # Conservation, per pass and in total: measured = attributed + idle + unattributed,
    # each part >= 0; attributed is exactly what the targets were given. Targets come
    # and go (a different count each pass), the GPU used or not.
    model = Attribution(idle_w, window_s=600.0)
    t, measured_total = 0.0, 0.0
    for seconds, watts, busy, cpus, gpu_w, loads in trace:
        t += seconds
        targets = {
            f"t{i}": Usage(c * seconds, {"g": loads[i]} if holders else {})
            for i, c in enumerate(cpus)
        }
        before = dict(model.parts_j)
        given_before = math.fsum(model.energy_j.values())
        measured = pass_energy(seconds, watts, busy, cpus, gpu_w, loads)
        model.update(t, measured, targets)
        measured_total += watts * seconds
        step = {k: model.parts_j[k] - before[k] for k in before}
        assert all(v >= -1e-9 for v in step.values()), step
        assert math.fsum(step.values()) == pytest.approx(watts * seconds, rel=1e-9, abs=1e-9)
        handed_out = math.fsum(model.energy_j.values()) - given_before
        assert step["attributed"] == pytest.approx(handed_out, rel=1e-9, abs=1e-9)
    assert set(model.parts_j) == {"attributed", "idle", "unattributed"}
    assert math.fsum(model.parts_j.values()) == pytest.approx(measured_total, rel=1e-9, abs=1e-9)
