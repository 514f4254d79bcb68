"""The metric table: every metric's name, instrument, unit, description and attributes,
declared once.

/metrics (edgewatt.exporter.exposition), the OTLP pipeline (edgewatt.exporter.telemetry),
the client's Prometheus and OTLP sinks and the README's metric table are all derived
from it. It imports no OpenTelemetry: the client reads it without the SDK.

Thread and descriptor counts use the Collector hostmetrics names (``process.threads``,
``process.open_file_descriptors``) rather than ``process.thread.count``: Prometheus
reserves the ``_count`` suffix for histograms and summaries, and ``promtool check
metrics`` rejects a gauge named so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from edgewatt.core.channels import CHANNELS, EXPORTED

# The whole device's hw.id on hw.host.power and hw.host.energy, where the semantic
# conventions (v1.44, hardware.attributes.common) require one: the device is one
# component, whichever sensors add up to its figure, so the series never changes name.
HOST_HW_ID = "host"
INSTRUMENTS = ("counter", "updowncounter", "gauge")  # all observable
# The suffix the OTel Prometheus exporter appends per unit; annotations ({thread}) and
# "1" get none in Python (field notes: the Collector adds _ratio to unit 1).
_UNIT_SUFFIX = {
    "s": "seconds",
    "By": "bytes",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "g": "grams",
}


@dataclass(frozen=True)
class Metric:
    name: str
    instrument: str  # one of INSTRUMENTS
    unit: str  # UCUM, as OTel writes it
    description: str
    attributes: tuple[str, ...] = ()  # the metric's own, beyond the subject's
    subject: str = "process"  # "process": one series set per target; "host": per device
    # How a per-target metric reads its target's sample, so that its observer is
    # derived (exporter/points.py) and a new figure is its field and this row: the
    # ProcessSample field it reads, or, split by its one attribute, (that attribute's
    # value, field) pairs; with ``per_phase``, a field of each of the target's last
    # phases (PhaseFigures), under ``edgewatt.phase``. Neither: a function of its own.
    field: str = ""
    split: tuple[tuple[str, str], ...] = ()
    per_phase: bool = False

    @property
    def prometheus_name(self) -> str:
        """The sample name the OTel Prometheus exporter gives it (counters end in _total)."""
        base = re.sub(r"[^a-zA-Z0-9_:]", "_", self.name)
        suffix = _UNIT_SUFFIX.get(self.unit, "")
        if suffix and not base.endswith("_" + suffix):
            base += "_" + suffix
        return base + "_total" if self.instrument == "counter" else base

    def prometheus_label(self, attribute: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


_P = "process"
_H = "host"

TABLE: tuple[Metric, ...] = (
    Metric(
        "process.cpu.time",
        "counter",
        "s",
        "CPU time of the target and its descendants (reaped ones included), by mode",
        ("cpu.mode",),
        split=(("user", "cpu_user_s"), ("system", "cpu_system_s")),
    ),
    Metric(
        "process.cpu.utilization",
        "gauge",
        "1",
        "CPU time over the last interval as a share of all logical CPUs (0..1), by mode: "
        "the modes add up to the target's share",
        ("cpu.mode",),
        split=(("user", "cpu_user_utilization"), ("system", "cpu_system_utilization")),
    ),
    Metric(
        "process.memory.usage",
        "updowncounter",
        "By",
        "Resident set size of the target and its live descendants, summed (a page shared "
        "by N of them counted N times: more than they hold)",
        field="memory_rss_bytes",
    ),
    Metric(
        "edgewatt.process.memory.pss",
        "updowncounter",
        "By",
        "Proportional set size of the target and its live descendants, summed: each "
        "shared page split among the processes mapping it, so what the work holds",
        field="memory_pss_bytes",
    ),
    Metric(
        "edgewatt.process.memory.rss.largest",
        "updowncounter",
        "By",
        "Resident set size of the target's largest live process",
        field="memory_rss_largest_bytes",
    ),
    Metric(
        "process.memory.virtual",
        "updowncounter",
        "By",
        "Virtual memory size of the target and its live descendants",
        field="memory_virtual_bytes",
    ),
    Metric(
        "process.disk.io",
        "counter",
        "By",
        "Bytes the target and its descendants caused to be read from or written to storage",
        ("disk.io.direction",),
        split=(("read", "disk_read_bytes"), ("write", "disk_write_bytes")),
    ),
    Metric(
        "process.network.io",
        "counter",
        "By",
        "TCP bytes of the target and its descendants (sent = acknowledged by the peer), "
        "IPv4 and IPv6, from sock_diag; UDP and Unix sockets are not counted",
        ("network.io.direction",),
        split=(("transmit", "network_transmit_bytes"), ("receive", "network_receive_bytes")),
    ),
    # The channels' (core/channels.py), each metric split by its attribute.
    *(
        Metric(
            e.name,
            "counter",
            e.unit,
            e.description,
            (e.attribute,),
            split=tuple((c.metric_value, c.name) for c in CHANNELS if c.metric is e),
        )
        for e in EXPORTED
    ),
    Metric(
        "process.threads",
        "updowncounter",
        "{thread}",
        "Threads of the target and its live descendants",
        field="threads",
    ),
    Metric(
        "process.open_file_descriptors",
        "updowncounter",
        "{file_descriptor}",
        "Open file descriptors of the target and its live descendants",
        field="open_fds",
    ),
    Metric(
        "edgewatt.process.members",
        "updowncounter",
        "{process}",
        "Processes counted in the target: itself and its live descendants",
        field="processes",
    ),
    Metric(
        "edgewatt.process.power",
        "gauge",
        "W",
        "Device power above idle attributed to the target over the last interval "
        "(docs/attribution.md)",
        field="power_w",
    ),
    Metric(
        "edgewatt.process.energy",
        "counter",
        "J",
        "Device energy above idle attributed to the target since it was registered",
        field="energy_j",
    ),
    Metric(
        "edgewatt.process.carbon",
        "counter",
        "g",
        "gCO2e of the target's attributed energy at the configured grid carbon intensity "
        "(only when one is configured)",
    ),
    Metric(
        "edgewatt.process.gpu.utilization",
        "gauge",
        "1",
        "SM load of the target's processes, summed over GPUs (NVML; 1 = one GPU fully busy)",
        field="gpu_utilization",
    ),
    Metric(
        "edgewatt.process.gpu.memory.usage",
        "updowncounter",
        "By",
        "GPU memory held by the target's processes, summed over GPUs (NVML)",
        field="gpu_memory_bytes",
    ),
    Metric(
        "hw.gpu.memory.usage",
        "updowncounter",
        "By",
        "GPU memory in use",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "hw.gpu.memory.limit",
        "updowncounter",
        "By",
        "GPU memory in total",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "edgewatt.process.phase",
        "gauge",
        "1",
        "1 while the named phase of the target runs (POST /v1/targets/{id}/phase)",
        ("edgewatt.phase",),
        field="running_marker",
        per_phase=True,
    ),
    Metric(
        "edgewatt.process.phase.energy",
        "gauge",
        "J",
        "Energy attributed to the target in each of its last 10 phases",
        ("edgewatt.phase",),
        field="energy_j",
        per_phase=True,
    ),
    Metric(
        "edgewatt.process.phase.duration",
        "gauge",
        "s",
        "Duration of each of the target's last 10 phases, from the sample at its start "
        "to the one at its end (so far, while it runs)",
        ("edgewatt.phase",),
        field="duration_s",
        per_phase=True,
    ),
    Metric(
        "edgewatt.process.phase.power.max",
        "gauge",
        "W",
        "Peak of the whole device's power in each of the target's last 10 phases, from "
        "every reading of the power sensor (its window rate while a phase is young; so "
        "far, while it runs): what a power-mode budget is checked against",
        ("edgewatt.phase",),
        field="power_max_w",
        per_phase=True,
    ),
    Metric(
        "hw.host.power",
        "gauge",
        "W",
        "Whole-device power: the board input rail on Jetson, RAPL plus GPUs elsewhere",
        ("hw.id",),
        _H,
    ),
    Metric(
        "hw.host.energy",
        "counter",
        "J",
        "Whole-device energy since the daemon started",
        ("hw.id",),
        _H,
    ),
    Metric(
        "edgewatt.host.carbon",
        "counter",
        "g",
        "gCO2e of the whole device's energy since the daemon started, at the configured grid "
        "carbon intensity (only when one is configured)",
        (),
        _H,
    ),
    Metric(
        "hw.power",
        "gauge",
        "W",
        "Power of one rail, zone or GPU",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "hw.energy",
        "counter",
        "J",
        "Energy of one rail, zone or GPU since the daemon started",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "hw.gpu.utilization",
        "gauge",
        "1",
        "GPU load (0..1): GR3D on Jetson, NVML elsewhere",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "hw.temperature",
        "gauge",
        "Cel",
        "Temperature sensors reported by the power sources",
        ("hw.id", "hw.name", "hw.type"),
        _H,
    ),
    Metric(
        "edgewatt.host.idle_power",
        "gauge",
        "W",
        "Idle power the attribution subtracts: configured, or the lowest seen in the window",
        (),
        _H,
    ),
    Metric(
        "edgewatt.host.energy.accounted",
        "counter",
        "J",
        "The device's measured energy by part, adding up to it: attributed to targets, idle, "
        "unattributed (above idle, given to no target)",
        ("edgewatt.energy.part",),
        _H,
    ),
    Metric(
        "edgewatt.device.info",
        "gauge",
        "1",
        "1, labelled with the device's context as last read (core/platforms/context.py): the "
        "board's model, L4T release, nvpmodel power mode and its id, whether the clocks are pinned "
        "(jetson_clocks); a label is absent where the device has no such fact",
        ("model", "l4t_release", "power_mode", "power_mode_id", "clocks_pinned"),
        _H,
    ),
    Metric(
        "edgewatt.energy.source.info",
        "gauge",
        "1",
        "1 per sensor the device's energy is measured by (core/power/provenance.py): its "
        "source, rail, how it is read (stream, printed, counter) and rate_hz (absent for a "
        "counter), and the rule the targets' energy is attributed by (docs/attribution.md); "
        "with no measurement, one series with method unknown and the reason",
        ("method", "source", "rail", "read", "rate_hz", "rule", "reason"),
        _H,
    ),
    Metric(
        "system.cpu.time",
        "counter",
        "s",
        "Host CPU time summed over all logical CPUs, by mode",
        ("cpu.mode",),
        _H,
    ),
    Metric(
        "system.cpu.utilization",
        "gauge",
        "1",
        "Host CPU busy share over the last interval (0..1; idle and iowait excluded)",
        (),
        _H,
    ),
    Metric(
        "edgewatt.host.logical_cpus",
        "updowncounter",
        "{cpu}",
        "Logical CPUs of the host",
        (),
        _H,
    ),
    Metric(
        "system.memory.usage",
        "updowncounter",
        "By",
        "Host memory by state (used, free, buffers, cached); the states add up to the limit",
        ("system.memory.state",),
        _H,
    ),
    Metric(
        "system.memory.limit",
        "updowncounter",
        "By",
        "Total host memory",
        (),
        _H,
    ),
    Metric(
        "system.network.io",
        "counter",
        "By",
        "Bytes per network interface of the daemon's network namespace",
        ("network.interface.name", "network.io.direction"),
        _H,
    ),
    Metric(
        "edgewatt.targets",
        "updowncounter",
        "{target}",
        "Targets sampled in the last pass",
        (),
        _H,
    ),
    Metric(
        "edgewatt.sampler.duration",
        "gauge",
        "s",
        "Wall time the last sampling pass took",
        (),
        _H,
    ),
    Metric(
        "edgewatt.sampler.overruns",
        "counter",
        "{pass}",
        "Sampling passes that took longer than the interval",
        (),
        _H,
    ),
    Metric(
        "edgewatt.target.exits",
        "counter",
        "{target}",
        "Targets that exited while still registered (a clean run unregisters first)",
        (),
        _H,
    ),
    Metric(
        "edgewatt.exit.overflows",
        "counter",
        "{drain}",
        "Drains of an exit listener (taskstats, tcp_destroy) that found notifications lost "
        "to a full socket buffer: exits in that window end at their last sample",
        ("edgewatt.listener",),
        _H,
    ),
    Metric(
        "edgewatt.sampler.errors",
        "counter",
        "{error}",
        "Target reads that failed for a reason other than the target's exit",
        (),
        _H,
    ),
)

BY_NAME: Mapping[str, Metric] = {m.name: m for m in TABLE}


def markdown_table() -> str:
    """The README's metric table."""
    rows = ["| OTel name | instrument, unit | Prometheus | attributes | meaning |"]
    rows.append("|---|---|---|---|---|")
    for m in TABLE:
        own = ", ".join(f"`{a}`" for a in m.attributes)
        who = "per target" if m.subject == "process" else "per device"
        attrs = f"{who}; {own}" if own else who
        rows.append(
            f"| `{m.name}` | {m.instrument}, `{m.unit}` | `{m.prometheus_name}` | {attrs} "
            f"| {m.description} |"
        )
    return "\n".join(rows) + "\n"
