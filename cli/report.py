"""`edgewatt report FILE.jsonl [--plot out.png]`, and the summary table `edgewatt run`
prints: one line per figure, each with its unit."""

from __future__ import annotations

import json
import time
import typing  # runtime aliases: Python 3.8's builtins take no [...]
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgewatt.cli.plotting import pyplot
from edgewatt.cli.rounds import (
    is_rounds_file,
    load_rounds,
    plot_rounds,
    rounds_layout,
    rounds_table,
)
from edgewatt.cli.status import human_bytes
from edgewatt.core.text import printable


def summary_table(summary: dict[str, Any], title: str) -> str:
    rows: list[tuple[str, str]] = []
    if "duration_s" in summary:
        rows.append(("duration", f"{summary['duration_s']:.1f} s"))
    if "cpu_time_s" in summary:
        rows.append(
            (
                "CPU time",
                f"{summary['cpu_time_s']:.2f} s (avg {summary['avg_cpu_usage']:.1f} % of one core)",
            )
        )
        if summary.get("cpu_source"):  # which count it is (edgewatt run's larger of two)
            rows.append(("counted by", printable(str(summary["cpu_source"]))))
    if "memory_rss_peak_bytes" in summary:
        rows.append(("peak RSS", human_bytes(summary["memory_rss_peak_bytes"])))
    if "total_network_bytes_sent" in summary:
        sent = human_bytes(summary["total_network_bytes_sent"])
        recv = human_bytes(summary["total_network_bytes_recv"])
        rows.append(("network", f"sent {sent}, received {recv} (host-wide, loopback excluded)"))
    if summary.get("network_unknown"):
        rows.append(("IP", f"sent and received unknown: {summary['network_unknown']}"))
    elif summary.get("network_transmit_bytes") is not None:
        sent = human_bytes(summary["network_transmit_bytes"])
        recv = human_bytes(summary.get("network_receive_bytes") or 0)
        counts = summary.get("network_counts")
        if counts == "ip-bytes":  # a cgroup's nftables counters
            what = "IP bytes of every connection, headers included"
            rows.append(("IP", f"sent {sent}, received {recv} ({what}, across its boundary)"))
        elif counts == "interface-bytes":  # a network namespace's interfaces
            what = "frames on its network namespace's interfaces"
            rows.append(("network", f"sent {sent}, received {recv} ({what})"))
        elif counts == "ip-bytes+interface-bytes":  # both, for namespaces of both kinds
            what = "IP bytes, and the frames of a namespace it may not enter"
            rows.append(("IP", f"sent {sent}, received {recv} ({what})"))
        else:
            rows.append(
                ("TCP", f"sent {sent}, received {recv} (the command's, across its boundary)")
            )
    energy = summary.get("energy_j", summary.get("energy_vdd_in_j"))
    if energy is not None:
        line = f"{energy:.1f} J ({energy / 3600:.4f} Wh)"
        if summary.get("avg_power_w") is not None:
            line += f", avg {summary['avg_power_w']:.2f} W"
        rows.append(("device energy", line))
    if summary.get("process_energy_j") is not None:
        mine = summary["process_energy_j"]
        rows.append(("attributed energy", f"{mine:.1f} J ({mine / 3600:.4f} Wh) above idle"))
    if summary.get("total_carbon_g") is not None:
        rows.append(
            (
                "carbon",
                f"{summary['total_carbon_g']:.4f} gCO2e of the device energy "
                f"(at {summary['carbon_intensity_g_per_kwh']:g} gCO2e/kWh)",
            )
        )
    if energy is None:
        rows.append(("energy", "unknown: no power source on this device"))
    rows.append(("samples", str(summary.get("samples", 0))))
    width = max(len(k) for k, _ in rows)
    lines = [title, *(f"  {k.ljust(width)}  {v}" for k, v in rows)]
    return "\n".join(printable(line) for line in lines)  # the title quotes a command line


