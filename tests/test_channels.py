"""The channels' one declaration (core/channels.py) is what every reader and writer
iterates: the sample's fields and the history's columns match it, the metric table
and `edgewatt run`'s table are derived from it, and /proc is read where it says."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edgewatt.cli.report import counter_rows
from edgewatt.core.channels import CHANNELS, EXPORTED, NAMES
from edgewatt.core.facts.procfs import ProcHandle
from edgewatt.core.figures import KEPT
from edgewatt.core.metrics import BY_NAME, TABLE
from edgewatt.core.snapshot import ProcessSample, Snapshot
from edgewatt.core.targets.row import SampleRow
from edgewatt.exporter.exposition import Exposition
from tests.conftest import settled
from tests.snapshots import process


def test_each_channel_is_a_sample_field_and_the_last_history_columns() -> None:
    fields = {f.name: f for f in dataclasses.fields(ProcessSample)}
    assert [fields[name].default for name in NAMES] == [None] * len(NAMES)
    # The history's columns are KEPT's, the channels last (then the monotonic time).
    assert SampleRow._fields[-1 - len(NAMES) : -1] == NAMES
    assert tuple(f.name for f in KEPT[-len(NAMES) :]) == NAMES
    assert [(f.unit, f.kind, f.increase) for f in KEPT[-len(NAMES) :]] == [
        (c.unit, "cumulative", True) for c in CHANNELS
    ]


def test_each_channel_metric_is_one_counter_split_by_its_attribute() -> None:
    by_name = {m.name: m for m in TABLE}
    for exported in EXPORTED:
        metric = by_name[exported.name]
        assert (metric.instrument, metric.unit, metric.attributes) == (
            "counter",
            exported.unit,
            (exported.attribute,),
        )
        assert metric.split == tuple(
            (c.metric_value, c.name) for c in CHANNELS if c.metric is exported
        )
    assert {name for m in TABLE for _, name in m.split} >= set(NAMES)


def test_run_s_table_has_a_row_per_channel_metric_and_none_where_a_figure_is_unknown() -> None:
    summary = {name: 10 + i for i, name in enumerate(NAMES)}
    rows = dict(counter_rows(summary))
    assert rows["switches"].startswith("10 voluntary (waits), 11 involuntary (preempted)")
    assert len(rows) == len(EXPORTED)
    del summary["context_switches_involuntary"]
    assert "switches" not in dict(counter_rows(summary))


def test_each_channel_reaches_metrics_by_its_attribute_value() -> None:
    # The test target's figures (tests/snapshots.py), each rendered as /metrics writes
    # it (OTLP and InfluxDB read the same points: exporter/points.py).
    sample = process(1)
    exposition = Exposition({})
    exposition.update(Snapshot(time=0.0, sequence=1, host=None, processes=(sample,)))
    found = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    for c in CHANNELS:
        counter = BY_NAME[c.metric.name].prometheus_name
        family = found[counter[: -len("_total")]]  # the parser names a family without it
        label = c.metric.attribute.replace(".", "_")
        (point,) = [p for p in family.samples if p.labels[label] == c.metric_value]
        value = getattr(sample, c.name)
        assert value is not None and point.value == value, c.name


def _kernel_counts(pid: int) -> tuple[int, ...]:
    """Each channel as /proc shows it, read here by the declaration's words."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines())
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()  # field 3 first
    return tuple(
        int(status[c.status_key]) if c.status_key else int(fields[c.stat_field - 3])
        for c in CHANNELS
    )


def test_a_process_s_counts_are_read_where_the_declaration_says(spawn: Any) -> None:
    child = spawn("import sys\nsys.stdin.readline()\n", stdin=subprocess.PIPE)
    settled(child.pid)  # it waits: its counts stand
    handle = ProcHandle(child.pid)
    try:
        assert handle.counts(handle.stat()) == _kernel_counts(child.pid)
    finally:
        handle.close()
