"""The per-target figures a target's history keeps, declared once: each one's name (its
ProcessSample field, its history row's column, its key in the API's samples), its unit
as users read it, its kind and how a window's figure comes from two samples.

core/targets/row.py derives the units document (SAMPLE_UNITS) and how a row's figures
read back from a ring; core/targets/summary.py a window's increase of each figure that
is its difference as it is. Its rows are in SampleRow's order (tests/test_row.py).
The metric a figure is exported as is core/metrics.py's row naming the same field.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgewatt.core.channels import CHANNELS

KINDS = ("cumulative", "gauge", "count", "instant")


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str  # in words, as the API's units document says it
    # "cumulative": never decreasing, a window's figure is its increase; "gauge": a level
    # at the sample's instant; "count": how many, at that instant; "instant": a date.
    kind: str
    whole: bool = False  # counts and bytes: ints (a ring keeps them as doubles)
    # The summary's figure of a window is its increase as is (False: one computed
    # there, or none: rounded CPU time, energy capped by the device's, gauges).
    increase: bool = False


_CPU_S = "seconds of CPU time, cumulative"


def _increase(name: str, unit: str) -> Figure:
    """A whole cumulative figure whose window is its increase as is."""
    return Figure(name, unit, "cumulative", whole=True, increase=True)


KEPT: tuple[Figure, ...] = (
    Figure("time", "unix seconds", "instant"),
    Figure("cpu_user_s", _CPU_S, "cumulative"),
    Figure("cpu_system_s", _CPU_S, "cumulative"),
    Figure("cpu_utilization", "share of all logical CPUs over the last interval, 0..1", "gauge"),
    # Summed over the processes: a shared page once per process.
    Figure("memory_rss_bytes", "bytes", "gauge", whole=True),
    Figure("memory_virtual_bytes", "bytes", "gauge", whole=True),
    _increase("disk_read_bytes", "bytes read from storage, cumulative"),
    _increase("disk_write_bytes", "bytes written to storage, cumulative"),
    _increase(
        "network_transmit_bytes", "TCP bytes sent and acknowledged, cumulative (not UDP/Unix)"
    ),
    _increase("network_receive_bytes", "TCP bytes received, cumulative (not UDP/Unix)"),
    Figure("threads", "count", "count", whole=True),
    Figure("open_fds", "count", "count", whole=True),
    Figure("processes", "count (the target and its live descendants)", "count", whole=True),
    Figure("power_w", "watts attributed over the last interval (docs/attribution.md)", "gauge"),
    Figure("energy_j", "joules attributed since registration, cumulative", "cumulative"),
    Figure(
        "device_energy_j",
        "joules the device's power sensors measured up to this sample's instant, "
        "cumulative since the daemon started (the whole device: a window's difference is "
        "what the sensor saw in it)",
        "cumulative",
    ),
    # PSS summed (sampling/pss.py) and the largest process's RSS; null where not read.
    Figure("memory_pss_bytes", "bytes", "gauge", whole=True),
    Figure("memory_rss_largest_bytes", "bytes", "gauge", whole=True),
    Figure(
        "memory_pss_read_at",
        "unix seconds the PSS figures were read at (a dear read waits)",
        "instant",
    ),
    # The channels (core/channels.py), last.
    *(_increase(c.name, c.unit) for c in CHANNELS),
)

INCREASES: tuple[str, ...] = tuple(f.name for f in KEPT if f.increase)
