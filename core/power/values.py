"""What the power reader hands out: the device's power at an edge (a snapshot in every
pass's :class:`~edgewatt.core.snapshot.Snapshot`) and the reader's own status (what
``/healthz`` shows). Values only: meter.py builds them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgewatt.core.compat import SLOTS
from edgewatt.core.power.provenance import Provenance
from edgewatt.core.power.source import Gpu


@dataclass(frozen=True, **SLOTS)
class RailState:
    id: str
    name: str
    type: str
    source: str
    power_w: float | None
    energy_j: float | None


@dataclass(frozen=True, **SLOTS)
class PowerSnapshot:
    host_power_w: float | None
    host_energy_j: float | None  # since the reader started, up to measured_at
    rails: tuple[RailState, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    temperatures_c: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (source, name)
    sources: tuple[str, ...] = ()
    # Monotonic time the energies are measured to: the edge's own instant.
    measured_at: float | None = None
    # The coarsest period at which the device's energy is resolved (None: unknown): a
    # window shorter than this is not resolved by the sensor, and says so.
    period_s: float | None = None
    # The device's lowest and highest power (W) over the readings since the previous
    # edge, at the sensor's rate (the window rate while a window is young): a spike
    # between two passes is in them. None: not measured.
    power_min_w: float | None = None
    power_max_w: float | None = None
    # Where host_energy_j comes from: the sensors, rails and rates, or why unknown.
    provenance: Provenance | None = None


@dataclass(frozen=True, **SLOTS)
class PowerStatus:
    """The power reader now; every field None (and no source) where none runs."""

    sources: tuple[str, ...] = ()  # found at start, speaking or not
    reader: str | None = None  # what reads the stream: "native", "python" or "none"
    # How its thread runs beside the work it measures: "fifo" or "nice -N" (the native
    # reader, where the process may), "process" (its process's priority).
    reader_priority: str | None = None
    sample_hz: float | None = None  # the steady rate now (chosen on the device unless set)
    reading_cpu_s: float | None = None  # a reading's CPU, wake included (None: not measured)
    window_hz: float | None = None  # young windows' rate (0: none)
    window_readings: int | None = None  # taken at it since start
    windows_refused: int | None = None  # windows opened with the allowance spent
