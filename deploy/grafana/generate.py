"""Writes the dashboards in deploy/grafana/dashboards/ from this one description.

    python deploy/grafana/generate.py          # rewrite the JSON files
    python deploy/grafana/generate.py --check  # exit 1 if they differ (the tests do this)

Every panel reaches Prometheus through the ``datasource`` variable (no ``__inputs``),
sets its unit, and queries names that exist on every path into a store (scraped
daemons, the collector, OTLP into vmagent): unit-1 gauges may carry a ``_ratio``
suffix. A device is its ``host_name``, which every series carries on every path; a
scrape's ``instance`` and ``up`` exist on one path only, so nothing depends on them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}


def ratio(name: str) -> str:
    """A unit-1 metric under both names it can have in Prometheus."""
    return f'{{__name__=~"{name}(_ratio)?"'


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


class Layout:
    """Places panels left to right, rows of 24 grid units."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.next_id = 1

    def place(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def panel(
        self,
        kind: str,
        title: str,
        unit: str,
        targets: list[dict[str, Any]],
        w: int = 12,
        h: int = 8,
        **extra: Any,
    ) -> dict[str, Any]:
        panel = {
            "id": self.next_id,
            "type": kind,
            "title": title,
            "datasource": DS,
            "gridPos": self.place(w, h),
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
            "targets": targets,
            **extra,
        }
        self.next_id += 1
        return panel


def query_variable(
    name: str, label: str, query: str, include_all: bool = True, hide: int = 0
) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": include_all,
        "multi": include_all,
        "allValue": ".*",
        "current": {},
        "sort": 1,
        "hide": hide,
    }


def carbon_variable(metric: str, selector: str) -> dict[str, Any]:
    """A hidden variable listing the devices that export ``metric``: a panel repeated
    over it is not drawn at all where no carbon intensity is configured (and so no
    carbon series exist), rather than drawn empty or as a made-up 0."""
    return query_variable(
        "carbon", "Carbon", f"label_values({metric}{{{selector}}}, host_name)", hide=2
    )


def carbon_panel(lay: Layout, title: str, expr: str) -> dict[str, Any]:
    return lay.panel(
        "stat",
        title,
        "massg",  # grams; the title says CO2e
        [target(expr, "gCO2e")],
        w=12,
        repeat="carbon",
        repeatDirection="h",
        description="gCO2e = grid carbon intensity (carbon_intensity_g_per_kwh or "
        "carbon_country, shown in target_info) x energy. Shown only where one is configured.",
    )


DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Data source",
    "type": "datasource",
    "query": "prometheus",
    "current": {"text": "Prometheus", "value": "edgewatt-prometheus"},
}


def dashboard(
    uid: str,
    title: str,
    variables: list[dict[str, Any]],
    panels: list[dict[str, Any]],
    datasource: dict[str, Any] = DATASOURCE_VARIABLE,
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["edgewatt"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [datasource, *variables]},
        "annotations": {"list": []},
        "panels": panels,
    }


def fleet() -> dict[str, Any]:
    lay = Layout()
    by_device = 'host_name=~"$device"'
    panels = [
        lay.panel(
            "timeseries",
            "Fleet power",
            "watt",
            [target(f"sum(hw_host_power_watts{{{by_device}}})", "fleet")],
            w=16,
        ),
        lay.panel(
            "stat",
            "Devices reporting",
            "none",
            # Fresh series only: a device silent past the store's lookback drops out.
            [target(f"count(count by (host_name) (edgewatt_targets{{{by_device}}}))", "devices")],
            w=8,
        ),
        lay.panel(
            "table",
            "Devices",
            "none",
            [
                target(f"hw_host_power_watts{{{by_device}}}", ref="A", instant=True),
                target(
                    f"increase(hw_host_energy_joules_total{{{by_device}}}[$__range])",
                    ref="B",
                    instant=True,
                ),
                target(f"{ratio('system_cpu_utilization')}, {by_device}}}", ref="C", instant=True),
                target(
                    f'system_memory_usage_bytes{{system_memory_state="used", {by_device}}}',
                    ref="D",
                    instant=True,
                ),
                target(f"edgewatt_targets{{{by_device}}}", ref="E", instant=True),
            ],
            w=24,
            transformations=[{"id": "merge", "options": {}}],
        ),
        lay.panel(
            "table",
            "Top processes by energy over the range",
            "joule",
            [
                target(
                    "topk(10, sum by (host_name, edgewatt_target_id, process_executable_name) "
                    f"(increase(edgewatt_process_energy_joules_total{{{by_device}}}[$__range])))",
                    instant=True,
                )
            ],
            w=24,
        ),
    ]
    panels.append(
        carbon_panel(
            lay,
            "Device carbon over the range (gCO2e), $carbon",
            'sum(increase(edgewatt_host_carbon_grams_total{host_name=~"$carbon"}[$__range]))',
        )
    )
    variables = [
        query_variable("device", "Device", "label_values(edgewatt_targets, host_name)"),
        carbon_variable("edgewatt_host_carbon_grams_total", by_device),
    ]
    return dashboard("edgewatt-fleet", "edgewatt: fleet overview", variables, panels)


