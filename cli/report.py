"""`edgewatt report FILE.jsonl [--plot out.png]`, and the summary table `edgewatt run`
prints: one line per figure, each with its unit."""

from __future__ import annotations

import sys
import time
import typing  # runtime aliases: Python 3.8's builtins take no [...]
from dataclasses import dataclass, field
from typing import Any

from edgewatt.cli.device import context_line
from edgewatt.cli.jsonl import Lines, check_numbers
from edgewatt.cli.phases import PEAK_POWER, phase_table
from edgewatt.cli.plotting import pyplot
from edgewatt.cli.rounds import (
    is_rounds_file,
    load_rounds,
    plot_rounds,
    rounds_layout,
    rounds_table,
)
from edgewatt.cli.spreads import KEYS, spread_rows
from edgewatt.cli.status import amount, human_bytes
from edgewatt.client._samples import HOST_NETWORK_KEYS
from edgewatt.core.channels import CHANNELS, EXPORTED, NAMES
from edgewatt.core.energy_source import line as energy_source
from edgewatt.core.text import printable

# What a process target's TCP figures miss (a cgroup target's counters do not).
ESCAPES = "a connection opened and closed between two passes escapes it"


def summary_table(
    summary: dict[str, Any],
    title: str,
    power: str | None = None,
    phases: list[dict[str, Any]] | None = None,
    host_network: bool = True,
) -> str:
    """The figures of a run, one line each with its unit, then a table of ``phases``
    (items with the daemon's keys). ``power``: what is known of the power source where
    the summary has no energy ("present", "none", "off": the monitor's power metric was
    off; None: not known). ``host_network``: whether the summary's total network bytes
    are the host's (a monitor's samples), shown apart under "host", or the process's own
    (the heflwr drop-ins' process scope)."""
    rows: list[tuple[str, str]] = []
    device = context_line(summary.get("context"))
    if device:
        rows.append(("device", device))
    if "duration_s" in summary:
        rows.append(("duration", f"{amount(summary['duration_s'], 1)} s"))
    covered = summary.get("covers")
    if isinstance(covered, dict) and covered.get("whole") is False:
        rows.append(("covers", covers_line(covered)))  # part of the run: which part
    if "cpu_time_s" in summary:
        rows.append(
            (
                "CPU time",
                f"{amount(summary['cpu_time_s'], 2)} s (avg {summary['avg_cpu_usage']:.1f} % of "
                "one core)",
            )
        )
        if summary.get("cpu_source"):  # which count it is (edgewatt run's larger of two)
            rows.append(("counted by", printable(str(summary["cpu_source"]))))
    rows += memory_rows(summary)
    rows += disk_rows(summary)
    rows += counter_rows(summary)
    rows += network_rows(summary, host_network)
    energy = summary.get("energy_j", summary.get("energy_vdd_in_j"))
    if energy is not None:
        line = f"{amount(energy, 1)} J ({amount(energy / 3600, 4)} Wh)"
        if summary.get("avg_power_w") is not None:
            line += f", avg {summary['avg_power_w']:.2f} W"
        rows.append(("device energy", line))
    if energy is not None and summary.get("process_energy_j") is not None:
        # A share of the device's energy: none where that was not measured.
        mine = summary["process_energy_j"]
        rows.append(("attributed energy", f"{amount(mine, 1)} J ({amount(mine / 3600, 4)} Wh) "
                     "above idle"))  # fmt: skip
    if summary.get("total_carbon_g") is not None:
        rows.append(
            (
                "carbon",
                f"{summary['total_carbon_g']:.4f} gCO2e of the device energy "
                f"(at {summary['carbon_intensity_g_per_kwh']:g} gCO2e/kWh)",
            )
        )
    if energy is None:
        rows.append(("energy", _energy_unknown(summary, power)))
    provenance = summary.get("energy_provenance") or summary.get("device_energy_provenance")
    if energy is not None and isinstance(provenance, dict):  # unknown: the row above says
        rows.append(("energy from", printable(energy_source(provenance))))
    rows.append(("samples", str(summary.get("samples", 0))))
    if summary.get("final") is False:  # waited for, and still not come
        rows.append(("not final", "the power reading after the last edge never came"))
    rows += spread_rows(summary)
    width = max(len(k) for k, _ in rows)
    lines = [title, *(f"  {k.ljust(width)}  {v}" for k, v in rows)]
    host = [k for k in HOST_NETWORK_KEYS if k in summary] or (
        list(TOTAL_KEYS) if host_network and TOTAL_KEYS[0] in summary else []
    )
    if host:
        # The device's, never in a row of the command's: the host's bytes are not its.
        sent, recv = (human_bytes(summary.get(k)) for k in host)
        lines += [
            "  host (every process on the device, not the command's figures):",
            f"    network  sent {sent}, received {recv} (every interface but loopback)",
        ]
    lines = [printable(line) for line in lines]  # the title quotes a command line
    return "\n".join(
        [*lines, *phase_table(phases or [], dropped=summary.get("phases_dropped") or 0)]
    )


