"""A phase's exported figures (PhaseFigures, every pass) and a span's changes where one
end lacks a figure, to the rounding users read."""

from __future__ import annotations

import dataclasses
from typing import Any

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.facts.cgroup_names import CgroupName
from edgewatt.core.power.provenance import (
    ATTRIBUTED,
    ATTRIBUTION_RULE,
    COUNTER,
    MEASURED,
    UNKNOWN,
    Provenance,
    Sensor,
    unknown,
)
from edgewatt.core.targets.history import History, Phase
from edgewatt.core.targets.row import SampleRow, row_of
from edgewatt.core.targets.summary import covers, phase_figures, span, summarize, with_provenance
from edgewatt.core.targets.target import Identity, Target
from tests.snapshots import process


def test_a_phase_without_samples_is_running_until_ended_and_nothing_else() -> None:
    phase = Phase("warmup", 1_700_000_000.0)
    assert tuple(phase_figures(phase)) == ("warmup", True, None, 0.0, None)
    phase.ended_at = 1_700_000_001.0
    assert tuple(phase_figures(phase)) == ("warmup", False, None, 0.0, None)


def test_a_phases_figures_are_rounded_to_the_millisecond_and_millijoule() -> None:
    phase = Phase("train", 1_700_000_000.0)
    sample = process(0)
    phase.add(row_of(dataclasses.replace(sample, energy_j=1.0), 100.0))
    phase.add(
        row_of(dataclasses.replace(sample, energy_j=3.4567891), 101.2345678), None, (2.5, 9.8765432)
    )
    assert tuple(phase_figures(phase)) == ("train", True, 2.457, 1.235, 9.877)
    phase.ended_at = 1_700_000_002.0
    assert phase_figures(phase).running is False


def test_a_figure_unknown_at_one_end_has_no_change() -> None:
    sample = process(0)
    first = row_of(dataclasses.replace(sample, disk_write_bytes=None), 100.0)
    last = row_of(dataclasses.replace(sample, disk_write_bytes=4096), 101.0)
    assert span(first, last, 2, None)["disk_write_bytes"] is None
    assert span(last, first, 2, None)["disk_write_bytes"] is None


def test_a_spans_figures_are_rounded_and_rates_need_a_duration() -> None:
    sample = process(0)
    at = {"cpu_user_s": 1.0, "cpu_system_s": 0.5, "energy_j": 2.0, "device_energy_j": 10.0}
    first = row_of(dataclasses.replace(sample, **at), 100.0)
    later = {"cpu_user_s": 1.1234567, "cpu_system_s": 0.6234567}
    later.update(energy_j=3.2345678, device_energy_j=15.8765432)
    last = row_of(dataclasses.replace(sample, **later), 100.4567891)
    figures = span(first, last, 2, None)
    names = ("duration_s", "cpu_user_s", "cpu_system_s", "cpu_avg_cores", "cpu_avg_utilization")
    power = ("energy_j", "power_avg_w", "device_energy_j", "device_power_avg_w")
    assert [figures[n] for n in names] == [0.457, 0.123, 0.123, 0.5405, 0.2703]
    assert [figures[n] for n in power] == [1.235, 2.703, 5.877, 12.865]
    # No time between the two rows: no rate.
    still = span(first, first, 2, None)
    assert [still[n] for n in names] == [0.0, 0.0, 0.0, None, None]
    assert [still[n] for n in power] == [0.0, None, 0.0, None]


def _row(at: float, **figures: float | int | None) -> SampleRow:
    """A row read at ``at`` s (monotonic), dated 1,700,000,000 s later unless ``time``
    says, from tests/snapshots.py's sample."""
    given = {"time": 1_700_000_000.0 + at, **figures}
    return row_of(dataclasses.replace(process(0), **given), at)


def _identity(**fields: Any) -> Identity:
    given: dict[str, Any] = dict(
        id="t1", pid=4242, start_ticks=7, start_time=1_699_999_990.0, labels={"run": "a"},
        children=True, uid=1000, registered_at=1_700_000_000.12345,
    )  # fmt: skip
    return Identity(**{**given, **fields})


