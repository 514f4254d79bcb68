"""The order of a sampler pass's effects, with a real child process."""

from __future__ import annotations

from typing import Any

import pytest

from edgewatt.core.sampler import Sampler
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