def load(
    path: str,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    """(header, samples, phases, summary) of a monitor file; a bad line names its number."""
    header: dict[str, Any] = {}
    samples, phases = [], []
    summary = None
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record.pop("type")
        except (ValueError, KeyError, AttributeError, TypeError):
            raise ValueError(f"{path}:{number}: not an edgewatt monitor record") from None
        if kind == "header":
            header = record
        elif kind == "sample":
            samples.append(record)
        elif kind == "phase":
            phases.append(record)
        elif kind == "summary":
            summary = record
    return header, samples, phases, summary


Line = typing.Tuple[
    str, typing.List[float], typing.List[float]
]  # (name, seconds since start, values)


@dataclass(frozen=True)
class Layout:
    """What a plot shows, apart from drawing it: tested without reading pixels."""

    title: str
    panels: list[tuple[str, list[Line]]]  # (axis label with its unit, lines)
    phases: list[tuple[str, float, float]]  # (name, start, end) in seconds since start
    end_s: float


def layout(
    header: dict[str, Any],
    samples: list[dict[str, Any]],
    phases: list[dict[str, Any]],
    summary: dict[str, Any],
) -> Layout:
    # Time 0 is the start of the run: the header's, else the first mark or sample.
    marks = [s["timestamp"] for s in samples] + [p["timestamp"] for p in phases]
    t0 = header.get("started_at") or summary.get("start_time") or min(marks, default=0.0)
    t0 = min([t0, *marks])
    times = [s["timestamp"] - t0 for s in samples]
    end = max(times, default=0.0)
    # Each phase ends where the next begins; the last at the last sample.
    starts = [p["timestamp"] - t0 for p in phases]
    ends = [*starts[1:], end] if phases else []
    spans = [(p["name"], a, b) for p, a, b in zip(phases, starts, ends)]
    return Layout(_title(header, summary), _panels(samples, times), spans, end)


def plot(drawn: Layout, out: str) -> None:
    """CPU, memory, network and power over time, phases shaded, titled with what ran
    where and when (needs edgewatt[plot])."""
    plt = pyplot()
    rows = max(1, len(drawn.panels))
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(9, 1.2 + 2.0 * rows), squeeze=False)
    for ax, (label, lines) in zip(axes[:, 0], drawn.panels):
        for name, xs, ys in lines:
            ax.plot(xs, ys, linewidth=1.2, label=name)
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7, loc="upper right")
        for i, (name, start, stop) in enumerate(drawn.phases):
            ax.axvspan(start, stop, alpha=0.12, color=f"C{i % 10}")
            if ax is axes[0, 0]:
                ax.text(start, ax.get_ylim()[1], f" {name}", fontsize=7, va="top")
    if not drawn.panels:
        axes[0, 0].text(0.5, 0.5, "no samples in this file", ha="center", va="center")
    axes[0, 0].set_xlim(left=0, right=max(drawn.end_s, 1e-3))
    axes[-1, 0].set_xlabel("time since start (s)")
    fig.suptitle(drawn.title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _panels(samples: list[dict[str, Any]], times: list[float]) -> list[tuple[str, list[Line]]]:
    """(axis label with its unit, [(line name, x, y)]) for each quantity the file has."""

    def series(key: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        points = [(t, s[key] * scale) for t, s in zip(times, samples) if key in s]
        return [t for t, _ in points], [y for _, y in points]

    def rate(key: str) -> tuple[list[float], list[float]]:
        # Bytes per interval over that interval's length: KiB/s whatever the interval.
        xs, ys = [], []
        for i in range(1, len(samples)):
            dt = times[i] - times[i - 1]
            if key in samples[i] and dt > 0:
                xs.append(times[i])
                ys.append(samples[i][key] / dt / 1024)
        return xs, ys

    panels: list[tuple[str, list[Line]]] = []
    if any("cpu_usage" in s for s in samples):
        panels.append(("CPU (% of one core)", [("CPU", *series("cpu_usage"))]))
    if any("memory_rss_bytes" in s for s in samples):
        panels.append(("RSS (MiB)", [("RSS", *series("memory_rss_bytes", 1 / 2**20))]))
    if any(s.get("network_bytes_sent") or s.get("network_bytes_recv") for s in samples):
        panels.append(
            (
                "network (KiB/s)",
                [("sent", *rate("network_bytes_sent")), ("received", *rate("network_bytes_recv"))],
            )
        )
    if any("power_w" in s for s in samples):
        panels.append(("device power (W)", [("power", *series("power_w"))]))
    return panels


def _title(header: dict[str, Any], summary: dict[str, Any]) -> str:
    labels = header.get("labels") or {}
    what = header.get("command") or ", ".join(f"{k}={v}" for k, v in labels.items())
    what = what or f"pid {header.get('pid', '?')}"
    what = what if len(what) <= 70 else what[:67] + "..."
    started = header.get("started_at") or summary.get("start_time")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)) if started else "?"
    figures = []
    if "duration_s" in summary:
        figures.append(f"{summary['duration_s']:.1f} s")
    if "cpu_time_s" in summary:
        figures.append(f"CPU {summary['cpu_time_s']:.2f} s")
    if "memory_rss_peak_bytes" in summary:
        figures.append(f"peak RSS {human_bytes(summary['memory_rss_peak_bytes'])}")
    if "total_network_bytes_sent" in summary:
        sent, recv = summary["total_network_bytes_sent"], summary["total_network_bytes_recv"]
        figures.append(
            f"network sent {human_bytes(sent)}, received {human_bytes(recv)}"
            if sent or recv
            else "no network traffic"
        )
    energy = summary.get("energy_j", summary.get("energy_vdd_in_j"))
    if energy is not None:
        figures.append(f"device energy {energy:.1f} J")
    if summary.get("process_energy_j") is not None:
        figures.append(f"attributed {summary['process_energy_j']:.1f} J")
    lines = [what, f"on {header.get('host', '?')}, {when}:"]
    for figure in figures:  # wrapped between figures, never inside one
        if len(lines[-1]) + len(figure) > 105:
            lines[-1] += ","
            lines.append(figure)
        else:
            lines[-1] += ("" if lines[-1].endswith(":") else ",") + " " + figure
    return "\n".join(lines)


