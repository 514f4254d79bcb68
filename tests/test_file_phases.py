"""A monitor file's phases hold each phase's whole CPU: phase() waits
for a reading at its edge, so no interval straddles two phases and `edgewatt report`
gives each phase what the process burnt in it, as its own getrusage counts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgewatt.cli.report import load, phase_figures
from tests.conftest import ROOT

# Three phases of different CPU; the process's own CPU time (getrusage: every thread,
# the thread variant's sampler included) at each phase's start and at the end.
SCRIPT = """
import json, resource, sys, time
from edgewatt.client.{module} import FileMonitor
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
m = FileMonitor(sys.argv[1], 0.3, records="edgewatt", socket=sys.argv[2])
m.start()
edges = []
for name, seconds in (("a", 0.5), ("b", 0.8), ("c", 0.4)):
    m.phase(name)
    edges.append(cpu())
    end = time.process_time() + seconds
    while time.process_time() < end: pass
edges.append(cpu())
m.stop()
print(json.dumps(edges))
"""


@pytest.mark.parametrize("module", ["thread_monitor", "process_monitor"])
def test_each_phase_of_a_monitor_file_holds_its_whole_cpu(module: str, tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(module=module), str(out), str(tmp_path / "no.sock")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    edges = json.loads(result.stdout)
    header, samples, phases, _ = load(str(out))
    items = phase_figures(phases, samples, header.get("started_at"))
    burnt = [b - a for a, b in zip(edges, edges[1:])]
    assert [i["name"] for i in items] == ["a", "b", "c"]
    # To the clock tick of each of the two readings around a phase (10 ms each).
    for item, seconds in zip(items, burnt):
        assert item["cpu_time_s"] == pytest.approx(seconds, abs=0.021), (items, burnt)
