"""A target's sample as its history keeps it: a named row of cumulative figures.

A NamedTuple, so a row costs what a plain tuple costs (histories hold thousands) and
each figure is read by its name."""

from __future__ import annotations

import operator
import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from edgewatt.core.figures import KEPT
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
    memory_pss_read_at: float | None  # unix seconds: when the two above were read
    context_switches_voluntary: int | None
    context_switches_involuntary: int | None
    page_faults_minor: int | None
    # Not a figure users read: time.monotonic at record (less the sample's age), from
    # which durations come, as no NTP step moves it.
    monotonic: float


# The figures users read (GET /v1/targets/{id}/samples, a target's "latest"), in order.
SAMPLE_FIELDS: tuple[str, ...] = SampleRow._fields[:-1]

SAMPLE_UNITS = {
    **{f.name: f.unit for f in KEPT},
    "memory_pss_age_s": "seconds between the PSS figures' read and this sample",
}

_figures = operator.attrgetter(*SAMPLE_FIELDS)
# A NamedTuple's own __new__ is a Python function of all its fields: building the
# tuple directly costs half as much, for every target at every pass.
_new = tuple.__new__


def row_of(sample: ProcessSample, monotonic: float) -> SampleRow:
    """The row of ``sample``, taken at ``monotonic`` (time.monotonic's seconds)."""
    return _new(SampleRow, (*_figures(sample), monotonic))


def sample_dict(row: SampleRow) -> dict[str, Any]:
    """The row as users read it: every figure by name, the monotonic time left out, and
    how old its PSS figures are (null where not read)."""
    figures = dict(zip(SAMPLE_FIELDS, row))
    figures["memory_pss_age_s"] = pss_age(row)
    return figures


def pss_age(row: SampleRow) -> float | None:
    """Seconds from the read of the row's PSS figures to the row (None: not read)."""
    read_at = row.memory_pss_read_at
    return None if read_at is None else round(max(0.0, row.time - read_at), 3)


# Columns whose figures are counts or bytes (SampleRow's ints): read back as ints.
_WHOLE = (*(f.whole for f in KEPT), False)  # the monotonic time last
_NONE = float("nan")  # an absent figure (None) in a ring's doubles

# What every row keeps of its own: its two times and the device's energy at its
# instant (the whole device's: on a board with power sensors it moves at every pass,
# for an idle target too). The rest, the target's own figures, repeat while it idles.
_DEVICE = SampleRow._fields.index("device_energy_j")
_figures_of = operator.itemgetter(
    *range(1, _DEVICE), *range(_DEVICE + 1, len(SampleRow._fields) - 1)
)
_FIGURES = struct.Struct(f"={len(SampleRow._fields) - 3}d")  # 20 doubles, 160 B
_RECORD = struct.Struct("=3d")  # time, device_energy_j, monotonic: 24 B, and a slot: 4 B
_RECORD_SIZE, _FIGURES_SIZE = _RECORD.size, _FIGURES.size
_DOUBLE = struct.Struct("=d")
_DEVICE_AT = _DOUBLE.size  # in a record: after its time
_BLANK = bytes(_FIGURES_SIZE)