# A monitor's network bytes (its samples'); the host's apart are HOST_NETWORK_KEYS
# (edgewatt run's).
TOTAL_KEYS = ("total_network_bytes_sent", "total_network_bytes_recv")

# What the command's bytes count, by the daemon's network_counts: one name, "network".
NETWORK_COUNTS = {
    "ip-bytes": "IP bytes of every connection, headers included, across its boundary",
    "interface-bytes": "frames on its network namespace's interfaces",
    "ip-bytes+interface-bytes": "IP bytes, and the frames of a namespace it may not enter",
    "process": "the process tree's TCP bytes, loopback to other processes included",
}


def network_rows(summary: dict[str, Any], host_network: bool) -> list[tuple[str, str]]:
    """The command's own bytes, under one name with what they count; a monitor's
    totals only where they are the process's (else they are the host's: apart)."""
    if summary.get("network_unknown"):
        return [("network", f"sent and received unknown: {summary['network_unknown']}")]
    if summary.get("network_transmit_bytes") is not None:
        sent = human_bytes(summary["network_transmit_bytes"])
        recv = human_bytes(summary.get("network_receive_bytes") or 0)
        counts = summary.get("network_counts")
        what = NETWORK_COUNTS.get(
            str(counts), f"TCP bytes, the command's, across its boundary; {ESCAPES}"
        )
        # A process target's connections opened and closed between passes escape it.
        least = "at least " if summary.get("network_lower_bound") else ""
        return [("network", f"sent {least}{sent}, received {least}{recv} ({what})")]
    if "total_network_bytes_sent" in summary and not host_network:
        sent = human_bytes(summary["total_network_bytes_sent"])
        recv = human_bytes(summary["total_network_bytes_recv"])
        return [("network", f"sent {sent}, received {recv} ({NETWORK_COUNTS['process']})")]
    if any(k in summary for k in HOST_NETWORK_KEYS):  # edgewatt run sampled by itself
        return [("network", "not measured: the daemon counts a command's own bytes")]
    return []


def disk_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Bytes read from and written to storage (/proc/PID/io's read_bytes and
    write_bytes: what reached the block layer, not reads served from the page cache)."""
    if summary.get("disk_read_bytes") is None and summary.get("disk_write_bytes") is None:
        return []
    read, written = (human_bytes(summary.get(k)) for k in ("disk_read_bytes", "disk_write_bytes"))
    line = f"read {read}, written {written} (to and from storage, not the page cache)"
    if summary.get("disk_source"):
        line += f"; counted by {summary['disk_source']}"
    return [("disk", line)]


def counter_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """A row per channel metric, each of its channels' figures and words ("switches:
    N voluntary (waits), M involuntary (preempted)"); none where one is unknown."""
    rows = []
    for exported in EXPORTED:
        channels = [c for c in CHANNELS if c.metric is exported]
        figures = [summary.get(c.name) for c in channels]
        if None not in figures:
            words = ", ".join(f"{n} {c.words}" for n, c in zip(figures, channels))
            rows.append((exported.row, words))
    return rows


def covers_line(covers: dict[str, Any]) -> str:
    """What part of the run a summary's figures cover ("covers" where not "whole")."""

    def at(t: Any) -> str:
        return time.strftime("%H:%M:%S", time.gmtime(t)) if isinstance(t, (int, float)) else "?"

    parts = ["PART of the run"]
    if covers.get("from") is not None:
        parts.append(f"from {at(covers['from'])} UTC")
    gaps = covers.get("uncounted") or []
    if gaps:
        parts.append("not " + ", ".join(f"{at(a)}-{at(b)}" for a, b in gaps) + " UTC")
    return printable(" ".join(parts) + f": {covers.get('why') or 'unknown why'}")


def _energy_unknown(summary: dict[str, Any], power: str | None) -> str:
    """Why a summary has no energy, saying only what is known."""
    if power == "none":
        return "unknown: no power source on this device"
    if power == "off":
        return "not recorded (the monitor's power metric was off)"
    duration = summary.get("duration_s")
    lasted = "" if duration is None else f" ({duration:.2f} s)"
    if not summary.get("samples"):
        return f"unknown: the run{lasted} ended before a second reading"
    if power == "present":
        return f"unknown: the power source gave no reading during the run{lasted}"
    return "unknown: no power reading recorded"


