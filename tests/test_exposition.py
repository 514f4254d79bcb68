"""/metrics rendered from the snapshot: the contract's names, and the OTel exporter's
text for the same snapshot, line for line."""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import re
import socket
import struct
import subprocess
import termios
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.exporter.prometheus._mapping import sanitize_attribute as otel_sanitize_attribute
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from edgewatt.core import compat
from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.facts import system
from edgewatt.core.metrics import BY_NAME, TABLE, Metric
from edgewatt.core.platforms.board import PowerMode
from edgewatt.core.platforms.context import DeviceContext
from edgewatt.core.snapshot import HostSample, SamplerStats, Snapshot
from edgewatt.exporter.exposition import (
    UNEXPORTED,
    Exposition,
    float_to_go_string,
    sanitize_attribute,
)
from edgewatt.exporter.scrape_server import Answer, Request, ScrapeServer, accepts_gzip
from edgewatt.exporter.telemetry import METRICS, MetricSpec, OtelPipeline
from tests.conftest import wait_for
from tests.semconv import REQUIRED_1_44
from tests.snapshots import POWER, process

RESOURCE = Resource.create(
    {"service.name": "edgewatt", "host.name": "jetson-7", "odd": 'a"b\\c\nd', "count": 3}
)

# The Prometheus names that dashboards and rules are written against (design.md): none
# may go or change type. A metric added to the table needs no line here.
CONTRACTED_FAMILIES = {
    "process_cpu_time_seconds": "counter",
    "process_cpu_utilization": "gauge",
    "process_memory_usage_bytes": "gauge",
    "process_memory_virtual_bytes": "gauge",
    "process_disk_io_bytes": "counter",
    "process_network_io_bytes": "counter",
    "process_threads": "gauge",
    "process_open_file_descriptors": "gauge",
    "edgewatt_process_members": "gauge",
    "system_cpu_time_seconds": "counter",
    "system_cpu_utilization": "gauge",
    "edgewatt_host_logical_cpus": "gauge",
    "system_memory_usage_bytes": "gauge",
    "system_memory_limit_bytes": "gauge",
    "system_network_io_bytes": "counter",
    "edgewatt_targets": "gauge",
    "edgewatt_sampler_duration_seconds": "gauge",
    "edgewatt_sampler_overruns": "counter",
    "edgewatt_exit_overflows": "counter",
    "edgewatt_sampler_errors": "counter",
    "edgewatt_target_exits": "counter",
    "edgewatt_process_phase": "gauge",
    "edgewatt_process_phase_energy_joules": "gauge",
    "edgewatt_process_phase_duration_seconds": "gauge",
    "edgewatt_process_phase_power_max_watts": "gauge",
    "edgewatt_process_power_watts": "gauge",
    "edgewatt_process_energy_joules": "counter",
    "hw_host_power_watts": "gauge",
    "hw_host_energy_joules": "counter",
    "hw_power_watts": "gauge",
    "hw_energy_joules": "counter",
    "hw_gpu_utilization": "gauge",
    "hw_temperature_celsius": "gauge",
    "edgewatt_host_idle_power_watts": "gauge",
    "edgewatt_host_energy_accounted_joules": "counter",
    "edgewatt_process_gpu_utilization": "gauge",
    "edgewatt_process_gpu_memory_usage_bytes": "gauge",
    "hw_gpu_memory_usage_bytes": "gauge",
    "hw_gpu_memory_limit_bytes": "gauge",
    "edgewatt_process_carbon_grams": "counter",
    "edgewatt_host_carbon_grams": "counter",
}
# Every family /metrics serves: one per row of the table, named and typed from it.
EXPECTED_FAMILIES = {
    compat.removesuffix(m.prometheus_name, "_total"): "counter"
    if m.instrument == "counter"
    else "gauge"
    for m in TABLE
}
CARBON = CarbonIntensity(350.0, "configured (carbon_intensity_g_per_kwh)")