class RowRing:
    """The last ``capacity`` rows, oldest first: per row a 28 B record (its times, the
    device's energy, the slot of its figures), and the target's figures (160 B) once per
    run of rows that repeat them, where a deque of tuples cost ~300 B a row for every
    target at every pass. A None figure is kept as NaN, so a NaN figure reads
    back as None (JSON has no NaN); a count or byte figure reads back as an int, exact
    up to 2**53. A row repeats the last one's figures when they compare equal (``==``,
    before conversion: None equals None): a -0.0 after a 0.0 reads back as 0.0.

    Why a figure row is never overwritten while a kept row refers to it. Distinct
    figure rows get consecutive slots (mod capacity), and a row refers either to the
    last row's slot or to the next: the kept rows, oldest to newest, refer to ``_base``,
    ``_base`` + 1, ... up to ``_newest``, every one of them to at least one row. So
    ``_held`` (the figure rows kept, slot ``_base`` + k at place ``_first`` + k of the
    figures' buffer) is at most the rows kept. A row is dropped only when a new one
    comes to a full ring, before the new figures are written; the dropped row's figures
    go with it unless the row now oldest refers to them (the only row that can: rows
    refer in order). Then at most capacity - 1 rows are kept, so ``_held`` <= capacity -
    1: the new slot ``_base`` + ``_held`` is none of the kept ones mod capacity, and its
    place, ``_first`` + ``_held`` (the buffer grown by one place where all are held), is
    no kept figure row's. (With capacity 1 every slot is 0, and the dropped row's figures
    go exactly when the new row's are new.) The figures' buffer thus holds at most as
    many rows as were ever distinct at once: a quiet target's stays a few rows."""

    __slots__ = (
        "_base",
        "_figures",
        "_first",
        "_head",
        "_held",
        "_last",
        "_len",
        "_newest",
        "_records",
        "_slots",
        "capacity",
    )

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._records = bytearray()  # grows to capacity records, then wraps at _head
        self._slots = array("I")  # each record's figures' slot, the same way
        self._head = 0  # the oldest record's index once full
        self._len = 0
        self._figures = bytearray()  # distinct figure rows: a ring of as many as held
        self._first = 0  # the offset of the oldest figure row kept, slot _base
        self._held = 0
        self._base = 0
        self._newest = self.capacity - 1  # the newest row's slot: the first gets slot 0
        self._last: tuple[Any, ...] | None = None  # the newest row's figures, unconverted

    def __len__(self) -> int:
        return self._len

    def append(self, row: SampleRow) -> None:
        capacity = self.capacity
        if not capacity:
            return
        figures = _figures_of(row)
        values: Sequence[Any] | None
        if figures == self._last:  # a repeat: nothing converted, nothing packed
            values = None
        else:
            values = [_NONE if v is None else v for v in figures] if None in figures else figures
            self._newest = (self._newest + 1) % capacity
            self._last = figures
        slot = self._newest
        time, device, monotonic = row[0], row[_DEVICE], row[-1]
        if time is None:
            time = _NONE
        if device is None:
            device = _NONE
        if monotonic is None:
            monotonic = _NONE
        if self._len < capacity:  # nothing dropped yet: the figures start at offset 0
            self._records += _RECORD.pack(time, device, monotonic)
            self._slots.append(slot)
            self._len += 1
            if values is not None:
                self._figures += _FIGURES.pack(*values)
                self._held += 1
            if self._len == capacity:  # full: the buffers' size from now on, none spare
                self._records = bytearray(self._records)
                self._slots = array("I", self._slots)
                self._figures = bytearray(self._figures)
            return
        head = self._head
        after = head + 1 if head + 1 < capacity else 0
        # The oldest row goes: its figures too, unless the row now oldest refers to them.
        dropped = values is not None if after == head else self._slots[after] != self._base
        figures_buffer, first = self._figures, self._first
        if dropped:
            self._base = (self._base + 1) % capacity
            self._held -= 1
            first += _FIGURES_SIZE
            if first == len(figures_buffer):
                first = 0
            self._first = first
        _RECORD.pack_into(self._records, head * _RECORD_SIZE, time, device, monotonic)
        self._slots[head] = slot
        self._head = after
        if values is None:
            return
        # The new figures after the newest kept, in a place no kept row refers to.
        at = first + self._held * _FIGURES_SIZE
        if at == first + len(figures_buffer):  # all held: one place more, the kept unwrapped
            figures_buffer = figures_buffer[first:] + figures_buffer[:first] + _BLANK
            self._figures, self._first = figures_buffer, 0
            at -= first
        elif at >= len(figures_buffer):
            at -= len(figures_buffer)
        _FIGURES.pack_into(figures_buffer, at, *values)
        self._held += 1

    def __getitem__(self, index: int) -> SampleRow:
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("row index out of range")
        capacity = self.capacity
        index = (self._head + index) % capacity
        time, device, monotonic = _RECORD.unpack_from(self._records, index * _RECORD_SIZE)
        slot = self._slots[index]
        at = (self._first + (slot - self._base) % capacity * _FIGURES_SIZE) % len(self._figures)
        figures = _FIGURES.unpack_from(self._figures, at)
        values = (
            time,
            *figures[: _DEVICE - 1],
            device,
            *figures[_DEVICE - 1 :],
            monotonic,
        )
        return _new(
            SampleRow,
            (
                None if v != v else int(v) if whole and v.is_integer() else v
                for v, whole in zip(values, _WHOLE)
            ),
        )

    def __iter__(self) -> Iterator[SampleRow]:
        return (self[i] for i in range(self._len))

    def device_energy(self, index: int) -> tuple[float | None, float | None]:
        """The row at ``index`` (0: the oldest kept): its monotonic instant, and the
        device's energy at it."""
        _, device, monotonic = _RECORD.unpack_from(self._records, self._offset(index))
        return (
            None if monotonic != monotonic else monotonic,
            None if device != device else device,
        )

    def settle_device_energy(self, index: int, joules: float) -> None:
        """The device's energy at the row at ``index`` as the trace settled it."""
        _DOUBLE.pack_into(self._records, self._offset(index) + _DEVICE_AT, joules)

    def _offset(self, index: int) -> int:
        if not 0 <= index < self._len:
            raise IndexError("row index out of range")
        return (self._head + index) % self.capacity * _RECORD_SIZE