def memory_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Peak memory, each figure under its own name: PSS (shared pages split among the
    processes sharing them: what the work holds), the largest process's RSS, and the
    RSS summed over the processes (a shared page once per process: more than held)."""
    rows = []
    # Never a bare "not measured": edgewatt run says why (a run no pass saw alive).
    unmeasured = "not measured: " + str(summary.get("memory_unmeasured") or "no reading")
    if "memory_pss_peak_bytes" in summary:
        pss = summary["memory_pss_peak_bytes"]
        rows.append(("peak PSS", unmeasured
                     if pss is None else f"{human_bytes(pss)} (what the processes held, "
                     "shared pages split among them)"))  # fmt: skip
    if summary.get("memory_rss_largest_peak_bytes") is not None:
        # Which figure: sampled by the passes, or the kernel's record at an exit.
        source = summary.get("memory_rss_largest_source")
        rows.append(
            (
                "largest",
                f"peak RSS {human_bytes(summary['memory_rss_largest_peak_bytes'])} "
                f"(of the largest process{'; ' + source if source else ''})",
            )
        )
    if summary.get("memory_cgroup_peak_bytes") is not None:
        peak = human_bytes(summary["memory_cgroup_peak_bytes"])
        rows.append(("cgroup peak", f"{peak} (the kernel's high-water mark of its cgroup's "
                     "memory, page cache included)"))  # fmt: skip
    if "memory_rss_peak_bytes" in summary:
        peak = summary["memory_rss_peak_bytes"]
        rows.append(("RSS sum", unmeasured if peak is None else f"peak {human_bytes(peak)} "
                     "(over the processes: a shared page counted once per process)"))  # fmt: skip
    return rows


# The figures each kind of record must hold as numbers where present.
SAMPLE_NUMBERS = (
    "timestamp", "cpu_usage", "memory_usage", "memory_rss_bytes", "memory_pss_bytes",
    "network_bytes_sent", "network_bytes_recv", *HOST_NETWORK_KEYS, "power_w",
    "power_vdd_in", "power_vdd_cpu_gpu_cv", "power_vdd_soc", "energy_j",
)  # fmt: skip
SUMMARY_NUMBERS = (
    "samples", "start_time", "end_time", "duration_s", "cpu_time_s", "avg_cpu_usage",
    "memory_rss_peak_bytes", "memory_pss_peak_bytes", "memory_rss_largest_peak_bytes",
    "total_network_bytes_sent", "total_network_bytes_recv",
    "energy_j", "energy_vdd_in_j", "avg_power_w", "process_energy_j", "total_carbon_g",
    "carbon_intensity_g_per_kwh", "network_transmit_bytes", "network_receive_bytes",
    "phases_dropped", "disk_read_bytes", "disk_write_bytes", *HOST_NETWORK_KEYS,
    "memory_cgroup_peak_bytes", *NAMES, *KEYS,
)  # fmt: skip


# A phase record's figures (edgewatt run writes the daemon's measured phases).
PHASE_NUMBERS = (
    "timestamp", "started_at", "ended_at", "duration_s", "cpu_user_s", "cpu_system_s",
    "energy_j", "device_energy_j", "memory_rss_peak_bytes", "memory_pss_peak_bytes",
    "memory_rss_largest_peak_bytes", "disk_read_bytes",
    "disk_write_bytes", "network_transmit_bytes", "network_receive_bytes", PEAK_POWER,
    *NAMES,
)  # fmt: skip


# A header's other fields, where present, as a title and the table read them.
HEADER_FIELDS = (
    ("command", str, "a string (the command line)"),
    ("host", str, "a string"),
    ("labels", dict, "an object"),
    ("metrics", dict, "an object"),
    ("units", dict, "an object"),
)


def load(
    path: str, warn: typing.Callable[[str], None] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    """(header, samples, phases, summary) of a monitor file; a bad line or field names
    file and line, a cut-off last line is skipped and passed to ``warn``."""
    lines = Lines(path)
    for warning in lines.warnings:
        (warn or (lambda _: None))(warning)
    header: dict[str, Any] = {}
    samples, phases = [], []
    summary = None
    starts = []  # each start() of the monitor: a header
    for number, record in lines.records:
        kind = record.pop("type", None)
        if kind == "header":
            check_numbers(lines, number, record, ("started_at", "pid", "interval_s"))
            for key, kind, what in HEADER_FIELDS:
                if record.get(key) is not None and not isinstance(record[key], kind):
                    raise lines.error(number, f"{key} must be {what}")
            if header and _run_of(record) != _run_of(header):
                # Another run appended to the same --output file: its figures alone.
                (warn or (lambda _: None))(
                    f"{path}:{number}: another run appended (pid {record.get('pid', '?')} "
                    f"after pid {header.get('pid', '?')}); reporting the last, from this line"
                )
                samples, phases, summary, starts = [], [], None, []
            header = record
            starts.append(record.get("started_at"))
        elif kind == "sample":
            if "timestamp" not in record:
                raise lines.error(number, "a sample without its timestamp")
            check_numbers(lines, number, record, SAMPLE_NUMBERS)
            samples.append(record)
        elif kind == "phase":
            check_numbers(lines, number, record, PHASE_NUMBERS)
            if not isinstance(record.get("name"), str) or "timestamp" not in record:
                raise lines.error(number, "a phase needs a name and a timestamp")
            phases.append(record)
        elif kind == "summary":
            check_numbers(lines, number, record, SUMMARY_NUMBERS)
            summary = record
        elif not isinstance(kind, str):
            raise lines.error(number, "not an edgewatt monitor record (no type)")
    if header:
        header["segment_starts"] = starts
    return header, samples, phases, summary


def _run_of(header: dict[str, Any]) -> tuple[Any, Any]:
    """What one run's headers share (a monitor writes one at each start())."""
    return header.get("pid"), header.get("edgewatt_pid")


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
    # (axis label, value, text): a level the title states (a peak), drawn dashed; the
    # axis holds it.
    levels: list[tuple[str, float, str]] = field(default_factory=list)
    # What each phase cost, in the phases' order: the key under the panels.
    costs: list[Cost] = field(default_factory=list)
    # Too few samples for curves (a short run): each phase's cost drawn as bars instead.
    bars: bool = False


