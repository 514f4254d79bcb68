"""A target's sample as its history keeps it: a named row of cumulative figures.

A NamedTuple, so a row costs what a plain tuple costs (histories hold thousands) and
each figure is read by its name."""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from edgewatt.core.snapshot import ProcessSample


class SampleRow(NamedTuple):
    time: float  # unix seconds: dates the sample, never a duration
    cpu_user_s: float
    cpu_system_s: float
    cpu_utilization: float | None
    memory_rss_bytes: int
    memory_virtual_bytes: int
    disk_read_bytes: int | None
    disk_write_bytes: int | None
    network_transmit_bytes: int | None
    network_receive_bytes: int | None
    threads: int
    open_fds: int | None
    processes: int
    power_w: float | None
    energy_j: float | None
    device_energy_j: float | None
    memory_pss_bytes: int | None
    memory_rss_largest_bytes: int | None
    # Not a figure users read: time.monotonic at record (less the sample's age), from
    # which durations come, as no NTP step moves it.
    monotonic: float


# The figures users read (GET /v1/targets/{id}/samples, a target's "latest"), in order.
SAMPLE_FIELDS: tuple[str, ...] = SampleRow._fields[:-1]

SAMPLE_UNITS = {
    "time": "unix seconds",
    "cpu_user_s": "seconds of CPU time, cumulative",
    "cpu_system_s": "seconds of CPU time, cumulative",
    "cpu_utilization": "share of all logical CPUs over the last interval, 0..1",
    "memory_rss_bytes": "bytes",  # summed over the processes: a shared page once per process
    "memory_virtual_bytes": "bytes",
    "disk_read_bytes": "bytes read from storage, cumulative",
    "disk_write_bytes": "bytes written to storage, cumulative",
    "network_transmit_bytes": "TCP bytes sent and acknowledged, cumulative (not UDP/Unix)",
    "network_receive_bytes": "TCP bytes received, cumulative (not UDP/Unix)",
    "threads": "count",
    "open_fds": "count",
    "processes": "count (the target and its live descendants)",
    "power_w": "watts attributed over the last interval (docs/attribution.md)",
    "energy_j": "joules attributed since registration, cumulative",
    "device_energy_j": "joules the device's power sensors measured up to this sample's instant, "
    "cumulative since the daemon started (the whole device: a window's difference is what "
    "the sensor saw in it)",
    "memory_pss_bytes": "bytes",  # PSS summed (sampling/pss.py); null where not read
    "memory_rss_largest_bytes": "bytes",  # the largest process's RSS; null where not read
}

_figures = operator.attrgetter(*SAMPLE_FIELDS)
# A NamedTuple's own __new__ is a Python function of all its fields: building the
# tuple directly costs half as much, for every target at every pass.
_new = tuple.__new__


def row_of(sample: ProcessSample, monotonic: float) -> SampleRow:
    """The row of ``sample``, taken at ``monotonic`` (time.monotonic's seconds)."""
    return _new(SampleRow, (*_figures(sample), monotonic))


def sample_dict(row: SampleRow) -> dict[str, Any]:
    """The row as users read it: every figure by name, the monotonic time left out."""
    return dict(zip(SAMPLE_FIELDS, row))