def host() -> HostSample:
    return HostSample(
        cpu=system.read_cpu(),
        cpu_utilization=0.2,
        memory=system.read_memory(),
        network=system.read_network(),
    )


def families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def otel_text(snapshot: Snapshot, resource: Resource = RESOURCE) -> bytes:
    """What the OTel SDK's PrometheusMetricReader serves for this snapshot."""
    registry = CollectorRegistry()
    pipeline = OtelPipeline(
        resource,
        lambda: [PrometheusMetricReader(registry=registry, scope_info_enabled=False)],
        series_rotation=1000,
    )
    pipeline.update(snapshot)
    try:
        return generate_latest(registry)
    finally:
        pipeline.shutdown()


def fast_text(snapshot: Snapshot, resource: Resource = RESOURCE) -> bytes:
    exposition = Exposition(resource.attributes)
    exposition.update(snapshot)
    return exposition.render()


# An empty label value, which Prometheus reads as an absent label. Its quotes cannot
# be a value's own: those are escaped.
EMPTY_LABEL = re.compile(r'(?<=[{,])[a-zA-Z_][a-zA-Z0-9_]*="",?')


def without_empty_labels(text: str) -> str:
    return EMPTY_LABEL.sub("", text).replace(",}", "}").replace("{}", "")


def assert_same_lines(fast: bytes, slow: bytes) -> None:
    # Same lines, same number of each; only the order of points within a family may
    # differ (the SDK keeps first-seen order, Prometheus does not care). The OTel
    # exporter writes labels a point lacks as "": the same series for Prometheus.
    assert sorted(without_empty_labels(fast.decode()).splitlines()) == sorted(
        without_empty_labels(slow.decode()).splitlines()
    )


def every_figure(**changes: Any) -> Snapshot:
    """A snapshot with every kind of figure: host, a process, power, carbon, stats."""
    snapshot = Snapshot(
        time=0.0,
        sequence=1,
        host=host(),
        processes=(process(1),),
        power=POWER,
        idle_power_w=4.0,
        energy_parts_j={"attributed": 12.5, "idle": 40.0, "unattributed": 0.75},
        carbon=CARBON,
        stats=SamplerStats(0.01, 0, 0, overflows={"taskstats": 0, "tcp_destroy": 0}),
        context=DeviceContext(0.0, "NVIDIA Jetson AGX Orin", "36.4.4", PowerMode("MAXN", 0), True),
    )
    return dataclasses.replace(snapshot, **changes)


def test_families_and_types_match_the_contract() -> None:
    snapshot = every_figure()
    got = {n: f.type for n, f in families(fast_text(snapshot)).items() if n != "target_info"}
    assert got == EXPECTED_FAMILIES
    assert CONTRACTED_FAMILIES.items() <= got.items()
    assert len(METRICS) == len(EXPECTED_FAMILIES)
    (rail,) = families(fast_text(snapshot))["hw_power_watts"].samples
    assert rail.labels == {
        "hw_id": "tegrastats:VDD_IN",
        "hw_name": "VDD_IN",
        "hw_type": "power_supply",
    }
    assert rail.value == 12.0


def test_carbon_is_intensity_times_energy_and_absent_without_an_intensity() -> None:
    with_carbon = Snapshot(
        time=0.0, sequence=1, host=None, processes=(process(1),), power=POWER, carbon=CARBON
    )
    found = families(fast_text(with_carbon))
    (mine,) = found["edgewatt_process_carbon_grams"].samples
    (device,) = found["edgewatt_host_carbon_grams"].samples
    # process(1) was attributed 10 J, the device 100 J: 350 g/kWh x J / 3.6e6 J/kWh.
    assert mine.value == pytest.approx(350 * 10 / 3.6e6, rel=1e-12)
    assert device.value == pytest.approx(350 * 100 / 3.6e6, rel=1e-12)
    without = fast_text(dataclasses.replace(with_carbon, carbon=None)).decode()
    assert "carbon" not in without