@dataclass(frozen=True)
class Cost:
    """A phase's figures as the plot's key shows them (None: not measured)."""

    name: str
    seconds: float | None
    cpu_s: float | None
    device_j: float | None
    attributed_j: float | None

    @classmethod
    def of(cls, item: dict[str, Any]) -> Cost:
        user, system = item.get("cpu_user_s"), item.get("cpu_system_s")
        cpu = item.get("cpu_time_s") if user is None or system is None else user + system
        return cls(
            str(item.get("name", "?")),
            item.get("duration_s"),
            cpu,
            item.get("device_energy_j"),
            item.get("energy_j"),
        )


POWER = "device power (W)"
MAX_NAMED = 10  # phase names a plot writes (fontsize 7 across 9 inches)
MAX_KEYED = 40  # phases the key lists, the newest (a tracked step is a phase)
MIN_POINTS = 2  # samples under which curves say nothing: bars of each phase's cost
RSS = "memory (MiB)"
GOLDEN = (5**0.5 - 1) / 2  # no two multiples alike modulo 1: a new colour for each phase
COST_COLUMNS = ("", "phase", "seconds", "CPU (s)", "device (J)", "attributed (J)")


def layout(
    header: dict[str, Any],
    samples: list[dict[str, Any]],
    phases: list[dict[str, Any]],
    summary: dict[str, Any],
) -> Layout:
    # Time 0 is the start of the run: its first reading (the summary's start, which a
    # daemon may have taken before the header was written) or the header's, else the
    # first mark or sample.
    marks = [s["timestamp"] for s in samples] + [p["timestamp"] for p in phases]
    first = summary.get("start_time") or header.get("started_at")
    t0 = min([first, *marks]) if first is not None else min(marks, default=0.0)
    times = [s["timestamp"] - t0 for s in samples]
    end = max(times, default=0.0)
    spans = [(p["name"], a - t0, b - t0) for p, a, b in _spans(phases, end + t0)]
    # Where each sample's interval began: the previous sample, or the start of its
    # monitoring (each start() of a monitor writes a header; the first is the run's).
    starts = [first, *header.get("segment_starts", [])[1:]]
    segments = sorted(t - t0 for t in starts if t is not None)
    begins = []
    for i, t in enumerate(times):
        begin = times[i - 1] if i else (segments[0] if segments else t)
        begins.append(max([begin, *(b for b in segments if b < t)]))
    panels = _panels(samples, times, begins, _network(header))
    # The host's bytes apart, below the command's figures: they are not the command's.
    panels.sort(key=lambda panel: panel[0].startswith(HOST_NETWORK))
    # The summary's peaks on the memory axis, each named as its line is.
    levels = []
    drawn = {name for label, lines in panels if label == RSS for name, _, _ in lines}
    for name, key in (("RSS summed", "memory_rss_peak_bytes"), ("PSS", "memory_pss_peak_bytes")):
        peak = summary.get(key)
        if peak is not None and name in drawn:
            levels.append((RSS, peak / 2**20, f"{name} peak {human_bytes(peak)}"))
    host = _network(header) == HOST_NETWORK
    items = phase_figures(phases, samples, header.get("started_at"), host)
    costs = [Cost.of(item) for item in items]
    if not costs:  # a run without phases: its whole as one
        device = summary.get("energy_j", summary.get("energy_vdd_in_j"))
        mine = summary.get("process_energy_j")
        cpu = summary.get("cpu_time_s")
        costs = [Cost("whole run", summary.get("duration_s"), cpu, device, mine)]
    bars = len(samples) < MIN_POINTS
    return Layout(_title(header, summary), panels, spans, end, levels, costs, bars)


