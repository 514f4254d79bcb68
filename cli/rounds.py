"""`edgewatt report fl.jsonl` for a federation: the records `edgewatt.client.flower`'s
collector wrote (one per client per round) as a per-round table: clients, the slowest
client and by how much, energy and bytes, each with its unit."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgewatt.cli.jsonl import Lines, check_numbers, is_number
from edgewatt.cli.plotting import pyplot
from edgewatt.cli.status import human_bytes
from edgewatt.client.fl_record import KIND
from edgewatt.core.text import printable


def is_rounds_file(path: str) -> bool:
    """Whether the file's first line is a round record (the collector's)."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line).get("type") == KIND
                except (ValueError, AttributeError):
                    return False
    return False


# The figures a round record holds as numbers where present.
NUMBERS = ("duration_s", "cpu_s", "energy_j", "device_energy_j", "bytes_received", "bytes_sent")
KINDS = ("train", "evaluate")  # in the order a round runs them


def load_rounds(path: str, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The collector's records; a bad line or field names file and line, a cut-off
    last line is skipped and passed to ``warn``."""
    lines = Lines(path)
    for warning in lines.warnings:
        (warn or (lambda _: None))(warning)
    records = []
    for number, record in lines.records:
        if record.get("type") != KIND or "round" not in record or "node_id" not in record:
            raise lines.error(number, "not an edgewatt round record")
        if not isinstance(record.get("kind"), str):
            raise lines.error(number, "kind must be a string")
        check_numbers(lines, number, record, NUMBERS)
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no rounds: nothing to report")
    return records


def round_order(key: tuple[Any, str]) -> tuple[Any, ...]:
    """Rounds by number (2 before 10), a round's train before its evaluate; a round
    named by a Flower group id that is no number after the numbered ones."""
    number, kind = key
    numbered = is_number(number)
    kind_rank = KINDS.index(kind) if kind in KINDS else len(KINDS)
    return (not numbered, number if numbered else 0, "" if numbered else str(number),
            kind_rank, kind)  # fmt: skip


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
    for (number, kind), clients in sorted(rounds.items(), key=lambda item: round_order(item[0])):
        slowest = _slowest(clients)
        timed = [r["duration_s"] for r in clients if r.get("duration_s") is not None]
        cpu = _total(clients, "cpu_s")
        energy = _total(clients, "energy_j")
        rows.append(
            (
                str(number),
                kind,
                str(len(clients)),
                "unknown"
                if slowest is None
                else f"{_client(slowest)} {max(timed):.2f} s, +{max(timed) - min(timed):.2f} s",
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
    # Where the clients' energy comes from, as each said (client/flower.py).
    for line in sorted({r["energy_provenance"] for r in records if r.get("energy_provenance")}):
        lines.append(f"  energy: {line}")
    return "\n".join(printable(line.rstrip()) for line in lines)


# What the rounds plot draws, each panel one quantity per client per round:
# (axis label with its unit, record key, scale).
ROUND_PANELS = (
    ("duration (s)", "duration_s", 1.0),
    ("CPU (s)", "cpu_s", 1.0),
    ("energy attributed (J)", "energy_j", 1.0),
    ("device energy (J)", "device_energy_j", 1.0),
    ("received from the server (MiB)", "bytes_received", 1 / 2**20),
    ("sent to the server (MiB)", "bytes_sent", 1 / 2**20),
)


@dataclass(frozen=True)
class RoundsLayout:
    """What the rounds plot shows, apart from drawing it: tested without pixels."""

    title: str
    rounds: list[str]  # "3/train", in order
    clients: list[str]  # "node 1234 (host)"
    # (axis label, {client: [value per round, None where it sent none]})
    panels: list[tuple[str, dict[str, list[float | None]]]]
    stragglers: list[str]  # per round: the client that took longest, marked on the plot


def _client(record: dict[str, Any]) -> str:
    return f"node {record['node_id']} ({record.get('host_name', '?')})"


def _slowest(clients: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The client that took longest; None where none sent its duration (the collector
    drops one that is not a number within bounds)."""
    timed = [r for r in clients if r.get("duration_s") is not None]
    return max(timed, key=lambda r: r["duration_s"]) if timed else None


def rounds_layout(records: list[dict[str, Any]], title: str) -> RoundsLayout:
    """Grouped bars: per round and kind, one bar per client; a panel per quantity any
    record has (energy only where a sensor measured it)."""
    keys = sorted({(r["round"], r["kind"]) for r in records}, key=round_order)
    rounds = [f"{number}/{kind}" for number, kind in keys]
    clients = sorted({_client(r) for r in records})
    by = {(_client(r), (r["round"], r["kind"])): r for r in records}
    panels = []
    for label, key, scale in ROUND_PANELS:
        if not any(r.get(key) is not None for r in records):
            continue
        values = {
            c: [
                None if by.get((c, k), {}).get(key) is None else by[(c, k)][key] * scale
                for k in keys
            ]
            for c in clients
        }
        panels.append((label, values))
    slowest = [_slowest([r for r in records if (r["round"], r["kind"]) == k]) for k in keys]
    stragglers = ["" if r is None else _client(r) for r in slowest]
    numbers = {number for number, _ in keys}
    kinds = [k for k in (*KINDS, *sorted({kind for _, kind in keys} - set(KINDS)))
             if any(kind == k for _, kind in keys)]  # fmt: skip
    title = (
        f"{title}: {_count(len(numbers), 'round')} ({' and '.join(kinds)}), "
        f"{_count(len(clients), 'client')}"
    )
    return RoundsLayout(title, rounds, clients, panels, stragglers)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def plot_rounds(drawn: RoundsLayout, out: str) -> None:
    """The rounds as grouped bars, one colour per client (needs edgewatt[plot])."""
    plt = pyplot()
    rows = max(1, len(drawn.panels))
    many = len(drawn.rounds) > 8  # labels turned upright, the straggler by its edge alone
    width = max(9.0, 0.4 * len(drawn.rounds))
    fig, axes = plt.subplots(
        rows, 1, sharex=True, figsize=(width, 1.4 + 1.8 * rows + (0.5 if many else 0)),
        squeeze=False,
    )  # fmt: skip
    width = 0.8 / max(1, len(drawn.clients))
    positions = range(len(drawn.rounds))
    for ax, (label, values) in zip(axes[:, 0], drawn.panels):
        for i, client in enumerate(drawn.clients):
            xs = [p - 0.4 + width * (i + 0.5) for p in positions]
            ys = [0.0 if v is None else v for v in values[client]]
            slowest = [s == client for s in drawn.stragglers]
            ax.bar(xs, ys, width=width * 0.95, color=f"C{i % 10}",
                   edgecolor=["black" if s else "none" for s in slowest],
                   linewidth=1.2)  # fmt: skip
            if label == ROUND_PANELS[0][0] and not many:  # named on its duration bar
                for x, y, s in zip(xs, ys, slowest):
                    if s:
                        ax.annotate("slowest", (x, y), ha="center", va="bottom", fontsize=7)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)  # room for the straggler's mark
    if drawn.panels:  # above the bars, never over them
        from matplotlib.patches import Patch

        handles = [Patch(color=f"C{i % 10}", label=c) for i, c in enumerate(drawn.clients)]
        handles.append(Patch(facecolor="white", edgecolor="black", label="slowest of its round"))
        axes[0, 0].legend(
            handles=handles,
            fontsize=7,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncol=min(3, len(handles)),
            frameon=False,
        )
    else:
        axes[0, 0].text(0.5, 0.5, "no rounds in this file", ha="center", va="center")
    axes[-1, 0].set_xticks(list(positions))
    axes[-1, 0].set_xticklabels(drawn.rounds, fontsize=8, rotation=90 if many else 0)
    axes[-1, 0].set_xlabel("round/kind")
    fig.suptitle(drawn.title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