def test_unknown_values_are_absent_not_zero() -> None:
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),))
    disk = families(fast_text(snapshot))["process_disk_io_bytes"]
    assert [(s.labels["disk_io_direction"], s.value) for s in disk.samples] == [("read", 1.0)]


def test_text_equals_the_otel_exporters_for_every_kind_of_figure() -> None:
    other = process(2)
    other = dataclasses.replace(
        other, attributes={**other.attributes, "experiment": 'q"uote\\', "run": "ünïcode"}
    )
    snapshot = Snapshot(
        time=0.0,
        sequence=1,
        host=host(),
        processes=(process(1), other, process(3, cpu=1e9)),
        power=POWER,
        idle_power_w=4.0,
        carbon=CARBON,
    )
    fast = fast_text(snapshot)
    assert_same_lines(fast, otel_text(snapshot))
    # Label sets differ between targets: each point has its own, none written as "".
    rss = families(fast)["process_memory_usage_bytes"].samples
    assert sorted(s.labels.get("experiment", "-") for s in rss) == ["-", "-", 'q"uote\\']
    assert b'=""' not in fast
    assert b'target_info{count="3",host_name="jetson-7",odd="a\\"b\\\\c\\nd"' in fast


def test_text_equals_the_otel_exporters_without_host_or_power() -> None:
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),))
    assert_same_lines(fast_text(snapshot), otel_text(snapshot))
    empty = Snapshot(time=0.0, sequence=2, host=None)
    assert_same_lines(fast_text(empty), otel_text(empty))


def test_successive_renders_equal_the_otel_exporters_text() -> None:
    """One Exposition across passes, as in the daemon: its caches (label sets by
    identity and by content, numbers by value) must never serve a stale line."""
    exposition = Exposition(RESOURCE.attributes)
    steady, leaving = process(1), process(2)
    passes = [
        (steady, leaving),
        # Same objects, new values; 0.0 and -0.0 are equal keys with different texts.
        (
            dataclasses.replace(steady, cpu_user_s=0.0, energy_j=-0.0, memory_rss_bytes=0),
            dataclasses.replace(leaving, cpu_user_s=2.5, power_w=0.0),
        ),
        (dataclasses.replace(steady, cpu_user_s=-0.0, energy_j=0.0, power_w=2.5),),
        # A new target whose attributes equal the departed one's, in a fresh mapping.
        (steady, dataclasses.replace(leaving, attributes=dict(leaving.attributes))),
        # The same mapping object, its contents changed between passes: a new label set.
        (dataclasses.replace(steady, attributes={**steady.attributes, "run": "y"}),),
    ]
    for sequence, processes in enumerate(passes, start=1):
        snapshot = Snapshot(time=0.0, sequence=sequence, host=host(), processes=processes)
        exposition.update(snapshot)
        assert_same_lines(exposition.render(), otel_text(snapshot))


def test_a_gauge_at_negative_zero_reads_as_the_otel_exporter_writes_it() -> None:
    # A gauge keeps its sign (-0.0); a counter's sum adds it to 0 (0.0).
    p = dataclasses.replace(process(1), power_w=-0.0, energy_j=-0.0)
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=(p,))
    text = fast_text(snapshot)
    assert_same_lines(text, otel_text(snapshot))
    values = {f.name: f.samples[0].value for f in families(text).values()}
    assert str(values["edgewatt_process_power_watts"]) == "-0.0"
    assert str(values["edgewatt_process_energy_joules"]) == "0.0"


def test_help_texts_are_escaped_as_the_text_format_asks() -> None:
    metric = Metric("edgewatt.test", "gauge", "{x}", "a \\ and\na line", subject="host")
    spec = MetricSpec(metric, lambda snapshot: iter([(1.0, {})]))
    exposition = Exposition({}, metrics=(spec,))
    exposition.update(Snapshot(time=0.0, sequence=1, host=None, processes=()))
    assert exposition.render().decode().splitlines() == [
        "# HELP target_info Target metadata",
        "# TYPE target_info gauge",
        "target_info 1.0",  # a resource of no attributes: no labels
        "# HELP edgewatt_test a \\\\ and\\na line",
        "# TYPE edgewatt_test gauge",
        "edgewatt_test 1.0",
    ]