def phase_colours(count: int) -> list[Any]:
    """A distinct colour per phase: tab10 or tab20 where they suffice, else along a
    perceptual map by the golden ratio's steps (never a cycle: the 11th phase is not the
    1st's colour, and neighbours are far apart on the map)."""
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["turbo"](0.05 + 0.9 * (i * GOLDEN % 1.0)) for i in range(count)]


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else amount(value, digits)


def _spans(phases: list[dict[str, Any]], end: float) -> list[tuple[dict[str, Any], float, float]]:
    """(phase, start, end) in unix seconds: a measured phase (edgewatt run's) from its
    start to its own end; a mark (Monitor.phase()) to where the next begins, the last
    to ``end`` (the last sample)."""
    starts = [p["timestamp"] for p in phases]
    nexts = [*starts[1:], end]
    return [
        (p, a, p["ended_at"] if p.get("ended_at") is not None else b)
        for p, a, b in zip(phases, starts, nexts)
    ]


def phase_figures(
    phases: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    started_at: float | None,
    host_network: bool = True,
) -> list[dict[str, Any]]:
    """Each phase's figures: a measured phase's own, a mark's from the file's samples
    (edged by samples, as the daemon's phases are; a monitor takes a reading at each
    mark). ``host_network``: the samples' bytes are the host's, no phase's figure."""
    times = [s["timestamp"] for s in samples]
    begins = [started_at if started_at is not None else (times[0] if times else 0.0), *times]
    items = []
    for phase, start, stop in _spans(phases, times[-1] if times else 0.0):
        if "duration_s" in phase:
            items.append(phase)
            continue
        # The intervals that begin from its start until its end, as the daemon's
        # phases run from the first sample after the start to the first after the end:
        # adjacent phases share a sample, never an interval.
        inside = [i for i in range(len(times)) if start <= begins[i] < stop]
        figures = (
            summary_from_samples([samples[i] for i in inside], begins[inside[0]]) if inside else {}
        )
        items.append(
            {
                "name": phase["name"],
                "duration_s": figures.get("duration_s"),
                "cpu_time_s": figures.get("cpu_time_s"),
                "device_energy_j": figures.get("energy_j"),
                "memory_rss_peak_bytes": figures.get("memory_rss_peak_bytes"),
                "memory_pss_peak_bytes": figures.get("memory_pss_peak_bytes"),
                **(
                    {}
                    if host_network
                    else {
                        "network_transmit_bytes": figures.get("total_network_bytes_sent"),
                        "network_receive_bytes": figures.get("total_network_bytes_recv"),
                    }
                ),
            }
        )
    return items


