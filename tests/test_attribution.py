"""The attribution model: exact cases, and its invariants under random traces."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewatt.core.power.attribution import (
    Attribution,
    Baseline,
    PassEnergy,
    Usage,
    rail_weights,
    split,
)


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