def test_only_targets_whose_figures_moved_are_observed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A per-target family of its own, recording the targets each render observes, and
    # whose label sets are written (once each: a kept target keeps its own).
    from edgewatt.exporter import exposition as module

    observed: list[list[str]] = []
    written: list[object] = []
    real = module._render_labels
    monkeypatch.setattr(
        module, "_render_labels", lambda a: written.append(a.get("edgewatt.target.id")) or real(a)
    )

    def observe(targets: Any) -> Any:
        observed.append([p.target_id for p in targets.processes])
        return iter([(p.cpu_user_s, p.attributes) for p in targets.processes])

    metric = Metric("edgewatt.test", "gauge", "s", "CPU", field="cpu_user_s")
    exposition = Exposition({}, metrics=(MetricSpec(metric, observe),))
    a, b = process(1), process(2)
    a_ran, b_ran = dataclasses.replace(a, cpu_user_s=2.0), dataclasses.replace(b, cpu_user_s=3.0)
    both = {"t1": 1, "t2": 1}  # Snapshot.figures_since: the pass whose figures they are
    passes = [
        ((a, b), both),
        ((dataclasses.replace(a, time=5.0), b), both),  # re-dated only: kept, not observed
        ((a, b), {}),  # no word: compared, the same
        ((a, b_ran), {}),  # b moved: a's kept lines written beside b's new ones
        ((a_ran, b_ran), {}),
        ((a_ran, b_ran), {}),
    ]
    texts = []
    for sequence, (processes, since) in enumerate(passes, start=1):
        snapshot = Snapshot(
            time=0.0, sequence=sequence, host=None, processes=processes, figures_since=since
        )
        exposition.update(snapshot)
        texts.append(exposition.render().decode().splitlines()[-2:])
    assert observed == [["t1", "t2"], ["t2"], ["t1"]]
    assert written == [None, "t1", "t2"]  # the resource's, then each target's
    labels = 'edgewatt_target_id="t{}",host_name="h",process_executable_name="python3",'
    labels += 'process_pid="100{}",run="x"'
    a_line = f"edgewatt_test_seconds{{{labels.format(1, 1)}}} 1.5"
    b_line = f"edgewatt_test_seconds{{{labels.format(2, 2)}}} 1.5"
    a_ran_line = f"edgewatt_test_seconds{{{labels.format(1, 1)}}} 2.0"
    b_ran_line = f"edgewatt_test_seconds{{{labels.format(2, 2)}}} 3.0"
    assert texts == [
        [a_line, b_line],
        [a_line, b_line],
        [a_line, b_line],
        [a_line, b_ran_line],
        [a_ran_line, b_ran_line],
        [a_ran_line, b_ran_line],
    ]


def test_a_target_left_as_it_was_keeps_its_lines_byte_for_byte() -> None:
    """A target whose figures did not change keeps its lines from the last render;
    the text stays byte for byte what a render from nothing writes: changed, unchanged,
    new, departed and reordered targets, phases that move, and the carbon intensity
    changing under unchanged figures (carbon is intensity times energy)."""
    exposition = Exposition(RESOURCE.attributes)
    a, b, c = process(1), process(2), process(3)
    other_carbon = CarbonIntensity(500.0, "configured (carbon_intensity_g_per_kwh)")
    passes = [
        ((a, b), CARBON),
        ((a, dataclasses.replace(b, cpu_user_s=9.0, time=1.0)), CARBON),  # b ran
        ((dataclasses.replace(a, time=2.0), b, c), CARBON),  # a re-dated only; c new
        ((c, a), CARBON),  # b departed, order changed
        ((c, a), other_carbon),  # same figures, another intensity
        ((c, a), None),
        ((dataclasses.replace(c, phases=c.phases[:1]), a), None),  # a phase left
        ((c, dataclasses.replace(a, memory_rss_bytes=0, energy_j=-0.0)), CARBON),
    ]
    for sequence, (processes, carbon) in enumerate(passes, start=1):
        snapshot = every_figure(sequence=sequence, processes=processes, carbon=carbon)
        exposition.update(snapshot)
        assert exposition.render() == fast_text(snapshot)
        assert_same_lines(exposition.render(), otel_text(snapshot))


