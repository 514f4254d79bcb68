"""`edgewatt status`: the registered targets as a table a person can read, and the
finished ones the daemon still keeps (exited, or let go by their last registration)."""

from __future__ import annotations

import math
import time
from typing import Any

from edgewatt.core import transport
from edgewatt.core.text import printable


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def render(
    targets: list[dict[str, Any]],
    logical_cpus: int | None = None,
    finished: dict[str, dict[str, Any]] | None = None,
    retention_s: float | None = None,
) -> str:
    """One row per running target (CPU as percent of one core, sizes in binary
    units), then the finished ones the daemon still keeps, from their summaries
    (``finished``: id -> summary; those without one are left out)."""
    running = [t for t in targets if t["state"] == "running"]
    lines = _running(running, logical_cpus)
    ended = [(t, finished[t["id"]]) for t in targets if t["id"] in (finished or {})]
    ended.sort(key=lambda pair: pair[0].get("exited_at") or 0.0)
    if ended:
        kept = f", kept {retention_s:g} s after their end" if retention_s is not None else ""
        lines += ["", f"finished{kept}:", *_aligned(finished_rows(ended))]
        more = sum(t["state"] != "running" for t in targets) - len(ended)
        if more > 0:
            lines.append(f"({more} older finished targets: edgewatt status --json)")
        lines += [
            "CPU is CPU seconds while registered; ENERGY joules attributed (-: no power",
            "source); PSS PEAK the largest PSS sampled (what it held, shared pages split);",
            "EXIT from the kernel's exit record.",
        ]
    return "\n".join(lines)


# Finished targets shown, the newest (a process registering and letting go in a loop
# leaves up to max_targets of them); the others are counted.
FINISHED_SHOWN = 20


def finished_summaries(socket: str, targets: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The summaries of the newest FINISHED_SHOWN finished targets among ``targets``
    (one request each; one purged meanwhile is left out)."""
    summaries = {}
    finished = [t for t in targets if t["state"] != "running"]
    finished.sort(key=lambda t: t.get("exited_at") or 0.0)
    for target in finished[-FINISHED_SHOWN:]:
        try:
            summaries[target["id"]] = transport.call_ok(
                socket, "GET", f"/v1/targets/{target['id']}/summary"
            )
        except transport.DaemonError:
            continue  # purged since the listing
    return summaries


def _running(targets: list[dict[str, Any]], logical_cpus: int | None) -> list[str]:
    header = ("ID", "PID", "NAME", "STATE", "CPU%", "PSS", "READ", "WRITE", "PROCS", "LABELS")
    rows = [header]
    for t in targets:
        latest = t.get("latest") or {}
        util = latest.get("cpu_utilization")
        cpu = "-" if util is None or not logical_cpus else f"{util * logical_cpus * 100:.1f}"
        rows.append(
            (
                t["id"],
                str(t["pid"]) if t.get("kind", "process") == "process" else "cgroup",
                name_of(t),
                t["state"],
                cpu,
                human_bytes(latest.get("memory_pss_bytes")),
                human_bytes(latest.get("disk_read_bytes")),
                human_bytes(latest.get("disk_write_bytes")),
                str(latest.get("processes", "-")),
                _labels(t),
            )
        )
    lines = _aligned(rows)
    if len(rows) == 1:
        lines.append("(no registered targets)")
    lines += [
        "CPU% is percent of one core; READ/WRITE are bytes to storage since start;",
        "PSS is the memory it holds (its pages, shared ones split among their sharers).",
    ]
    return lines


def amount(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, or below 1 with as many as show two significant
    digits (a run of a few ms: 0.024 s, 0.0028 s of CPU and 0.065 J, not 0.0 s, 0.00 s
    and 0.1 J)."""
    if value == 0 or abs(value) >= 1:
        return f"{value:.{digits}f}"
    return f"{value:.{max(digits, 1 - math.floor(math.log10(abs(value))))}f}"


def finished_rows(ended: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[tuple[str, ...]]:
    """The header, then a row per finished target (as (target, summary)): its end (when,
    and how: exited or unregistered), exit status where known, CPU seconds, energy and
    peak memory, from its summary; `edgewatt top` shows the same cells."""
    header = ("ID", "PID", "NAME", "ENDED", "HOW", "EXIT", "CPU", "ENERGY", "PSS PEAK", "LABELS")
    rows = [header]
    for t, s in ended:
        cpu = None
        if s.get("cpu_user_s") is not None and s.get("cpu_system_s") is not None:
            cpu = s["cpu_user_s"] + s["cpu_system_s"]
        ended_at = t.get("exited_at")
        when = "-" if ended_at is None else time.strftime("%H:%M:%S UTC", time.gmtime(ended_at))
        code = s.get("exit_status")
        exit_status = "-" if code is None else f"signal {-code}" if code < 0 else str(code)
        rows.append(
            (
                t["id"],
                str(t["pid"]) if t.get("kind", "process") == "process" else "cgroup",
                name_of(t),
                when,
                t["state"],
                exit_status,
                "-" if cpu is None else f"{amount(cpu, 2)} s",
                "-" if s.get("energy_j") is None else f"{s['energy_j']:.3g} J",
                human_bytes(s.get("memory_pss_peak_bytes")),
                _labels(t),
            )
        )
    return rows


def name_of(target: dict[str, Any]) -> str:
    """What a target runs (``python train.py``), else its executable or cgroup name."""
    return target.get("command") or target.get("executable") or "-"


def _labels(target: dict[str, Any]) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(target.get("labels", {}).items()))
    return labels or "-"


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    # Names and labels are whatever a user registered: escaped, so no terminal control
    # sequence reaches the screen of whoever reads the table (often root).
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