def draw(drawn: Layout) -> Any:
    """The figure: CPU, memory, network and power over time, phases shaded in distinct
    colours, then each phase's cost (seconds, CPU, device and attributed joules) keyed
    by its colour; a short run's costs as bars. Titled with what ran where and when
    (needs edgewatt[plot])."""
    plt = pyplot()
    keyed = drawn.costs[-MAX_KEYED:]
    rows = 2 if drawn.bars else max(1, len(drawn.panels))
    key_in = 0.3 + 0.17 * (len(keyed) + 1)
    fig = plt.figure(figsize=(9, 1.2 + 2.0 * rows + key_in))
    grid = fig.add_gridspec(rows + 1, 1, height_ratios=[2.0] * rows + [key_in])
    colours = phase_colours(len(drawn.costs))
    if drawn.bars:
        _draw_bars(fig, grid, drawn.costs, colours)
    else:
        _draw_curves(fig, grid, drawn, colours)
    key = fig.add_subplot(grid[rows, 0])
    key.axis("off")
    cells = [
        ["", c.name, _figure(c.seconds, 3), _figure(c.cpu_s, 3), _figure(c.device_j, 2),
         _figure(c.attributed_j, 2)]
        for c in keyed
    ]  # fmt: skip
    if cells:
        table = key.table(
            cellText=cells,
            colLabels=COST_COLUMNS,
            cellColours=[[colour] + ["w"] * 5 for colour in colours[len(colours) - len(keyed) :]],
            loc="upper center",
            cellLoc="right",
            colWidths=[0.03, 0.37, 0.12, 0.12, 0.12, 0.14],
        )
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        for (_, column), cell in table.get_celld().items():
            cell.set_height(1 / (len(cells) + 1))
            cell.set_linewidth(0.3)
            if column == 1:
                cell.get_text().set_ha("left")
        what = "each phase's cost" if drawn.phases else "the run's cost"
        older = len(drawn.costs) - len(keyed)
        if older:
            what += f", the newest {len(keyed)} of {len(drawn.costs)} (the table has every one)"
        key.set_title(what + ": attributed is its share of the device energy above idle",
                      fontsize=8, loc="left")  # fmt: skip
    fig.suptitle(drawn.title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _draw_curves(fig: Any, grid: Any, drawn: Layout, colours: list[Any]) -> None:
    """The panels over time, sharing their time axis, each phase shaded in its colour."""
    axes: list[Any] = []
    for row, (label, lines) in enumerate(drawn.panels or [("", [])]):
        ax = fig.add_subplot(grid[row, 0], sharex=axes[0] if axes else None)
        axes.append(ax)
        top = 0.0
        for name, xs, ys in lines:
            # One point is drawn as a point (a line needs two), whole at the axes' edge.
            point = len(xs) == 1
            ax.plot(xs, ys, linewidth=1.2, label=name, marker="o" if point else None,
                    clip_on=not point)  # fmt: skip
            top = max([top, *ys])
        levels = [(value, text) for panel, value, text in drawn.levels if panel == label]
        for value, text in levels:
            ax.axhline(value, color="0.3", linestyle="--", linewidth=0.8)
            # The highest's name above its line, the others' below (close peaks, as PSS
            # and the RSS summed of one process, would write over each other).
            above = value >= max(v for v, _ in levels)
            ax.annotate(text, (0, value), xycoords=("axes fraction", "data"), fontsize=7,
                        va="bottom" if above else "top", color="0.3")  # fmt: skip
            top = max(top, value)
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(bottom=0, top=top * 1.12 if top > 0 else 1.0)  # the peaks inside
        ax.grid(alpha=0.3)
        if len(lines) > 1 or label == RSS:  # a memory line always says which memory
            ax.legend(fontsize=7, loc="upper right")
        # Every phase shaded in its own colour (the key below names each); at most
        # MAX_NAMED named on the plot, evenly, and only where the name has room.
        every = -(-len(drawn.phases) // MAX_NAMED)
        room = max(drawn.end_s, 1e-3) / MAX_NAMED
        for i, (name, start, stop) in enumerate(drawn.phases):
            ax.axvspan(start, stop, alpha=0.18, color=colours[i])
            if ax is axes[0] and i % every == 0 and stop - start >= room:
                ax.text(start, ax.get_ylim()[1], f" {name}", fontsize=7, va="top")
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[0].set_xlim(left=0, right=max(drawn.end_s, 1e-3))
    axes[-1].set_xlabel("time since start (s)")


def _draw_bars(fig: Any, grid: Any, costs: list[Cost], colours: list[Any]) -> None:
    """A short run: too few samples for curves, each phase's CPU and energy as bars."""
    names = [c.name for c in costs]
    spots = list(range(len(costs)))
    cpu = fig.add_subplot(grid[0, 0])
    cpu.bar(spots, [c.cpu_s or 0.0 for c in costs], color=colours)
    cpu.set_ylabel("CPU (s)", fontsize=8)
    energy = fig.add_subplot(grid[1, 0], sharex=cpu)
    width = 0.4
    energy.bar([x - width / 2 for x in spots], [c.device_j or 0.0 for c in costs], width,
               color=colours, label="device")  # fmt: skip
    energy.bar([x + width / 2 for x in spots], [c.attributed_j or 0.0 for c in costs], width,
               color=colours, hatch="//", alpha=0.6, label="attributed")  # fmt: skip
    energy.set_ylabel("energy (J)", fontsize=8)
    energy.legend(fontsize=7, loc="upper right")
    for ax in (cpu, energy):
        ax.grid(alpha=0.3, axis="y")
    cpu.tick_params(labelbottom=False)
    cpu.set_xlim(-0.75, max(len(costs), 3) - 0.25)  # one bar is not a wall
    energy.set_xticks(spots)
    energy.set_xticklabels(names, fontsize=7, rotation=30 if len(costs) > 6 else 0, ha="right"
                           if len(costs) > 6 else "center")  # fmt: skip
    cpu.set_title("too few samples for curves: each phase's cost", fontsize=8, loc="left")


def plot(drawn: Layout, out: str) -> None:
    """:func:`draw`, written to ``out``."""
    fig = draw(drawn)
    fig.savefig(out, dpi=100)
    pyplot().close(fig)


def _panels(
    samples: list[dict[str, Any]], times: list[float], begins: list[float], network: str
) -> list[tuple[str, list[Line]]]:
    """(axis label with its unit, [(line name, x, y)]) for each quantity the file has;
    ``network``: what its network bytes are, as the axis names them."""

    def series(key: str, scale: float = 1.0, held: bool = False) -> tuple[list[float], list[float]]:
        # held: memory, none where the sample found no page held (a command exited,
        # not yet reaped: a live process always maps some), rather than a drop to 0.
        points = [
            (t, s[key] * scale) for t, s in zip(times, samples) if key in s and (s[key] or not held)
        ]
        return [t for t, _ in points], [y for _, y in points]

    def rate(key: str) -> tuple[list[float], list[float]]:
        # Bytes per interval over that interval's length: KiB/s whatever the interval.
        xs, ys = [], []
        for sample, begin, t in zip(samples, begins, times):
            if key in sample and t > begin:
                xs.append(t)
                ys.append(sample[key] / (t - begin) / 1024)
        return xs, ys

    panels: list[tuple[str, list[Line]]] = []
    if any("cpu_usage" in s for s in samples):
        panels.append(("CPU (% of one core)", [("CPU", *series("cpu_usage"))]))
    if any("memory_rss_bytes" in s for s in samples):
        memory = [("RSS summed", *series("memory_rss_bytes", 1 / 2**20, held=True))]
        if any("memory_pss_bytes" in s for s in samples):  # what the processes hold
            memory.append(("PSS", *series("memory_pss_bytes", 1 / 2**20, held=True)))
        panels.append((RSS, memory))
    if any(s.get("network_bytes_sent") or s.get("network_bytes_recv") for s in samples):
        panels.append(
            (
                f"{network} (KiB/s)",
                [("sent", *rate("network_bytes_sent")), ("received", *rate("network_bytes_recv"))],
            )
        )
    if any("energy_j" in s for s in samples):
        steps = _mean_power(samples, times, begins)
        panels.append((POWER, [("mean power of each interval", *steps)]))
    elif any("power_w" in s for s in samples):
        # No energy counter: the readings, joined as the trapezoid that gave the energy.
        panels.append((POWER, [("power", *series("power_w"))]))
    return panels


def _mean_power(
    samples: list[dict[str, Any]], times: list[float], begins: list[float]
) -> tuple[list[float], list[float]]:
    """Each interval's energy over its length, held across the interval (a step): its
    area is the energy, so its mean over time is the title's energy over time."""
    xs: list[float] = []
    ys: list[float] = []
    for sample, begin, t in zip(samples, begins, times):
        if "energy_j" in sample and t > begin:
            watts = sample["energy_j"] / (t - begin)
            xs += [begin, t]
            ys += [watts, watts]
    return xs, ys


HOST_NETWORK = "host network"


def _network(header: dict[str, Any]) -> str:
    """What a file's network bytes are: a monitor's are the host's unless its header's
    units say the process's."""
    scope = (header.get("units") or {}).get("network_bytes_sent", "")
    return HOST_NETWORK if "host-wide" in scope else "network"


def _title(header: dict[str, Any], summary: dict[str, Any]) -> str:
    labels = header.get("labels") or {}
    what = header.get("command") or ", ".join(f"{k}={v}" for k, v in labels.items())
    what = what or f"pid {header.get('pid', '?')}"
    what = what if len(what) <= 70 else what[:67] + "..."
    started = header.get("started_at") or summary.get("start_time")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)) if started else "?"
    figures = []
    if "duration_s" in summary:
        figures.append(f"{amount(summary['duration_s'], 1)} s")
    if "cpu_time_s" in summary:
        figures.append(f"CPU {amount(summary['cpu_time_s'], 2)} s")
    # The memory held where known (the table has the others): the RSS summed counts a
    # shared page once per process.
    if summary.get("memory_pss_peak_bytes") is not None:
        figures.append(f"peak PSS {human_bytes(summary['memory_pss_peak_bytes'])}")
    elif summary.get("memory_rss_peak_bytes") is not None:
        figures.append(f"peak RSS summed {human_bytes(summary['memory_rss_peak_bytes'])}")
    elif summary.get("memory_rss_largest_peak_bytes") is not None:  # a run no pass saw
        largest = human_bytes(summary["memory_rss_largest_peak_bytes"])
        at_exit = str(summary.get("memory_rss_largest_source", "")).startswith("at exit")
        figures.append(f"largest process's peak RSS {largest}{' at exit' if at_exit else ''}")
    # The command's own bytes (edgewatt run's, the daemon's count), else a process
    # scope's; the host's never (a whole device's bytes are not the command's).
    own = ("network_transmit_bytes", "network_receive_bytes")
    if summary.get(own[0]) is None and _network(header) != HOST_NETWORK:
        own = ("total_network_bytes_sent", "total_network_bytes_recv")
    if summary.get(own[0]) is not None:
        sent, recv = summary[own[0]], summary.get(own[1]) or 0
        figures.append(f"network sent {human_bytes(sent)}, received {human_bytes(recv)}")
    energy = summary.get("energy_j", summary.get("energy_vdd_in_j"))
    if energy is not None:
        average = summary.get("avg_power_w")
        figures.append(
            f"device energy {amount(energy, 1)} J"
            + ("" if average is None else f" (avg {average:.2f} W)")
        )
    if energy is not None and summary.get("process_energy_j") is not None:
        figures.append(f"attributed {amount(summary['process_energy_j'], 1)} J")
    lines = [what, f"on {header.get('host', '?')}, {when}:"]
    for figure in figures:  # wrapped between figures, never inside one
        if len(lines[-1]) + len(figure) > 105:
            lines[-1] += ","
            lines.append(figure)
        else:
            lines[-1] += ("" if lines[-1].endswith(":") else ",") + " " + figure
    device = context_line(summary.get("context"))
    if device:  # the setting the figures were measured in
        lines.append(printable(device))
    return "\n".join(lines)


