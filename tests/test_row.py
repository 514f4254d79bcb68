"""A history row as users read it: every figure by name with its unit, and how old its
PSS figures are."""

from __future__ import annotations

import dataclasses
import re

import pytest

from edgewatt.core.figures import INCREASES, KEPT, KINDS
from edgewatt.core.metrics import TABLE
from edgewatt.core.snapshot import ProcessSample
from edgewatt.core.targets.row import (
    SAMPLE_FIELDS,
    SAMPLE_UNITS,
    RowRing,
    SampleRow,
    pss_age,
    row_of,
    sample_dict,
)
from edgewatt.core.targets.summary import span
from tests.snapshots import process


def test_every_figure_a_sample_shows_has_the_unit_its_name_says() -> None:
    assert list(SAMPLE_UNITS) == [*SAMPLE_FIELDS, "memory_pss_age_s"]
    by_suffix = {
        "_bytes": "bytes",
        "_at": "unix seconds",
        "_s": "seconds",
        "_utilization": "share of all logical CPUs",
        "_w": "watts",
        "_j": "joules",
    }
    counts = {
        "threads", "open_fds", "processes",
        "context_switches_voluntary", "context_switches_involuntary", "page_faults_minor",
    }  # fmt: skip
    for name, unit in SAMPLE_UNITS.items():
        if name == "time":
            assert unit == "unix seconds"
        elif name in counts:
            assert unit.startswith("count"), name
        else:
            (suffix,) = [s for s in by_suffix if name.endswith(s) and not name.endswith("_at_s")]
            # The unit first, after what is counted where the name does not say it.
            counted = unit[len("TCP ") :] if unit.startswith("TCP ") else unit
            assert counted.startswith(by_suffix[suffix]), (name, unit)
        # Words, ending as a phrase does (a word, a bound, a parenthesis closed).
        assert unit[-1].islower() or unit[-1].isdigit() or unit[-1] == ")", unit
    # The cumulative figures say so: a window's figure is the difference of two.
    cumulative = [n for n, unit in SAMPLE_UNITS.items() if re.search(r"\bcumulative\b", unit)]
    assert cumulative == [
        "cpu_user_s", "cpu_system_s", "disk_read_bytes", "disk_write_bytes",
        "network_transmit_bytes", "network_receive_bytes", "energy_j", "device_energy_j",
        "context_switches_voluntary", "context_switches_involuntary", "page_faults_minor",
    ]  # fmt: skip


def test_a_rows_pss_age_is_to_the_millisecond_and_never_negative() -> None:
    sample = dataclasses.replace(process(0), time=1_700_000_100.0)
    row = row_of(dataclasses.replace(sample, memory_pss_read_at=1_700_000_098.7654), 50.0)
    assert pss_age(row) == 1.235
    # Read after the sample's date (the wall clock stepped back between): no age.
    assert pss_age(row._replace(memory_pss_read_at=1_700_000_100.5)) == 0.0
    assert pss_age(row._replace(memory_pss_read_at=None)) is None
    shown = sample_dict(row)
    assert list(shown) == [*SAMPLE_FIELDS, "memory_pss_age_s"]
    assert (shown["time"], shown["memory_pss_age_s"], shown["cpu_user_s"]) == (
        1_700_000_100.0, 1.235, 1.5
    )  # fmt: skip


def _row(at: float, **figures: float | int | None) -> SampleRow:
    """A row read at ``at`` s (monotonic) from tests/snapshots.py's sample."""
    return row_of(dataclasses.replace(process(0), time=1_700_000_000.0 + at, **figures), at)


def test_a_ring_row_takes_its_settled_energy_in_place_after_the_ring_wraps() -> None:
    ring = RowRing(3)
    for i in range(5):  # rows 2, 3 and 4 kept: the records wrapped
        ring.append(_row(float(i), device_energy_j=10.0 * i))
    assert [ring.device_energy(i) for i in range(3)] == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0)]
    ring.settle_device_energy(1, 27.5)
    assert [r.device_energy_j for r in ring] == [20.0, 27.5, 40.0]
    assert [r.monotonic for r in ring] == [2.0, 3.0, 4.0]
    assert ring[1]._replace(device_energy_j=30.0) == _row(
        3.0, device_energy_j=30.0
    )  # nothing else moved
    # Past the newest row is no row: the ring's next record is nobody's to write.
    for index in (3, -1):
        with pytest.raises(IndexError):
            ring.device_energy(index)
        with pytest.raises(IndexError):
            ring.settle_device_energy(index, 1.0)


def test_the_row_s_columns_are_the_declared_figures_each_a_sample_field() -> None:
    # One declaration (core/figures.py) gives the row's units, its ints and the
    # summary's increases: its figures are the row's columns, in order, and the
    # sample's fields.
    assert tuple(f.name for f in KEPT) == SAMPLE_FIELDS
    sample_fields = {f.name for f in dataclasses.fields(ProcessSample)}
    for figure in KEPT:
        assert figure.name in sample_fields and figure.kind in KINDS, figure
        # A figure whose window is its increase is cumulative; a cumulative one says so.
        assert not figure.increase or figure.kind == "cumulative", figure
        assert (figure.kind == "cumulative") == bool(re.search(r"\bcumulative\b", figure.unit)), (
            figure
        )


def test_an_exported_figure_s_instrument_agrees_with_its_declared_kind() -> None:
    # A counter's figure never decreases (cumulative); a level is no counter.
    kinds = {f.name: f.kind for f in KEPT}
    checked = 0
    for metric in TABLE:
        for name in (metric.field, *(field for _, field in metric.split)):
            if metric.per_phase or name not in kinds:
                continue
            checked += 1
            assert (metric.instrument == "counter") == (kinds[name] == "cumulative"), (
                metric.name,
                name,
            )
    assert checked == 18  # every kept figure that is exported


def test_a_summary_gives_each_declared_increase_as_the_difference_of_its_rows() -> None:
    first = _row(0.0, disk_read_bytes=10, network_receive_bytes=None)
    last = _row(2.0, disk_read_bytes=4106, network_receive_bytes=7)
    figures = span(first, last, logical_cpus=2, carbon=None)
    for name in INCREASES:
        before, after = getattr(first, name), getattr(last, name)
        expected = None if before is None or after is None else after - before
        assert figures[name] == expected, name
    assert figures["disk_read_bytes"] == 4096 and figures["network_receive_bytes"] is None
    assert INCREASES == (
        "disk_read_bytes", "disk_write_bytes", "network_transmit_bytes", "network_receive_bytes",
        "context_switches_voluntary", "context_switches_involuntary", "page_faults_minor",
    )  # fmt: skip