def _three_rows_and_two_phases() -> History:
    """Rows at 10, 12 and 14.5 s; phase "train" from the second, "step" inside it from
    the third; the sensors' period 0.25 s then 1 s, the device's power 1.2345678 to
    9.8765432 W then 2.5 to 5.5 W (the first row's interval is before the history)."""
    history = History(10)
    history.note(0.5, 3.0, 4.0)
    history.add(_row(10.0, cpu_user_s=1.0, cpu_system_s=0.5, energy_j=2.0, device_energy_j=100.0,
                     cpu_utilization=0.1, memory_rss_bytes=1000, memory_pss_bytes=600,
                     memory_rss_largest_bytes=800, disk_read_bytes=4096))  # fmt: skip
    history.start_phase(Phase("train", 1_700_000_011.0, 11.0), 1_700_000_011.0)
    history.note(0.25, 1.2345678, 9.8765432)
    history.add(_row(12.0, cpu_user_s=2.0, cpu_system_s=1.0, energy_j=5.0, device_energy_j=120.0,
                     cpu_utilization=0.1234567, memory_rss_bytes=3000, memory_pss_bytes=900,
                     memory_rss_largest_bytes=1500, disk_read_bytes=8192))  # fmt: skip
    history.start_phase(Phase("step", 1_700_000_013.0, 13.0, depth=1), 1_700_000_013.0)
    history.note(1.0, 2.5, 5.5)
    history.add(_row(14.5, cpu_user_s=3.0, cpu_system_s=1.25, energy_j=6.5, device_energy_j=130.0,
                     cpu_utilization=0.7654321, memory_rss_bytes=2002, memory_pss_bytes=700,
                     memory_rss_largest_bytes=1200, disk_read_bytes=12288,
                     memory_pss_read_at=1_700_000_014.5 - 1.23456))  # fmt: skip
    return history