def summary_from_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary for a file whose run never wrote one (it was killed)."""
    summary: dict[str, Any] = {"samples": len(samples)}
    if len(samples) < 2:
        return summary
    times = [s["timestamp"] for s in samples]
    span = times[-1] - times[0]
    summary["duration_s"] = round(span, 3)
    if any("cpu_usage" in s for s in samples):
        summary["cpu_time_s"] = sum(
            s["cpu_usage"] / 100 * (t1 - t0)
            for s, t0, t1 in zip(samples[1:], times, times[1:])
            if "cpu_usage" in s
        )
        summary["avg_cpu_usage"] = summary["cpu_time_s"] / span * 100 if span > 0 else 0.0
    rss = [s["memory_rss_bytes"] for s in samples if "memory_rss_bytes" in s]
    if rss:
        summary["memory_rss_peak_bytes"] = max(rss)
    if any("network_bytes_sent" in s for s in samples):
        summary["total_network_bytes_sent"] = sum(s.get("network_bytes_sent", 0) for s in samples)
        summary["total_network_bytes_recv"] = sum(s.get("network_bytes_recv", 0) for s in samples)
    if any("energy_j" in s for s in samples):
        summary["energy_j"] = sum(s.get("energy_j", 0.0) for s in samples)
        if summary["duration_s"] > 0:
            summary["avg_power_w"] = summary["energy_j"] / summary["duration_s"]
    return summary


def report(path: str, plot_to: str | None) -> str:
    if is_rounds_file(path):  # a federation's per-round records (client/flower.py)
        records = load_rounds(path)
        text = rounds_table(records, f"edgewatt report: {path} (federated rounds)")
        if plot_to:
            drawn = rounds_layout(records, path)
            plot_rounds(drawn, plot_to)
            text += f"\n  plot written to {plot_to}"
        return text
    header, samples, phases, summary = load(path)
    if summary is None:
        summary = summary_from_samples(samples)
    title = (
        f"edgewatt report: {path} (pid {header.get('pid', '?')}, host {header.get('host', '?')})"
    )
    text = summary_table(summary, title)
    if phases:
        text += "\n  phases: " + ", ".join(p["name"] for p in phases)
    if plot_to:
        plot(layout(header, samples, phases, summary), plot_to)
        text += f"\n  plot written to {plot_to}"
    return text