def summary_from_samples(
    samples: list[dict[str, Any]], started_at: float | None = None
) -> dict[str, Any]:
    """A summary for a file whose run never wrote one (it was killed): over the
    intervals the samples cover, from ``started_at`` (the header's: the first sample's
    interval counts too) or else from the first sample (its interval left out)."""
    summary: dict[str, Any] = {"samples": len(samples)}
    times = [s["timestamp"] for s in samples]
    counted = samples
    if started_at is not None and times and started_at < times[0]:
        times = [started_at, *times]
    else:
        counted = samples[1:]
    if not counted:
        return summary
    span = times[-1] - times[0]
    summary["duration_s"] = round(span, 3)
    intervals = list(zip(counted, times, times[1:]))
    if any("cpu_usage" in s for s in counted):
        summary["cpu_time_s"] = sum(
            s["cpu_usage"] / 100 * (t1 - t0) for s, t0, t1 in intervals if "cpu_usage" in s
        )
        summary["avg_cpu_usage"] = summary["cpu_time_s"] / span * 100 if span > 0 else 0.0
    rss = [s["memory_rss_bytes"] for s in samples if "memory_rss_bytes" in s]
    if rss:
        summary["memory_rss_peak_bytes"] = max(rss)
    pss = [s["memory_pss_bytes"] for s in samples if "memory_pss_bytes" in s]
    if pss:
        summary["memory_pss_peak_bytes"] = max(pss)
    if any("network_bytes_sent" in s for s in counted):
        summary["total_network_bytes_sent"] = sum(s.get("network_bytes_sent", 0) for s in counted)
        summary["total_network_bytes_recv"] = sum(s.get("network_bytes_recv", 0) for s in counted)
    if any("energy_j" in s for s in counted):
        summary["energy_j"] = sum(s.get("energy_j", 0.0) for s in counted)
        measured = sum(t1 - t0 for s, t0, t1 in intervals if "energy_j" in s)
        if measured > 0:
            summary["avg_power_w"] = summary["energy_j"] / measured
    return summary


