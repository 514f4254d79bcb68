"""The Grafana dashboards: generated, linted, parsed, and every query run against a real
Prometheus scraping the real daemon (Grafana itself cannot be installed here)."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from tests.conftest import ROOT, DaemonProcess, PushPath, query, wait_for

# The Prometheus dashboards; influxdb.json's InfluxQL runs in tests/test_influx.py.
DASHBOARDS = sorted(
    p
    for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")
    if p.name != "influxdb.json"
)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__range", "__rate_interval", "__interval"}
VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def test_checked_in_json_is_what_the_generator_writes() -> None:
    out = subprocess.run(
        [sys.executable, "deploy/grafana/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert [p.name for p in DASHBOARDS] == ["device.json", "fleet.json", "rounds.json", "run.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_lint(path: Path) -> None:
    board = load(path)
    assert "__inputs" not in board and "${DS_" not in path.read_text()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    used: set[str] = set()
    for panel in board["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']} has no unit"
        refs = [t["refId"] for t in panel["targets"]]
        assert all(refs) and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == DATASOURCE
            used |= {a or b for a, b in VAR.findall(t["expr"])}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE
            used |= {a or b for a, b in VAR.findall(variable["definition"])}
    assert used - BUILTINS <= set(variables), f"undefined: {used - BUILTINS - set(variables)}"
    assert set(variables) - {"datasource"} <= used, "a variable is never used"
    cells = []
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        cells.append(
            {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        )
    for a, b in itertools.combinations(cells, 2):
        assert not a & b, "overlapping panels"


def test_dashboard_uids_are_unique() -> None:
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


def substitute(expr: str, values: dict[str, str]) -> str:
    values = {"__range": "1m", "__rate_interval": "5s", "__interval": "1s", **values}
    return VAR.sub(lambda m: values[m.group(1) or m.group(2)], expr)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_parses(path: Path) -> None:
    board = load(path)
    values = {"device": ".*", "run": ".*", "target": ".*", "carbon": ".*"}
    for _title, expr in exprs(board):
        promql_parser.parse(substitute(expr, values))  # raises on a syntax error
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["definition"])
            if inner:
                promql_parser.parse(substitute(inner[1], values))


@pytest.mark.parametrize("name", ["fleet.json", "run.json"])
def test_carbon_panels_are_drawn_only_where_carbon_series_exist(name: str) -> None:
    board = load(next(p for p in DASHBOARDS if p.name == name))
    carbon = [p for p in board["panels"] if "carbon" in p["title"].lower()]
    assert len(carbon) == 1 and carbon[0]["repeat"] == "carbon"
    assert carbon[0]["fieldConfig"]["defaults"]["unit"] == "massg"
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "carbon"]
    # Hidden, and listing only devices that export carbon: none, no panel.
    assert variable["hide"] == 2 and "carbon_grams_total" in variable["definition"]


def label_values(url: str, label: str, match: str) -> list[str]:
    q = urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(f"{url}/api/v1/label/{label}/values?{q}", timeout=5) as r:
        return json.load(r)["data"]


# Panels that need hardware this machine lacks: none today (GPU load comes from the
# stand-in tegrastats' GR3D field). NVML-only figures are not on the dashboards.
NEEDS_ABSENT_HARDWARE: set[str] = set()


def hosts_missing(url: str) -> list[str]:
    """The two devices' host names not yet among the targets' series at ``url``."""
    stored = label_values(url, "host_name", "edgewatt_targets")
    return [host for host in ("jetson-a", "jetson-b") if host not in stored]


def filled(empties: Any, timeout: float = 60) -> None:
    """Until ``empties()`` (lists of panels without data) are all empty, or ``timeout``
    has passed: the assertions after it say which are not."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(empties()), timeout=timeout, step=1)


def panels_without_data(url: str, values: dict[str, str]) -> list[str]:
    """Every dashboard query, variables put in as Grafana does, that returns nothing."""
    empty = []
    for path in DASHBOARDS:
        for title, expr in exprs(load(path)):
            if title not in NEEDS_ABSENT_HARDWARE and not query(url, substitute(expr, values)):
                empty.append(f"{path.name}: {title}: {expr}")
    return empty