def test_a_process_targets_summary_is_every_figure_of_its_rows_and_phases() -> None:
    target = Target(_identity(), _three_rows_and_two_phases())
    carbon = CarbonIntensity(400.0, "test")
    # The sensors' period now (5 s) is only for a window with no interval of its own.
    summary = summarize(target, 2, carbon, "lineage", 5.0)
    phases = summary.pop("phases")
    assert summary == {
        "id": "t1",
        "kind": "process",
        "pid": 4242,
        "command": None,  # no pass named it
        "labels": {"run": "a"},
        "state": "running",
        "registered_at": 1_700_000_000.123,
        "exited_at": None,
        "exit": None,
        "exit_status": None,
        "membership": "lineage",
        "network_counts": "tcp-payload",
        "network_lower_bound": True,
        "samples": 3,
        "final": False,  # no edge settled by a power trace
        "covers": {"whole": True},
        "duration_s": 4.5,
        "cpu_user_s": 2.0,
        "cpu_system_s": 0.75,
        "cpu_avg_cores": 0.6111,  # 2.75 s of CPU in 4.5 s
        "cpu_avg_utilization": 0.3056,  # of 2 CPUs
        "disk_read_bytes": 8192,
        "disk_write_bytes": None,
        "network_transmit_bytes": 0,
        "network_receive_bytes": 0,
        "context_switches_voluntary": 0,
        "context_switches_involuntary": 0,
        "page_faults_minor": 0,
        "energy_j": 4.5,
        "power_avg_w": 1.0,
        "device_energy_j": 30.0,
        "device_power_avg_w": 6.667,
        "shorter_than_sensor_period": False,  # 4.5 s read every 1 s at the coarsest
        "carbon_g": 4.5 / 3_600_000 * 400.0,
        "power_min_w": 1.235,
        "power_max_w": 9.877,
        "cpu_utilization_min": 0.1235,  # the second and third rows' intervals
        "cpu_utilization_max": 0.7654,
        "memory_pss_peak_bytes": 900,
        "memory_rss_largest_peak_bytes": 1500,
        "memory_rss_peak_bytes": 3000,
        "memory_rss_min_bytes": 1000,
        "memory_rss_avg_bytes": 2001,  # 6002 / 3
        "memory_rss_largest_at_exit": False,  # the passes' (it runs)
        "memory_pss_age_s": 1.235,
        "phases_dropped": 0,
        "carbon_intensity_g_per_kwh": 400.0,
        "carbon_intensity_source": "test",
    }
    assert phases == [
        {
            "name": "train",
            "depth": 0,
            "started_at": 1_700_000_011.0,
            "ended_at": None,
            "final": False,
            "duration_s": 2.5,
            "cpu_user_s": 1.0,
            "cpu_system_s": 0.25,
            "cpu_avg_cores": 0.5,
            "cpu_avg_utilization": 0.25,
            "disk_read_bytes": 4096,
            "disk_write_bytes": None,
            "network_transmit_bytes": 0,
            "network_receive_bytes": 0,
            "context_switches_voluntary": 0,
            "context_switches_involuntary": 0,
            "page_faults_minor": 0,
            "energy_j": 1.5,
            "power_avg_w": 0.6,
            "device_energy_j": 10.0,
            "device_power_avg_w": 4.0,
            "shorter_than_sensor_period": False,  # its own period, 1 s: not today's 5 s
            "carbon_g": 1.5 / 3_600_000 * 400.0,
            "power_min_w": 2.5,  # its one interval's, the third row's
            "power_max_w": 5.5,
            "cpu_utilization_min": 0.7654,
            "cpu_utilization_max": 0.7654,
            "memory_pss_peak_bytes": 900,
            "memory_rss_largest_peak_bytes": 1500,
            "memory_rss_peak_bytes": 3000,
            "memory_rss_min_bytes": 2002,
            "memory_rss_avg_bytes": 2501,
        },
        {
            "name": "step",
            "depth": 1,
            "started_at": 1_700_000_013.0,
            "ended_at": None,
            "final": False,
            "duration_s": 0.0,
            "cpu_user_s": 0.0,
            "cpu_system_s": 0.0,
            "cpu_avg_cores": None,
            "cpu_avg_utilization": None,
            "disk_read_bytes": 0,
            "disk_write_bytes": None,
            "network_transmit_bytes": 0,
            "network_receive_bytes": 0,
            "context_switches_voluntary": 0,
            "context_switches_involuntary": 0,
            "page_faults_minor": 0,
            "energy_j": 0.0,
            "power_avg_w": None,
            "device_energy_j": 0.0,
            "device_power_avg_w": None,
            "shorter_than_sensor_period": True,  # one row, no interval: today's 5 s
            "carbon_g": 0.0,
            "power_min_w": None,
            "power_max_w": None,
            "cpu_utilization_min": None,
            "cpu_utilization_max": None,
            "memory_pss_peak_bytes": 700,
            "memory_rss_largest_peak_bytes": 1200,
            "memory_rss_peak_bytes": 2002,
            "memory_rss_min_bytes": 2002,
            "memory_rss_avg_bytes": 2002,
        },
    ]
    # The same target counting the process alone; no carbon figure asked.
    alone = Target(_identity(children=False), History(10))
    summary = summarize(alone, 2, None, "lineage", 5.0)
    assert summary["membership"] == "process" and "carbon_intensity_source" not in summary
    assert summary["memory_pss_age_s"] is None and summary["samples"] == 0
    assert "network_unknown" not in summary and "end_reason" not in summary