def report(path: str, plot_to: str | None) -> str:
    """The table of a monitor file or a federation's rounds file (and its plot);
    ValueError naming file and line for a file that holds no run."""
    warn = _warn
    if is_rounds_file(path):  # a federation's per-round records (client/flower.py)
        records = load_rounds(path, warn)
        text = rounds_table(records, f"edgewatt report: {path} (federated rounds)")
        if plot_to:
            drawn = rounds_layout(records, path)
            plot_rounds(drawn, plot_to)
            text += f"\n  plot written to {plot_to}"
        return text
    header, samples, phases, summary = load(path, warn)
    if not samples and summary is None:
        what = "only a header" if header else "no records"
        raise ValueError(f"{path}: {what}, no samples: nothing to report")
    if summary is None:
        summary = summary_from_samples(samples, header.get("started_at"))
    title = (
        f"edgewatt report: {path} (pid {header.get('pid', '?')}, host {header.get('host', '?')})"
    )
    metrics = header.get("metrics") or {}
    power = summary.get("power_source") or ("off" if metrics.get("power") is False else None)
    host = _network(header) == HOST_NETWORK
    items = phase_figures(phases, samples, header.get("started_at"), host)
    text = summary_table(summary, title, power, items, host)
    if plot_to:
        if not samples:
            raise ValueError(f"{path}: a summary but no samples: nothing to plot")
        plot(layout(header, samples, phases, summary), plot_to)
        text += f"\n  plot written to {plot_to}"
    return text


def _warn(message: str) -> None:
    print(f"edgewatt report: warning: {message}", file=sys.stderr)
