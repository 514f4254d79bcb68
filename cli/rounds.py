"""`edgewatt report fl.jsonl` for a federation: the records `edgewatt.client.flower`'s
collector wrote (one per client per round) as a per-round table: clients, the slowest
client and by how much, energy and bytes, each with its unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgewatt.cli.status import human_bytes
from edgewatt.core.text import printable

KIND = "fl-round"


def is_rounds_file(path: str) -> bool:
    with open(path) as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line).get("type") == KIND
                except (ValueError, AttributeError):
                    return False
    return False


def load_rounds(path: str) -> list[dict[str, Any]]:
    """The collector's records; a bad line names its number."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            ok = record["type"] == KIND and "round" in record and "node_id" in record
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise ValueError(f"{path}:{number}: not an edgewatt round record")
        records.append(record)
    return records


def _total(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) if values else None


def rounds_table(records: list[dict[str, Any]], title: str) -> str:
    """One row per round and kind: clients, duration of the slowest (the straggler)
    and how much longer it took than the fastest, CPU, energy and bytes summed."""
    rounds: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for record in records:
        rounds.setdefault((record["round"], record["kind"]), []).append(record)
    header = ("round", "kind", "clients", "slowest client", "CPU", "energy", "down", "up")
    rows = [header]
    for (number, kind), clients in sorted(rounds.items(), key=lambda item: str(item[0])):
        slowest = max(clients, key=lambda r: r["duration_s"])
        fastest = min(r["duration_s"] for r in clients)
        cpu = _total(clients, "cpu_s")
        energy = _total(clients, "energy_j")
        rows.append(
            (
                str(number),
                kind,
                str(len(clients)),
                f"node {slowest['node_id']} ({slowest.get('host_name', '?')}) "
                f"{slowest['duration_s']:.2f} s, +{slowest['duration_s'] - fastest:.2f} s",
                "unknown" if cpu is None else f"{cpu:.2f} s",
                "unknown" if energy is None else f"{energy:.1f} J",
                human_bytes(int(_total(clients, "bytes_received") or 0)),
                human_bytes(int(_total(clients, "bytes_sent") or 0)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
    sources = {r.get("bytes_source") for r in records if r.get("bytes_source")}
    if sources:
        lines.append(f"  bytes: {', '.join(sorted(sources))}")
    return "\n".join(printable(line.rstrip()) for line in lines)
