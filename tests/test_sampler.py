"""The order of a sampler pass's effects, with a real child process."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewatt.core.sampler import Sampler
from edgewatt.core.sampling.exits import final_cpu
from edgewatt.core.snapshot import Snapshot
from tests.conftest import table_with


def test_a_target_is_called_exited_only_once_the_exporters_have_dropped_it(
    spawn: Any,
) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    published: list[tuple[Snapshot, str]] = []
    sampler = Sampler(
        table,
        interval=0.1,
        host_name="h",
        on_pass=lambda s: published.append((s, table.get(target.id).state)),
    )
    sampler.sample_once()
    child.kill()
    child.wait()
    sampler.sample_once()
    (first, _), (second, state_while_publishing) = published
    assert [p.target_id for p in first.processes] == [target.id]
    assert second.processes == ()
    # A client that polls GET /v1/targets/{id} until "exited" and then scrapes must not
    # find the series still there: the table says so only after the exporters have it.
    assert state_while_publishing == "running"
    assert table.get(target.id).state == "exited"
    sampler.close()


def test_an_exporter_that_raises_still_lets_the_exit_be_recorded(spawn: Any) -> None:
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()

    def broken(snapshot: Snapshot) -> None:
        raise RuntimeError("exporter bug")

    sampler = Sampler(table, interval=0.1, host_name="h", on_pass=broken)
    child.kill()
    child.wait()
    with pytest.raises(RuntimeError, match="exporter bug"):
        sampler.sample_once()
    assert table.get(target.id).state == "exited"
    sampler.close()


@settings(max_examples=500, deadline=None)
@given(
    last=st.tuples(st.floats(0, 100), st.floats(0, 100)),
    final=st.tuples(st.floats(0, 100), st.floats(0, 100)),
)
def test_the_cpu_at_an_exit_is_the_larger_total_and_neither_mode_goes_back(
    last: tuple[float, float], final: tuple[float, float]
) -> None:
    # /proc's last reading and the kernel's exit figures split one runtime between user
    # and system differently: (0.20, 0.05) and (0.17, 0.08) are 0.25 s, not 0.28.
    user, system = final_cpu(last, final)
    assert user + system == pytest.approx(max(sum(last), sum(final)), abs=1e-9)
    assert user >= last[0] and system >= last[1] - 1e-9
    if final[0] >= last[0] and final[1] >= last[1]:  # the exit figures as they are
        assert (user, system) == pytest.approx(final)


def test_the_cpu_at_an_exit_split_differently_is_not_counted_twice() -> None:
    assert final_cpu((0.20, 0.05), (0.17, 0.08)) == pytest.approx((0.20, 0.05))
    assert final_cpu((0.20, 0.05), (0.17, 0.10)) == pytest.approx((0.20, 0.07))