def test_a_target_whose_figures_stand_since_its_kept_pass_is_not_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Snapshot.figures_since: the sampler's word that a target's sample carries the
    figures of an earlier pass (a copy, re-dated). Where it names the pass the kept
    lines came from, its figures are not even gathered; where it moved, or is absent,
    they are compared as before. Each render is byte for byte a render from nothing."""
    from edgewatt.exporter import exposition as module

    gathered: list[str] = []
    real = module._figures
    monkeypatch.setattr(module, "_figures", lambda p: gathered.append(p.target_id) or real(p))
    renderer = Exposition(RESOURCE.attributes)
    a, b = process(1), process(2)
    a_ran = dataclasses.replace(a, cpu_user_s=9.0)
    passes = [
        ((a, b), {a.target_id: 1, b.target_id: 1}),
        ((dataclasses.replace(a, time=2.0), b), {a.target_id: 1, b.target_id: 1}),
        ((a_ran, dataclasses.replace(b, time=3.0)), {a.target_id: 3, b.target_id: 1}),
        ((a_ran, b), {}),  # no word: compared
        ((a_ran, b), {a.target_id: 3, b.target_id: 1}),
    ]
    for sequence, (processes, since) in enumerate(passes, start=1):
        snapshot = every_figure(sequence=sequence, processes=processes, figures_since=since)
        expected = fast_text(snapshot)  # a render from nothing
        renderer.update(snapshot)
        gathered.clear()
        assert renderer.render() == expected
        looked_at = {
            1: [a.target_id, b.target_id],  # nothing kept yet
            2: [],
            3: [a.target_id],  # its figures moved: b's stand
            4: [a.target_id, b.target_id],
            5: [a.target_id, b.target_id],  # the word is new to what was kept: compared
        }
        assert gathered == looked_at[sequence], sequence
    snapshot = every_figure(sequence=6, processes=(a_ran, b), figures_since=since)
    expected = fast_text(snapshot)
    renderer.update(snapshot)
    gathered.clear()
    assert renderer.render() == expected and gathered == []


def test_a_target_whose_lines_are_kept_keeps_its_label_sets_for_when_its_figures_move(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every waiting target's figures move in the same pass now and then (its PSS read,
    the safety re-read): their label sets, kept with their lines through the renders
    that did not look at them, are not written again (that render took 16 ms instead
    of 5 at 200 targets). A target that leaves takes its label sets along. Each render
    is byte for byte a render from nothing."""
    from edgewatt.exporter import exposition as module

    written: list[object] = []
    real = module._render_labels
    monkeypatch.setattr(
        module, "_render_labels", lambda a: written.append(a.get("edgewatt.target.id")) or real(a)
    )
    renderer = Exposition(RESOURCE.attributes)
    a, b = process(1), process(2)
    moved = [dataclasses.replace(p, memory_pss_bytes=61) for p in (a, b)]
    again = [dataclasses.replace(p, memory_pss_bytes=62) for p in (a, b)]
    passes = [
        (a, b),
        (dataclasses.replace(a, time=5.0), b),  # nothing moved: no target looked at
        (dataclasses.replace(a, time=6.0), b),
        tuple(moved),  # both move after two renders that kept their lines
        tuple(moved),
        tuple(again),
        (again[1],),  # a left
        (dataclasses.replace(again[1], memory_pss_bytes=63),),
    ]
    for sequence, processes in enumerate(passes, start=1):
        snapshot = every_figure(sequence=sequence, processes=processes)
        expected = fast_text(snapshot)  # a render from nothing
        renderer.update(snapshot)
        written.clear()
        assert renderer.render() == expected
        targets_written = {str(t) for t in written if t}
        assert targets_written == ({"t1", "t2"} if sequence == 1 else set()), sequence
    kept = [hit[0].get("edgewatt.target.id") for hit in renderer._target_labels._used_ids.values()]
    assert set(kept) == {"t2"}


