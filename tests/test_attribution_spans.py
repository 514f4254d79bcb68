"""Attribution where an edge's pass reads only the targets that asked: a target not
read waits, and its share is over its own interval, from its last reading to its next."""

from __future__ import annotations

import math

import pytest

from edgewatt.core.power.attribution import Attribution, PassEnergy, Usage


def test_a_waiting_target_is_given_its_share_over_its_own_interval() -> None:
    # A regular pass, two edges at which only "asker" is read, then a regular pass:
    # "a" and "b" wait through the edges. Idle is configured (5 W), so each span's
    # dynamic energy is the sum of its passes'.
    model = Attribution(5.0, window_s=600.0)
    model.update(
        1.0, PassEnergy(1.0, 5.0, 0.0), {"asker": Usage(0.0), "a": Usage(0.0), "b": Usage(0.0)}
    )
    passes = [  # (seconds, device J, host busy CPU s, the asker's CPU s)
        (0.5, 10.0, 0.5, 0.25),
        (0.25, 2.5, 0.1, 0.05),
        (0.25, 4.0, 0.4, 0.1),
    ]
    t = 1.0
    for seconds, device_j, busy, mine in passes[:2]:  # the edges
        t += seconds
        model.update(t, PassEnergy(seconds, device_j, busy), {"asker": Usage(mine)}, ["a", "b"])
    assert model.energy_j["a"] == model.energy_j["b"] == 0.0
    seconds, device_j, busy, mine = passes[2]
    t += seconds
    # Over their 1 s (11.5 J above idle, the host busy 1.0 s): a and b spent 0.3 and
    # 0.2 s of CPU.
    model.update(
        t,
        PassEnergy(seconds, device_j, busy),
        {"asker": Usage(mine), "a": Usage(0.3), "b": Usage(0.2)},
    )
    # The reference: one pass over their whole interval.
    reference = Attribution(5.0, window_s=600.0)
    span = PassEnergy(
        seconds=math.fsum(p[0] for p in passes),
        device_j=math.fsum(p[1] for p in passes),
        host_busy_cpu_s=math.fsum(p[2] for p in passes),
    )
    reference.update(t, span, {"a": Usage(0.3), "b": Usage(0.2)})
    assert model.energy_j["a"] == pytest.approx(reference.energy_j["a"], rel=1e-12)
    assert model.energy_j["b"] == pytest.approx(reference.energy_j["b"], rel=1e-12)
    assert (model.energy_j["a"], model.energy_j["b"]) == pytest.approx((3.45, 2.3))
    assert model.power_w["a"] == pytest.approx(3.45)  # over its own 1 s
    # The asker's share at each of its readings, each over its own pass.
    asker = math.fsum((j - 5.0 * s) * c / b for s, j, b, c in passes)
    assert model.energy_j["asker"] == pytest.approx(asker)
    # Conservation: every joule measured is attributed, idle or unattributed, and the
    # attributed part is exactly what the targets were given.
    assert math.fsum(model.parts_j.values()) == pytest.approx(5.0 + sum(p[1] for p in passes))
    assert model.parts_j["attributed"] == pytest.approx(math.fsum(model.energy_j.values()))
    assert model.parts_j["idle"] == pytest.approx(10.0)
    assert min(model.parts_j.values()) >= 0.0


def test_a_target_read_in_a_pass_that_shared_nothing_begins_its_interval_anew() -> None:
    model = Attribution(5.0, window_s=600.0)
    model.update(1.0, PassEnergy(1.0, 5.0, 0.0), {"asker": Usage(0.0), "a": Usage(0.0)})
    model.update(1.5, PassEnergy(0.5, 10.0, 0.5), {"asker": Usage(0.5)}, ["a"])
    model.restart(["a"])  # read with no new power reading: its CPU so far is spent
    model.update(2.0, PassEnergy(0.5, 4.5, 0.5), {"asker": Usage(0.25), "a": Usage(0.25)})
    # "a" shares the last pass only, beside the asker: 2 J above idle, half its CPU.
    assert model.energy_j["a"] == pytest.approx(1.0)
    assert model.power_w["a"] == pytest.approx(2.0)


def test_a_waiting_target_is_never_given_more_than_its_span_left_unattributed() -> None:
    """The asker, read at the edge, took the whole of a pass of 10 J for its 1 s of the
    host's 1 s of CPU; the waiting target then ran 1 s in a pass that drew nothing
    above idle. Over its span the ratio of sums asks 5 J (1 of 2 CPU seconds, 10 J),
    but its passes left nothing unattributed: it gets none, and the targets together
    never more than the device drew above idle."""
    model = Attribution(0.0, window_s=600.0)
    model.update(1.0, PassEnergy(1.0, 0.0, 0.0), {"asker": Usage(0.0), "a": Usage(0.0)})
    model.update(2.0, PassEnergy(1.0, 10.0, 1.0), {"asker": Usage(1.0)}, ["a"])
    model.update(3.0, PassEnergy(1.0, 0.0, 1.0), {"asker": Usage(0.0), "a": Usage(1.0)})
    assert model.energy_j == {"asker": 10.0, "a": 0.0}
    assert model.parts_j == {"attributed": 10.0, "idle": 0.0, "unattributed": 0.0}


def test_a_waiting_target_shares_what_its_span_left_unattributed() -> None:
    """As above, but the asker used half the host's CPU at the edge: 5 J were left
    unattributed, and the waiting target's 5 J over its span (1 of 2 CPU seconds of
    10 J) fit in them."""
    model = Attribution(0.0, window_s=600.0)
    model.update(1.0, PassEnergy(1.0, 0.0, 0.0), {"asker": Usage(0.0), "a": Usage(0.0)})
    model.update(2.0, PassEnergy(1.0, 10.0, 1.0), {"asker": Usage(0.5)}, ["a"])
    model.update(3.0, PassEnergy(1.0, 0.0, 1.0), {"asker": Usage(0.0), "a": Usage(1.0)})
    assert model.energy_j == pytest.approx({"asker": 5.0, "a": 5.0})
    assert model.parts_j == pytest.approx({"attributed": 10.0, "idle": 0.0, "unattributed": 0.0})
