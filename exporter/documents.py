"""The JSON documents the registration API answers with, each built here (units in the
key names). A target's own description and summary are the target table's
(``TargetTable.describe``, ``.summary``), the same ones the client's in-process mode
returns; the daemon's health is health.py's. Everything the API wraps around
them, and the host's document, is built below."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgewatt.core.snapshot import Snapshot

TOP_MEMBERS = 32  # pids listed per target by GET /v1/top


def error(error: str, detail: str = "") -> dict[str, str]:
    """Every failure's body: ``error`` the short reason, ``detail`` what to fix."""
    return {"error": error, "detail": detail}


def registered(
    described: dict[str, Any], min_interval_s: float, refused: list[dict[str, Any]]
) -> dict[str, Any]:
    """POST /v1/targets: the target (a described one: a joined target's labels are
    all it has), the shortest interval between two fresh samples, for monitors' fresh
    reads, and what a joining registration asked and did not get (``conflicts``)."""
    keys = ("id", "kind", "pid", "cgroup", "start_time", "labels", "children")
    document = {k: described[k] for k in keys}
    return {**document, "min_interval_s": min_interval_s, "conflicts": refused}


def targets(described: list[dict[str, Any]]) -> dict[str, Any]:
    """GET /v1/targets."""
    return {"targets": described}


def phase_started(target_id: str, name: str, started_at: float, depth: int) -> dict[str, Any]:
    """POST /v1/targets/{id}/phase; ``depth``: how many phases it runs inside."""
    return {"target": target_id, "name": name, "started_at": started_at, "depth": depth}


def phase_ended(
    target_id: str, name: str | None = None, summary: dict[str, Any] | None = None
) -> dict[str, Any]:
    """DELETE /v1/targets/{id}/phase: the phase that ended and its summary item, null
    both when none ran."""
    return {"target": target_id, "ended": name, "phase": summary}


def samples(target_id: str, units: dict[str, str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GET /v1/targets/{id}/samples: the rows and each field's unit."""
    return {"target": target_id, "units": units, "samples": rows}


def top_target(
    described: dict[str, Any],
    summary: dict[str, Any],
    members: tuple[int, ...] | list[int],
    network_rate: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One target of GET /v1/top: its description, summary, network rate over its last
    intervals (TargetTable.network_rate) and first pids (a cgroup of thousands is one
    count, not a long list)."""
    return {
        **described,
        "summary": summary,
        "network_rate": network_rate,
        "members": list(members[:TOP_MEMBERS]),
        "member_count": len(members),
    }


def top(
    device: dict[str, Any], health: dict[str, Any], targets: list[dict[str, Any]]
) -> dict[str, Any]:
    """GET /v1/top: `edgewatt top`'s one request a refresh."""
    return {"device": device, "health": health, "targets": targets}


def host(
    snapshot: Snapshot, recent: tuple[Mapping[str, float], float] = ({}, 0.0)
) -> dict[str, Any]:
    """GET /v1/host (and /v1/top's device): the host part of a snapshot; ``recent``:
    the power averaged over the last minute by rail ("" the total) and the seconds
    that average spans (recent_power.py)."""
    averages, span = recent
    host = snapshot.host
    power = snapshot.power
    document: dict[str, Any] = {
        "time": snapshot.time,
        "logical_cpus": host.cpu.logical_cpus if host else None,
        "cpu_utilization": host.cpu_utilization if host else None,
        # By CPU number ("0", "2"...): /proc/stat lists online CPUs only; null: one
        # that came online since the last pass.
        "cpu_core_utilization": {
            str(n): None if u is None else round(u, 4)
            for n, u in sorted(host.core_utilization.items() if host else ())
        },
        "memory_total_bytes": host.memory.total_bytes if host else None,
        "memory_used_bytes": host.memory.bytes_by_state["used"] if host else None,
        "network": {
            name: {"receive_bytes": io.receive, "transmit_bytes": io.transmit}
            for name, io in (host.network.items() if host else ())
        },
        "power": None
        if power is None
        else {
            "host_power_w": power.host_power_w,
            "host_energy_j": power.host_energy_j,
            "host_power_avg_w": averages.get(""),
            "avg_window_s": round(span, 3),
            "idle_power_w": snapshot.idle_power_w,
            "sources": list(power.sources),
            # What the device's energy is measured by (core/power/provenance.py).
            "provenance": None if power.provenance is None else power.provenance.as_dict(),
            "rails": {
                r.name: {
                    "id": r.id,
                    "type": r.type,
                    "power_w": r.power_w,
                    "power_avg_w": averages.get(r.name),
                    "energy_j": r.energy_j,
                }
                for r in power.rails
            },
            "temperatures_c": {
                f"{source}/{name}": value for (source, name), value in power.temperatures_c.items()
            },
            "gpus": [
                {
                    "id": g.id,
                    "name": g.name,
                    "utilization": g.utilization,
                    "frequency_mhz": g.frequency_mhz,
                    "power_w": g.power_w,
                }
                for g in power.gpus
            ],
        },
        # The device's setting as last read (core/platforms/context.py); null before the first read.
        "context": None if snapshot.context is None else snapshot.context.document(),
    }
    carbon = snapshot.carbon
    if carbon is not None:  # absent, not null, when no intensity is configured
        energy = power.host_energy_j if power else None
        document["carbon"] = {
            "intensity_g_per_kwh": carbon.g_per_kwh,
            "source": carbon.source,
            "host_g": None if energy is None else carbon.grams(energy),
        }
    return document