@pytest.mark.parametrize("name", sorted(UNEXPORTED))
def test_the_fields_left_out_of_the_change_check_are_in_no_point(name: str) -> None:
    """A sample's fields the renderer does not compare (they move every pass): no
    metric may read them, or an unchanged target's kept lines would be stale."""
    sample = process(1)
    moved = dataclasses.replace(sample, **{name: 12345.5})
    assert getattr(moved, name) != getattr(sample, name)
    snapshot = every_figure(processes=(sample,))  # the host read once: it moves
    assert fast_text(dataclasses.replace(snapshot, processes=(moved,))) == fast_text(snapshot)


def test_a_quiet_process_in_the_daemons_passes_keeps_its_lines(tmp_path: Path) -> None:
    """The change check's premise on the daemon's own parts: a process that waits
    gives the same compared figures pass after pass, so its lines are kept; a sample
    field that moves every pass and is not in UNEXPORTED (a monotonic instant once
    was) had every target rendered again at every scrape."""
    from edgewatt.exporter import config as configuration
    from edgewatt.exporter.daemon import Daemon
    from edgewatt.exporter.exposition import _figures

    waiter = subprocess.Popen(["sleep", "600"])
    config = configuration.build(None, {}, {
        "socket": str(tmp_path / "s.sock"), "state_dir": str(tmp_path / "state"),
        "listen": "127.0.0.1:0",
    })  # fmt: skip
    daemon = Daemon(config)
    try:
        target = daemon.table.register(waiter.pid, {"run": "quiet"}, True, 0).target.id
        passes = [daemon.sampler.sample_once() for _ in range(4)]
        samples = [next(p for p in s.processes if p.target_id == target) for s in passes]
        assert len({s.time for s in samples}) == 4  # dated anew each pass
        assert [_figures(s) for s in samples[1:]] == [_figures(samples[1])] * 3
    finally:
        daemon.sampler.close()
        waiter.kill()
        waiter.wait()


@settings(max_examples=300, deadline=None)
@given(st.floats() | st.integers(-(2**63), 2**64))
@example(float("-inf"))
@example(float("inf"))
@example(float("nan"))
@example(12345678.5)  # a fraction past Go's switch to exponents
@example(-12345678.5)
@example(123456789.0)
def test_numbers_are_written_as_prometheus_client_writes_them(value: float) -> None:
    assert float_to_go_string(float(value)) == floatToGoString(value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_label_keys_are_sanitized_as_the_otel_exporter_does(key: str) -> None:
    assert sanitize_attribute(key) == otel_sanitize_attribute(key)


label_keys = st.from_regex(r"[a-z][a-z0-9._-]{0,12}", fullmatch=True)
label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.dictionaries(label_keys, label_values, max_size=4), min_size=1, max_size=4),
    values=st.lists(
        st.floats(allow_nan=False, min_value=0, max_value=1e20), min_size=4, max_size=4
    ),
)
def test_text_equals_the_otel_exporters_for_any_labels(
    labels: list[dict[str, str]], values: list[float]
) -> None:
    processes = tuple(
        dataclasses.replace(
            process(i, cpu=values[i % 4]),
            memory_rss_bytes=int(values[(i + 1) % 4]),
            power_w=values[(i + 2) % 4],
            attributes={**process(i).attributes, **extra},
        )
        for i, extra in enumerate(labels)
    )
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=processes)
    assert_same_lines(fast_text(snapshot), otel_text(snapshot))