def device() -> dict[str, Any]:
    lay = Layout()
    d = 'host_name=~"$device"'
    panels = [
        lay.panel(
            "timeseries",
            "Power per rail",
            "watt",
            [target(f"hw_power_watts{{{d}}}", "{{hw_name}}")],
        ),
        lay.panel(
            "timeseries",
            "Power accounted: to targets, idle, to nobody",
            "watt",
            [
                target(
                    f"rate(edgewatt_host_energy_accounted_joules_total{{{d}}}[$__rate_interval])",
                    "{{edgewatt_energy_part}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Temperatures",
            "celsius",
            [target(f"hw_temperature_celsius{{{d}}}", "{{hw_name}}")],
        ),
        lay.panel(
            "timeseries",
            "GPU load",
            "percentunit",
            [target(f"{ratio('hw_gpu_utilization')}, {d}}}", "{{hw_name}}")],
        ),
        lay.panel(
            "timeseries",
            "Host CPU busy",
            "percentunit",
            [target(f"{ratio('system_cpu_utilization')}, {d}}}", "cpu")],
        ),
        lay.panel(
            "timeseries",
            "Host memory",
            "bytes",
            [target(f"system_memory_usage_bytes{{{d}}}", "{{system_memory_state}}")],
        ),
        lay.panel(
            "timeseries",
            "Host network",
            "Bps",
            [
                target(
                    f"rate(system_network_io_bytes_total{{{d}}}[$__rate_interval])",
                    "{{network_interface_name}} {{network_io_direction}}",
                )
            ],
        ),
        lay.panel(
            "table",
            "Registered processes",
            "none",
            [
                # Both modes summed: one row per target (the table merges on labels).
                target(
                    f"sum without (cpu_mode) ({ratio('process_cpu_utilization')}, {d}}})",
                    ref="A",
                    instant=True,
                ),
                target(f"process_memory_usage_bytes{{{d}}}", ref="B", instant=True),
                target(f"edgewatt_process_power_watts{{{d}}}", ref="C", instant=True),
            ],
            w=24,
            transformations=[{"id": "merge", "options": {}}],
        ),
    ]
    variables = [
        query_variable("device", "Device", "label_values(edgewatt_targets, host_name)", False)
    ]
    return dashboard("edgewatt-device", "edgewatt: device", variables, panels)


def run() -> dict[str, Any]:
    lay = Layout()
    t = 'host_name=~"$device", edgewatt_target_id=~"$target"'
    panels = [
        lay.panel(
            "timeseries",
            "CPU (cores busy)",
            "short",
            [
                target(
                    "sum by (edgewatt_target_id) "
                    f"(rate(process_cpu_time_seconds_total{{{t}}}[$__rate_interval]))",
                    "{{edgewatt_target_id}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Resident memory",
            "bytes",
            [target(f"process_memory_usage_bytes{{{t}}}", "{{edgewatt_target_id}}")],
        ),
        lay.panel(
            "timeseries",
            "Disk",
            "Bps",
            [
                target(
                    f"rate(process_disk_io_bytes_total{{{t}}}[$__rate_interval])",
                    "{{edgewatt_target_id}} {{disk_io_direction}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Network (TCP)",
            "Bps",
            [
                target(
                    f"rate(process_network_io_bytes_total{{{t}}}[$__rate_interval])",
                    "{{edgewatt_target_id}} {{network_io_direction}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Attributed power",
            "watt",
            [target(f"edgewatt_process_power_watts{{{t}}}", "{{edgewatt_target_id}}")],
        ),
        lay.panel(
            "stat",
            "Attributed energy over the range",
            "joule",
            [
                target(
                    f"sum(increase(edgewatt_process_energy_joules_total{{{t}}}[$__range]))",
                    "energy",
                )
            ],
        ),
        lay.panel(
            "state-timeline",
            "Phases",
            "none",
            [target(f"{ratio('edgewatt_process_phase')}, {t}}}", "{{edgewatt_phase}}")],
            w=24,
            h=5,
        ),
        lay.panel(
            "table",
            "Energy per phase",
            "joule",
            [target(f"edgewatt_process_phase_energy_joules{{{t}}}", instant=True)],
            w=24,
        ),
    ]
    variables = [
        query_variable("device", "Device", "label_values(edgewatt_targets, host_name)"),
        query_variable(
            "run", "Run", 'label_values(process_cpu_time_seconds_total{host_name=~"$device"}, run)'
        ),
        query_variable(
            "target",
            "Target",
            'label_values(process_cpu_time_seconds_total{host_name=~"$device", run=~"$run"}, '
            "edgewatt_target_id)",
        ),
        carbon_variable("edgewatt_process_carbon_grams_total", t),
    ]
    panels.append(
        carbon_panel(
            lay,
            "Attributed carbon over the range (gCO2e), $carbon",
            "sum(increase(edgewatt_process_carbon_grams_total"
            f'{{{t}, host_name=~"$carbon"}}[$__range]))',
        )
    )
    return dashboard("edgewatt-run", "edgewatt: process / run", variables, panels)


def rounds() -> dict[str, Any]:
    """Federated rounds: each client is a device whose target runs one phase per
    message, ``round-N/kind`` (edgewatt.client.flower's mod)."""
    lay = Layout()
    d = 'host_name=~"$device"'
    in_round = f'edgewatt_phase=~"round-.*", {d}'
    # 1 while a round runs on that client's target: CPU and power read through it.
    phase = ratio("edgewatt_process_phase")
    running = f"max by (host_name, edgewatt_target_id) ({phase}, {in_round}}})"
    panels = [
        lay.panel(
            "bargauge",
            "Energy attributed per round and client (last 10 rounds each)",
            "joule",
            [
                target(
                    f"edgewatt_process_phase_energy_joules{{{in_round}}}",
                    "{{host_name}} {{edgewatt_phase}}",
                    instant=True,
                )
            ],
            w=24,
            options={"orientation": "horizontal", "displayMode": "basic"},
        ),
        lay.panel(
            "bargauge",
            "Round duration per client (last 10 rounds each): the longest is the straggler",
            "s",
            [
                target(
                    f"edgewatt_process_phase_duration_seconds{{{in_round}}}",
                    "{{host_name}} {{edgewatt_phase}}",
                    instant=True,
                )
            ],
            options={"orientation": "horizontal", "displayMode": "basic"},
        ),
        lay.panel(
            "table",
            "Straggler of each round",
            "s",
            [
                target(
                    "topk by (edgewatt_phase) (1, "
                    f"edgewatt_process_phase_duration_seconds{{{in_round}}})",
                    "{{edgewatt_phase}} {{host_name}}",
                    instant=True,
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Round running, per client",
            "short",
            [target(running, "{{host_name}}")],
        ),
        lay.panel(
            "timeseries",
            "Client CPU while a round runs (cores busy)",
            "short",
            [
                target(
                    f"sum by (host_name) (rate(process_cpu_time_seconds_total{{{d}}}"
                    f"[$__rate_interval]) * on (host_name, edgewatt_target_id) "
                    f"group_left {running})",
                    "{{host_name}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Device power while a round runs",
            "watt",
            [
                target(
                    f"hw_host_power_watts{{{d}}} * on (host_name) group_left "
                    f"max by (host_name) ({running})",
                    "{{host_name}}",
                )
            ],
        ),
        lay.panel(
            "timeseries",
            "Client TCP bytes while a round runs",
            "Bps",
            [
                target(
                    f"sum by (host_name, network_io_direction) "
                    f"(rate(process_network_io_bytes_total{{{d}}}[$__rate_interval]) "
                    f"* on (host_name, edgewatt_target_id) group_left {running})",
                    "{{host_name}} {{network_io_direction}}",
                )
            ],
        ),
    ]
    variables = [
        query_variable("device", "Client", "label_values(edgewatt_targets, host_name)", True)
    ]
    return dashboard("edgewatt-rounds", "edgewatt: federated rounds", variables, panels)


# InfluxDB (exporter/influx.py): a measurement per metric, named as its Prometheus series
# without _total, tags for attributes, one field "value". InfluxQL, which 1.x speaks
# natively and 2.x and 3.x through their v1 query APIs.
INFLUX = {"type": "influxdb", "uid": "${datasource}"}
INFLUX_DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Data source",
    "type": "datasource",
    "query": "influxdb",
    "current": {"text": "InfluxDB", "value": "edgewatt-influxdb"},
}


def influxql(query: str, alias: str = "", ref: str = "A", table: bool = False) -> dict[str, Any]:
    return {
        "datasource": INFLUX,
        "query": query,
        "rawQuery": True,
        "resultFormat": "table" if table else "time_series",
        "alias": alias,
        "refId": ref,
    }


def influxdb() -> dict[str, Any]:
    lay = Layout()
    d = '"host_name" =~ /^$device$/ AND $timeFilter'
    per_target = '"host_name", "edgewatt_target_id", "process_executable_name"'
    panels = [
        lay.panel(
            "timeseries",
            "Device power",
            "watt",
            [
                influxql(
                    f'SELECT mean("value") FROM "hw_host_power_watts" WHERE {d} '
                    'GROUP BY time($__interval), "host_name" fill(none)',
                    "$tag_host_name",
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "timeseries",
            "Power per rail",
            "watt",
            [
                influxql(
                    f'SELECT mean("value") FROM "hw_power_watts" WHERE {d} '
                    'GROUP BY time($__interval), "host_name", "hw_name" fill(none)',
                    "$tag_host_name $tag_hw_name",
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "stat",
            "Device energy in the range",
            "joule",
            [
                # The counter runs since its daemon started: differences, a restart's
                # drop left out.
                influxql(
                    'SELECT sum("step") FROM (SELECT non_negative_difference("value") AS "step" '
                    f'FROM "hw_host_energy_joules" WHERE {d} GROUP BY "host_name") '
                    'GROUP BY "host_name"',
                    "$tag_host_name",
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "timeseries",
            "Power per target",
            "watt",
            [
                influxql(
                    f'SELECT mean("value") FROM "edgewatt_process_power_watts" WHERE {d} '
                    f"GROUP BY time($__interval), {per_target} fill(none)",
                    "$tag_process_executable_name $tag_edgewatt_target_id",
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "table",
            "Energy per target (since its registration)",
            "joule",
            [
                influxql(
                    f'SELECT last("value") AS "energy" FROM "edgewatt_process_energy_joules" '
                    f"WHERE {d} GROUP BY {per_target}",
                    table=True,
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "table",
            "Energy per phase",
            "joule",
            [
                influxql(
                    f'SELECT last("value") AS "energy" FROM "edgewatt_process_phase_energy_joules" '
                    f'WHERE {d} GROUP BY {per_target}, "edgewatt_phase"',
                    table=True,
                )
            ],
            datasource=INFLUX,
        ),
        lay.panel(
            "timeseries",
            "CPU per target",
            "s",
            [
                influxql(
                    'SELECT non_negative_derivative(last("value"), 1s) '
                    f'FROM "process_cpu_time_seconds" WHERE {d} '
                    f'GROUP BY time($__interval), {per_target}, "cpu_mode" fill(none)',
                    "$tag_process_executable_name $tag_edgewatt_target_id $tag_cpu_mode",
                )
            ],
            w=24,
            datasource=INFLUX,
            description="CPU seconds per second (cores busy), by mode",
        ),
    ]
    variables = [
        {
            **query_variable(
                "device",
                "Device",
                'SHOW TAG VALUES FROM "system_memory_limit_bytes" WITH KEY = "host_name"',
            ),
            "datasource": INFLUX,
            "allValue": ".*",
        }
    ]
    return dashboard(
        "edgewatt-influxdb", "edgewatt: InfluxDB", variables, panels, INFLUX_DATASOURCE_VARIABLE
    )


DASHBOARDS = {
    "fleet.json": fleet,
    "device.json": device,
    "run.json": run,
    "rounds.json": rounds,
    "influxdb.json": influxdb,
}


def render() -> dict[str, str]:
    return {
        name: json.dumps(build(), indent=2, sort_keys=True) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(
            "stale dashboards (run deploy/grafana/generate.py): " + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