def test_a_cgroup_targets_summary_says_what_its_network_figures_count() -> None:
    name = CgroupName("container", "web", "docker")
    target = Target(_identity(pid=0, cgroup_name=name), History(10))
    target.observed.cgroup, target.observed.cgroup_memory = "/system.slice/web", (4096, 8192)
    target.observed.cgroup_packets = (3, 5)
    target.end(1_700_000_020.0, "last-sample", end_reason="its cgroup was removed")
    summary = summarize(target, 2, None, "lineage", None)
    assert {k: summary[k] for k in ("kind", "pid", "state", "exited_at", "exit")} == {
        "kind": "cgroup", "pid": 0, "state": "exited", "exited_at": 1_700_000_020.0,
        "exit": "last-sample",
    }  # fmt: skip
    assert (summary["membership"], summary["network_counts"]) == ("cgroup", "ip-bytes")
    assert summary["network_lower_bound"] is False and summary["network_unknown"] is None
    assert summary["end_reason"] == "its cgroup was removed"
    assert summary["cgroup"] == {
        "kind": "container", "name": "web", "runtime": "docker", "path": "/system.slice/web",
        "memory_current_bytes": 4096, "memory_peak_bytes": 8192,
        "network_transmit_packets": 3, "network_receive_packets": 5,
    }  # fmt: skip
    target.observed.network_counts = "interface-frames"
    assert summarize(target, 2, None, "lineage", None)["network_counts"] == "interface-frames"
    target.observed.network_unknown = "no nftables"
    summary = summarize(target, 2, None, "lineage", None)
    assert (summary["network_counts"], summary["network_unknown"]) == (None, "no nftables")


def test_a_restored_target_covers_the_time_since_its_first_row_or_its_restoring() -> None:
    target = Target(_identity(), History(10), restored_at=1_700_000_005.98765)
    why = "the daemon restarted: the figures cover the time since it restored the registration, "
    why += "not the time it was down"
    restored = {"whole": False, "registered_at": 1_700_000_000.123, "why": why}
    assert covers(target) == {**restored, "from": 1_700_000_005.988}
    target.history.add(_row(10.0, time=1_700_000_010.12345))
    assert covers(target) == {**restored, "from": 1_700_000_010.123}


def test_a_window_exactly_as_long_as_the_sensors_period_is_resolved() -> None:
    first = _row(10.0, device_energy_j=100.0)
    last = _row(14.0, device_energy_j=104.0)
    assert span(first, last, 2, None, period_s=4.0)["shorter_than_sensor_period"] is False
    assert span(first, last, 2, None, period_s=4.25)["shorter_than_sensor_period"] is True
    # Without the device's energy nothing says what the window was read at.
    unread = _row(14.0, device_energy_j=None)
    assert span(first, unread, 2, None, period_s=4.25)["shorter_than_sensor_period"] is None
    assert span(first, last, 2, None)["shorter_than_sensor_period"] is None


def test_each_energy_figure_says_where_it_comes_from_or_why_it_is_absent() -> None:
    sensor = Sensor("rapl", "package-0", COUNTER, None)
    measured = Provenance(MEASURED, (sensor,))
    item: dict[str, Any] = {"energy_j": 1.0, "device_energy_j": None}
    item["phases"] = [{"energy_j": None, "device_energy_j": 2.0}]
    with_provenance(item, measured)
    sensors = [{"source": "rapl", "rail": "package-0", "read": COUNTER, "rate_hz": None}]
    attributed = {"method": ATTRIBUTED, "sensors": sensors, "rule": ATTRIBUTION_RULE}
    absent = {
        "method": UNKNOWN, "sensors": [], "rule": None,
        "reason": "no sample with the device's energy in this window yet",
    }  # fmt: skip
    assert item["energy_provenance"] == {**attributed, "reason": None}
    assert item["device_energy_provenance"] == absent
    phase = item["phases"][0]
    assert phase["energy_provenance"] == absent
    measured_dict = {"method": MEASURED, "sensors": sensors, "rule": None, "reason": None}
    assert phase["device_energy_provenance"] == measured_dict
    # No sensor: the figures are absent for the reason the sensors give.
    none = with_provenance({"energy_j": None, "device_energy_j": None}, unknown("no sensor"))
    reason = {"method": UNKNOWN, "sensors": [], "rule": None, "reason": "no sensor"}
    assert none == {
        "energy_j": None, "device_energy_j": None,
        "energy_provenance": reason, "device_energy_provenance": reason,
    }  # fmt: skip