@pytest.fixture
def served() -> Iterator[tuple[Exposition, str]]:
    exposition = Exposition(RESOURCE.attributes)
    port = exposition.bind("127.0.0.1", 0)
    exposition.serve()
    yield exposition, f"http://127.0.0.1:{port}"
    exposition.shutdown()


def test_endpoint_serves_text_and_gzip_rendered_once_per_snapshot(
    served: tuple[Exposition, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    exposition, url = served
    renders = []
    render = exposition._render
    monkeypatch.setattr(exposition, "_render", lambda s: renders.append(s.sequence) or render(s))
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),))
    exposition.update(snapshot)
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        assert (r.status, r.reason) == (200, "OK")
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        plain = r.read()
    request = urllib.request.Request(f"{url}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=5) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.read()) == plain
    assert plain == fast_text(snapshot)
    assert renders == [1]  # two scrapes, one render
    exposition.update(dataclasses.replace(snapshot, sequence=2))
    with urllib.request.urlopen(request, timeout=5) as r:  # gzip first, then plain
        assert gzip.decompress(r.read()) == plain
    assert urllib.request.urlopen(f"{url}/metrics", timeout=5).read() == plain
    assert renders == [1, 2]


def test_before_the_first_snapshot_the_text_is_empty() -> None:
    exposition = Exposition(RESOURCE.attributes)
    assert exposition.render() == b""
    answer = exposition.respond(Request("GET", "/metrics", {}))
    assert (answer.status, answer.body) == (200, b"")
    exposition.shutdown()  # never bound: nothing to close


def test_endpoint_answers_other_paths_with_404(served: tuple[Exposition, str]) -> None:
    exposition, url = served
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"{url}/nothing", timeout=5)
    assert (error.value.code, error.value.reason) == (404, "Not Found")
    assert error.value.headers["Content-Type"] == "text/plain"
    assert error.value.read() == b"not found: /metrics serves the metrics\n"
    # The root serves the metrics too.
    exposition.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),)))
    with urllib.request.urlopen(f"{url}/", timeout=5) as r:
        assert r.read() == exposition.render() != b""


def test_a_shut_down_endpoint_refuses_connections_and_shuts_down_again() -> None:
    exposition = Exposition(RESOURCE.attributes)
    with pytest.raises(AssertionError, match=r"^bind\(\) first$"):
        exposition.serve()
    port = exposition.bind("127.0.0.1", 0)
    exposition.serve()
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    exposition.shutdown()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    exposition.shutdown()


def test_endpoint_serves_from_a_fixed_set_of_threads(
    served: tuple[Exposition, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    exposition, url = served
    exposition.update(Snapshot(time=0.0, sequence=1, host=None, processes=(process(1),)))
    port = int(url.rsplit(":", 1)[1])
    stalled = socket.create_connection(("127.0.0.1", port))  # sends nothing
    # Count starts rather than live threads: a thread left over from an earlier test
    # may end meanwhile, and a per-scrape thread may be gone before we look.
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    try:
        for _ in range(20):
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
                assert b"process_threads" in r.read()
        # No thread per scrape: each would hand out a pid and make the parent index
        # list /proc again.
        assert started == []
    finally:
        stalled.close()


@pytest.mark.parametrize("bad_first", [False, True])
def test_a_target_whose_labels_cannot_be_encoded_is_left_out_of_that_scrape_only(
    caplog: pytest.LogCaptureFixture, bad_first: bool
) -> None:
    bad = dataclasses.replace(process(2), attributes={**process(2).attributes, "run": "\udcff"})
    processes = (bad, process(1)) if bad_first else (process(1), bad)
    snapshot = Snapshot(time=0.0, sequence=1, host=None, processes=processes)
    exposition = Exposition(RESOURCE.attributes)
    exposition.update(snapshot)
    text = exposition.render().decode()
    # Every line of the other target's, as if the unwritable one were not there.
    alone = fast_text(dataclasses.replace(snapshot, processes=(process(1),))).decode()
    t1_lines = [line for line in alone.splitlines() if 'edgewatt_target_id="t1"' in line]
    assert len(t1_lines) > 20
    assert [line for line in text.splitlines() if "edgewatt_target_id=" in line] == t1_lines
    exposition.update(dataclasses.replace(snapshot, sequence=2))
    assert exposition.render().decode() == text
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1  # once per target, not per series or scrape
    assert logged[0].startswith("target 't2': labels {")
    assert logged[0].endswith("cannot be written as UTF-8; its series are left out of /metrics")


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("GZIP;Q=0.5", True),
        ("identity, *;q=0.1", True),
        ("*;q=0, identity", False),
        ("br, deflate", False),
        ("", False),
        ("gzip;q=abc", False),
    ],
)
def test_accept_encoding_q_values(header: str, gzipped: bool) -> None:
    assert accepts_gzip(header) is gzipped


