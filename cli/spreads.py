"""The run's lowest, mean and highest device power, CPU use and memory, as rows
of the tables `edgewatt run`, `summary` and `report` print, from the
daemon's summary keys (an `edgewatt run` file's summary record holds the same)."""

from __future__ import annotations

from typing import Any, Callable

from edgewatt.cli.status import human_bytes

# (label, keys of the lowest, mean and highest, how a value is shown, what it is of).
SPREADS: tuple[tuple[str, tuple[str, str, str], Callable[[Any], str], str], ...] = (
    (
        "power",
        ("power_min_w", "device_power_avg_w", "power_max_w"),
        lambda w: f"{w:.2f} W",
        " (the device's)",
    ),
    (
        "CPU use",
        ("cpu_utilization_min", "cpu_avg_utilization", "cpu_utilization_max"),
        lambda u: f"{u * 100:.1f} %",
        " of all cores",
    ),
    (
        "RSS sum",
        ("memory_rss_min_bytes", "memory_rss_avg_bytes", "memory_rss_peak_bytes"),
        human_bytes,
        " (each sample)",
    ),
)
KEYS = tuple(key for _, keys, _, _ in SPREADS for key in keys)
TOO_SHORT = "no min or max: the run was shorter than two readings apart"


def spread_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, "min X, mean Y, max Z" with units) for each figure the summary has a
    lowest, mean or highest of ("-": one not measured); none where it has none (no
    power source; an in-process monitor's summary, or a file without them). The power
    is the device's at its sensor's rate (every reading, not one a pass), its mean
    the device's energy over the time; CPU use is per sampling interval, memory per
    sample, the largest the peak."""
    rows = []
    for label, keys, shown, what in SPREADS:
        low, mean, high = (summary.get(key) for key in keys)
        if keys[0] not in summary or (low is None and mean is None):
            continue  # nothing, or a peak alone (shown with the memory rows)
        if mean is not None and (
            low is None or high is None or (label != "CPU use" and not low <= mean <= high)
        ):
            # A run shorter than two readings (or intervals) apart: the one reading
            # around it is no lowest or highest of it; its mean over time still is.
            rows.append((label, f"mean {shown(mean)}{what}; {TOO_SHORT}"))
            continue
        if mean is not None and not low <= mean <= high:
            # `edgewatt run`'s CPU use: its mean is the CPU time over the whole run (its
            # start and end included), against the lowest and highest of the intervals
            # inside it. (The power's mean is its readings' interpolated over the run:
            # outside them only where the run is shorter than two readings apart.)
            rows.append((label, f"min {shown(low)}, max {shown(high)} per interval; "
                                f"mean {shown(mean)}{what} over the run"))  # fmt: skip
            continue
        cells = (
            f"{name} {'-' if value is None else shown(value)}"
            for name, value in zip(("min", "mean", "max"), (low, mean, high))
        )
        rows.append((label, ", ".join(cells) + what))
    return rows
