"""The phase table `edgewatt run`, `summary` and `report` print: one row per phase, each
figure with its unit, from the daemon's summary items (a run file's phase records hold
the same keys)."""

from __future__ import annotations

from typing import Any

from edgewatt.cli.status import human_bytes
from edgewatt.core.text import printable

# The peak of the device's power over a phase, where the item has it:
# shown as "-" until the daemon measures it, never derived from an average.
PEAK_POWER = "power_max_w"

# Rows a table shows, the newest (a function tracked at each training step is a phase).
MAX_ROWS = 30

HEADER = (
    "phase",
    "duration",
    "CPU",
    "device energy",
    "attributed",
    "avg power",
    "peak power",
    "peak PSS",
    "disk read / written",
    "network sent / received",
)


def _number(value: Any, unit: str, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}"


def _pair(item: dict[str, Any], first: str, second: str) -> str:
    a, b = item.get(first), item.get(second)
    return "-" if a is None and b is None else f"{human_bytes(a)} / {human_bytes(b)}"


def _cells(item: dict[str, Any]) -> tuple[str, ...]:
    duration = item.get("duration_s")
    user, system = item.get("cpu_user_s"), item.get("cpu_system_s")
    # A file's own samples give the sum alone (report's phases of a monitor's marks).
    cpu = item.get("cpu_time_s") if user is None or system is None else user + system
    device = item.get("device_energy_j")
    # The device's energy over the phase's own time: its mean power (W).
    average = device / duration if device is not None and duration else None
    return (
        str(item.get("name", "?")),
        _number(duration, "s", 2),
        _number(cpu, "s", 2),
        _number(device, "J", 1),
        _number(item.get("energy_j"), "J", 1),
        _number(average, "W", 2),
        _number(item.get(PEAK_POWER), "W", 2),
        human_bytes(item.get("memory_pss_peak_bytes")),
        _pair(item, "disk_read_bytes", "disk_write_bytes"),
        _pair(item, "network_transmit_bytes", "network_receive_bytes"),
    )


def phase_table(phases: list[dict[str, Any]], indent: str = "  ", dropped: int = 0) -> list[str]:
    """The lines of the table (none for no phase), the newest MAX_ROWS phases: CPU is
    user + system seconds of the whole tree, "attributed" the share of the device's
    energy above idle, "avg power" the device's energy over the phase's duration, "-"
    a figure not measured; ``dropped``: older phases the daemon no longer lists."""
    if not phases:
        return []
    shown = phases[-MAX_ROWS:]
    rows = [HEADER, *(_cells(item) for item in shown)]
    # Names are whatever a script chose: escaped before they reach a terminal.
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    # The target's own bytes, counted as its network line says (a monitor's marks have
    # none where its samples' bytes are the host's).
    notes = [
        "CPU: user + system time; attributed: its share of the device energy above idle;",
        "avg power: device energy / duration; peak PSS: the memory it held (shared pages",
        "split among the processes sharing them); network: the target's own, as counted "
        "above; -: not measured",
    ]
    older = len(phases) - len(shown) + dropped
    if older:
        # A tracked training step is a phase: thousands would bury the totals.
        notes.append(
            f"the newest {len(shown)} phases of {len(phases) + dropped}; the JSON lists "
            "every one the daemon keeps (--output's phase records, summary --json)"
        )
    return [f"{indent}phases:", *(f"{indent}  {line}" for line in [*lines, *notes])]