def test_every_series_carries_the_devices_host_name() -> None:
    """A device is its host name on every path: a push has no `instance`."""
    snapshot = every_figure(host_name="jetson-7")
    samples = [s for f in families(fast_text(snapshot)).values() for s in f.samples]
    assert len({s.name for s in samples}) == len(EXPECTED_FAMILIES) + 1  # and target_info
    unnamed = [s.name for s in samples if "host_name" not in s.labels]
    assert unnamed == []
    hosts = {
        s.labels["host_name"]
        for s in samples
        if not s.name.startswith(("process_", "edgewatt_process_"))
    }
    assert hosts == {"jetson-7"}
    assert_same_lines(fast_text(snapshot), otel_text(snapshot))


def test_semantic_convention_metrics_carry_their_required_attributes_on_every_point() -> None:
    # As a Prometheus user reads them, from both renderings (ours and the OTel SDK's).
    snapshot = every_figure()
    for text in (fast_text(snapshot), otel_text(snapshot)):
        found = families(text)
        for name, (_, _, required) in REQUIRED_1_44.items():
            metric = BY_NAME[name]
            family = found[compat.removesuffix(metric.prometheus_name, "_total")]
            labels = {metric.prometheus_label(a) for a in required}
            assert family.samples, name
            for sample in family.samples:
                assert labels <= set(sample.labels), (name, sample.labels)
        cpu = found["process_cpu_utilization"].samples
        assert {s.labels["cpu_mode"]: s.value for s in cpu} == {"user": 0.375, "system": 0.125}
        for family, value in (("hw_host_power_watts", 12.0), ("hw_host_energy_joules", 100.0)):
            (sample,) = found[family].samples
            assert {k: v for k, v in sample.labels.items() if v} == {"hw_id": "host"}
            assert sample.value == value


def unread(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0]


def test_an_answer_larger_than_the_socket_takes_reaches_a_slow_reader_whole() -> None:
    """Head and body go out with one sendmsg, never copied into one buffer; what the
    socket does not take waits for it to drain, and a slow reader holds no one else."""
    body = bytes(range(256)) * 16384  # 4 MiB: many times what a socket buffer holds
    server = ScrapeServer("127.0.0.1", 0, lambda request: Answer(200, "OK", body, ()))
    server.serve()
    try:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", server.port))
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: unread(slow) > 0)  # its answer waits, part sent
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert urllib.request.urlopen(url, timeout=10).read() == body  # another, meanwhile
        received = bytearray()
        slow.settimeout(10)
        while chunk := slow.recv(65536):
            received += chunk
        head, _, got = bytes(received).partition(b"\r\n\r\n")
        assert got == body
        assert f"Content-Length: {len(body)}".encode() in head
        slow.close()
    finally:
        server.close()
