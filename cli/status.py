"""`edgewatt status`: the registered targets as a table a person can read."""

from __future__ import annotations

from typing import Any

from edgewatt.core.text import printable


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def render(targets: list[dict[str, Any]], logical_cpus: int | None = None) -> str:
    """One row per target; CPU as percent of one core, sizes in binary units."""
    header = ("ID", "PID", "NAME", "STATE", "CPU%", "RSS", "READ", "WRITE", "PROCS", "LABELS")
    rows = [header]
    for t in targets:
        latest = t.get("latest") or {}
        util = latest.get("cpu_utilization")
        cpu = "-" if util is None or not logical_cpus else f"{util * logical_cpus * 100:.1f}"
        labels = ",".join(f"{k}={v}" for k, v in sorted(t.get("labels", {}).items()))
        rows.append(
            (
                t["id"],
                str(t["pid"]) if t.get("kind", "process") == "process" else "cgroup",
                t.get("executable") or "-",
                t["state"],
                cpu,
                human_bytes(latest.get("memory_rss_bytes")),
                human_bytes(latest.get("disk_read_bytes")),
                human_bytes(latest.get("disk_write_bytes")),
                str(latest.get("processes", "-")),
                labels or "-",
            )
        )
    # Names and labels are whatever a user registered: escaped, so no terminal control
    # sequence reaches the screen of whoever reads the table (often root).
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no registered targets)")
    lines.append("CPU% is percent of one core; READ/WRITE are bytes to storage since start.")
    return "\n".join(lines)
