"""A target's sample as its history keeps it: a named row of cumulative figures.

A NamedTuple, so a row costs what a plain tuple costs (histories hold thousands) and
each figure is read by its name."""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterator
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


# Columns whose figures are counts or bytes (SampleRow's ints): read back as ints.
_COUNTS = {"threads", "open_fds", "processes"}
_WHOLE = tuple(f.endswith("_bytes") or f in _COUNTS for f in SampleRow._fields)
_ROW = struct.Struct(f"={len(SampleRow._fields)}d")
_NONE = float("nan")  # an absent figure (None) in a ring's doubles


class RowRing:
    """The last ``capacity`` rows, oldest first, as doubles in one buffer: 152 B a row
    against ~300 B for a row's tuple and the floats it made, for every target at every
    pass (issue 45). A None figure is kept as NaN, so a NaN figure reads back as None (JSON
    has no NaN); a count or byte figure reads back as an int, exact up to 2**53."""

    __slots__ = ("_buffer", "_head", "_len", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._buffer = bytearray()  # grows to capacity rows, then wraps at _head
        self._head = 0  # the oldest row's index once full
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, row: SampleRow) -> None:
        values = [_NONE if v is None else v for v in row]
        if self._len < self.capacity:
            self._buffer += _ROW.pack(*values)
            self._len += 1
            if self._len == self.capacity:  # full: its size from now on, none spare
                self._buffer = bytearray(self._buffer)
        elif self.capacity:
            _ROW.pack_into(self._buffer, self._head * _ROW.size, *values)
            self._head = (self._head + 1) % self.capacity

    def __getitem__(self, index: int) -> SampleRow:
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("row index out of range")
        values = _ROW.unpack_from(self._buffer, (self._head + index) % self.capacity * _ROW.size)
        return _new(
            SampleRow,
            (
                None if v != v else int(v) if whole and v.is_integer() else v
                for v, whole in zip(values, _WHOLE)
            ),
        )

    def __iter__(self) -> Iterator[SampleRow]:
        return (self[i] for i in range(self._len))