POWER_ENV = {
    "EDGEWATT_IDLE_POWER_W": "4",
    "EDGEWATT_POWER_SOURCES": "tegrastats",
    "EDGEWATT_CARBON_INTENSITY_G_PER_KWH": "350",  # the carbon panels' series
}
STAND_IN = ["--tegrastats", str(ROOT / "tests" / "bin" / "tegrastats")]
WORK = "import time\nwhile True:\n    sum(range(20000))\n    time.sleep(0.005)"


def start_run(daemon: DaemonProcess, spawn: Any) -> str:
    """A registered worker with a run label and two phases named as the Flower mod
    names a client's rounds, the second still running; returns its target id."""
    tid = daemon.register(spawn(WORK).pid, labels={"run": "dash"})["id"]
    daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "round-1/train"})
    daemon.wait_passes(tid)  # the first round has figures of its own
    daemon.call("POST", f"/v1/targets/{tid}/phase", {"name": "round-2/train"})
    return tid


def test_every_panel_returns_data_from_a_real_prometheus(
    daemon_factory: Any, prometheus_factory: Any, spawn: Any
) -> None:
    """Two devices (`jetson-a`, `jetson-b`) scraped by one Prometheus: both listed by
    name, and every panel has data, for all devices and for each one."""
    daemons = [
        daemon_factory(
            interval=0.5, extra_args=STAND_IN, env={**POWER_ENV, "EDGEWATT_HOST_NAME": host}
        )
        for host in ("jetson-a", "jetson-b")
    ]
    url = prometheus_factory(*daemons)
    tids = [start_run(daemon, spawn) for daemon in daemons]
    wait_for(
        lambda: len(query(url, "edgewatt_process_phase_energy_joules")) >= 4, timeout=30, step=0.5
    )
    # Until both devices are stored and enough scrapes for rate() and increase() over
    # their windows (a minute at most; what still has none is named below).
    every = {"device": ".*", "run": "dash", "target": "|".join(tids), "carbon": ".*"}
    one = {"device": "jetson-b", "run": "dash", "target": tids[1], "carbon": "jetson-b"}
    filled(lambda: [hosts_missing(url), *(panels_without_data(url, v) for v in (every, one))])
    # A device is its host name, on this path as on the push paths.
    assert label_values(url, "host_name", "edgewatt_targets") == ["jetson-a", "jetson-b"]
    assert label_values(url, "run", 'process_cpu_time_seconds_total{host_name=~"jetson-a"}') == [
        "dash"
    ]
    # Grafana puts the selected value into the regex matcher as it is: "All" is .*.
    for values in (every, one):
        empty = panels_without_data(url, values)
        assert not empty, f"{values}: panels without data:\n" + "\n".join(empty)


def test_every_panel_returns_data_when_devices_push_through_vmagent(
    push_path: PushPath, daemon_factory: Any, spawn: Any
) -> None:
    """Two devices push OTLP/HTTP into vmagent, which remote-writes into VictoriaMetrics
    and into Prometheus 2.53: in each store both devices are listed by name and every
    panel has data, with no `instance` or `up` anywhere on this path."""
    tids = []
    for host in ("jetson-a", "jetson-b"):
        daemon = daemon_factory(
            interval=0.5,
            extra_args=[*STAND_IN, "--otlp-endpoint", f"{push_path.vmagent}/opentelemetry"],
            env={**POWER_ENV, "EDGEWATT_HOST_NAME": host, "OTEL_METRIC_EXPORT_INTERVAL": "1000"},
        )
        tids.append(start_run(daemon, spawn))
    values = {"device": ".*", "run": "dash", "target": "|".join(tids), "carbon": ".*"}
    for store in (push_path.victoria, push_path.prometheus):
        wait_for(
            lambda s=store: query(s, "edgewatt_process_phase_energy_joules"), timeout=60, step=1
        )
    # Until both devices are stored and enough pushes for rate() and increase() over
    # their windows, in each store.
    stores = (push_path.victoria, push_path.prometheus)
    filled(
        lambda: (
            [hosts_missing(s) for s in stores] + [panels_without_data(s, values) for s in stores]
        )
    )
    for store in (push_path.victoria, push_path.prometheus):
        assert label_values(store, "host_name", "edgewatt_targets") == ["jetson-a", "jetson-b"]
        assert label_values(store, "instance", "edgewatt_targets") == []
        empty = panels_without_data(store, values)
        assert not empty, f"{store}: panels without data:\n" + "\n".join(empty)
