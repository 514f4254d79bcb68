"""`edgewatt report FILE.jsonl [--plot out.png]`, and the summary table `edgewatt run`
prints: one line per figure, each with its unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgewatt.cli.status import human_bytes


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
    if "memory_rss_peak_bytes" in summary:
        rows.append(("peak RSS", human_bytes(summary["memory_rss_peak_bytes"])))
    if "total_network_bytes_sent" in summary:
        sent = human_bytes(summary["total_network_bytes_sent"])
        recv = human_bytes(summary["total_network_bytes_recv"])
        rows.append(("network", f"sent {sent}, received {recv} (host-wide, loopback excluded)"))
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
    return "\n".join([title, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


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


def plot(samples: list[dict[str, Any]], phases: list[dict[str, Any]], out: str) -> None:
    """CPU, memory, network and power over time, phases shaded (needs edgewatt[plot])."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install 'edgewatt[plot]'") from exc
    t0 = samples[0]["timestamp"] if samples else 0.0
    panels = [
        ("cpu_usage", "CPU (% of one core)", 1.0),
        ("memory_rss_bytes", "RSS (MiB)", 1 / 2**20),
        ("network_bytes_sent", "network sent (bytes / interval)", 1.0),
        ("power_w", "device power (W)", 1.0),
    ]
    panels = [p for p in panels if any(p[0] in s for s in samples)]
    fig, axes = plt.subplots(
        len(panels), 1, sharex=True, figsize=(9, 2.2 * len(panels)), squeeze=False
    )
    # Each phase ends where the next begins; the last at the last sample. A file
    # without phases (every file `edgewatt run` writes) shades nothing.
    ends = [p["timestamp"] for p in phases[1:]]
    if phases:
        ends.append(samples[-1]["timestamp"] if samples else t0)
    for ax, (key, label, scale) in zip(axes[:, 0], panels, strict=True):
        points = [(s["timestamp"] - t0, s[key] * scale) for s in samples if key in s]
        ax.plot([x for x, _ in points], [y for _, y in points], linewidth=1.2)
        ax.set_ylabel(label, fontsize=8)
        for i, (phase, end) in enumerate(zip(phases, ends, strict=True)):
            ax.axvspan(phase["timestamp"] - t0, end - t0, alpha=0.12, color=f"C{i % 10}")
            if ax is axes[0, 0]:
                ax.text(
                    phase["timestamp"] - t0, ax.get_ylim()[1], phase["name"], fontsize=7, va="top"
                )
    axes[-1, 0].set_xlabel("time since start (s)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def summary_from_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary for a file whose run never wrote one (it was killed)."""
    summary: dict[str, Any] = {"samples": len(samples)}
    if len(samples) < 2:
        return summary
    times = [s["timestamp"] for s in samples]
    summary["duration_s"] = round(times[-1] - times[0], 3)
    cpu = [s["cpu_usage"] for s in samples if "cpu_usage" in s]
    if cpu:
        summary["cpu_time_s"] = sum(
            s["cpu_usage"] / 100 * (t1 - t0)
            for s, t0, t1 in zip(samples[1:], times, times[1:], strict=False)
            if "cpu_usage" in s
        )
        span = times[-1] - times[0]
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
        plot(samples, phases, plot_to)
        text += f"\n  plot written to {plot_to}"
    return text
