"""The layers import one way: cli -> exporter (the daemon) and client (the library) ->
core, and inside core its floors import down, with no circle among its modules.
Checked over the source tree, so a new import that reaches up or across fails here
before it ships; and the built wheel installs nothing but ``edgewatt``."""

from __future__ import annotations

import ast
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

# folder -> the layers its modules may import besides their own
ALLOWED = {
    "core": set(),
    "exporter": {"core"},
    "client": {"core"},
    "cli": {"core", "exporter", "client"},
}


def _imports(path: Path, layer: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, the edgewatt layer imported) for every import in ``path``; relative imports
    resolved against the file's own package."""
    package = [layer, *path.relative_to(root / layer).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = [".".join(["edgewatt", *base, *(node.module or "").split(".")])]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ALLOWED:  # a bare top-level name: the pre-namespace layout
                found.append((node.lineno, f"top-level {parts[0]}"))
            elif parts[0] == "edgewatt" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_import_goes_down_the_layers() -> None:
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            for line, target in _imports(path, layer):
                if target != layer and target not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == []


def test_the_checker_sees_an_import_that_reaches_up(tmp_path: Path) -> None:
    # The check above must be able to fail: a core module importing the daemon.
    module = tmp_path / "core" / "power" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from edgewatt.exporter import config\nfrom ...client import _track\nimport exporter\n"
    )
    found = _imports(module, "core", tmp_path)
    assert found == [(1, "exporter"), (2, "client"), (3, "top-level exporter")]


# Inside core, floor -> the floors below it that its modules may import besides their
# own, bottom to top. A floor is a folder of core/ (kernel/: the wire clients, facts/:
# the readers and accounting, platforms/, power/, targets/, sampling/: the sampler and
# its pass); the modules loose in core/ are the base floor, but snapshot.py, what a
# pass produces, which holds figures of the facts, power and platforms floors.
FLOORS = {
    "base": set(),
    "kernel": {"base"},
    "facts": {"base", "kernel"},
    "power": {"base"},
    "platforms": {"base", "kernel", "facts"},
    "snapshot": {"base", "facts", "power", "platforms"},
    "targets": {"base", "facts", "power", "platforms", "snapshot"},
    "sampling": {"base", "kernel", "facts", "power", "platforms", "snapshot", "targets"},
}


def _core_modules(root: Path) -> dict[str, Path]:
    """Every module of core by its dotted name (a package by its own; a C extension by
    its source)."""
    modules = {}
    for path in [*(root / "core").rglob("*.py"), *(root / "core").rglob("*.c")]:
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(["edgewatt", *parts[: -1 if parts[-1] == "__init__" else None]])] = path
    return modules


def _graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """core module -> {the core module it imports: the line}, every import counted:
    a circle through a function's import or a type's is a circle all the same."""
    modules = _core_modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module.split(".")[: None if path.name == "__init__.py" else -1]
        edges = graph[module] = {}
        text = path.read_text() if path.suffix == ".py" else ""  # a C source imports none
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                # ``from package import module`` imports that module
                names = [f"{source}.{a.name}" for a in node.names]
                names = [n if n in modules else source for n in names]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
    return graph


def _floor(module: str, root: Path = ROOT) -> str:
    first = module.split(".")[2:3]
    if first and (root / "core" / first[0]).is_dir():
        return first[0]
    return "snapshot" if first == ["snapshot"] else "base"


def _reaching_up(root: Path = ROOT) -> list[str]:
    modules = _core_modules(root)
    wrong = []
    for module, edges in sorted(_graph(root).items()):
        floor = _floor(module, root)
        for imported, line in edges.items():
            other = _floor(imported, root)
            if other != floor and other not in FLOORS.get(floor, ()):
                wrong.append(f"{modules[module].relative_to(root)}:{line} imports {imported}")
    return wrong


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The graph's circles: each set of modules that reach one another (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, {}):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            circle = []
            while not circle or circle[-1] != module:
                circle.append(stack.pop())
            if len(circle) > 1:
                found.append(sorted(circle))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_the_floors_are_listed_bottom_to_top_and_cover_core() -> None:
    order = list(FLOORS)
    assert all(order.index(b) < order.index(f) for f, below in FLOORS.items() for b in below)
    folders = {p.parent.name for p in (ROOT / "core").glob("*/*.py")}
    assert folders == set(FLOORS) - {"base", "snapshot"}


def test_inside_core_every_import_goes_down_the_floors() -> None:
    assert _reaching_up() == []


def test_the_floor_check_sees_an_import_that_reaches_up(tmp_path: Path) -> None:
    # A fact reader importing the pass above it, and the snapshot a floor up.
    for floor in ("facts", "sampling"):
        (tmp_path / "core" / floor).mkdir(parents=True)
        (tmp_path / "core" / floor / "__init__.py").write_text("")
    (tmp_path / "core" / "snapshot.py").write_text("from edgewatt.core import compat\n")
    (tmp_path / "core" / "compat.py").write_text("")
    (tmp_path / "core" / "sampling" / "tracked.py").write_text("")
    (tmp_path / "core" / "facts" / "probe.py").write_text(
        "from edgewatt.core import compat, snapshot\n"
        "if 0:\n    from ..sampling.tracked import TargetState\n"
    )
    assert _reaching_up(tmp_path) == [
        "core/facts/probe.py:1 imports edgewatt.core.snapshot",
        "core/facts/probe.py:3 imports edgewatt.core.sampling.tracked",
    ]


def test_no_import_circle_among_core_modules() -> None:
    assert _circles(_graph()) == []


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    # Two modules of one floor, one importing the other only for a type.
    (tmp_path / "core" / "sampling").mkdir(parents=True)
    (tmp_path / "core" / "sampling" / "contributors.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from edgewatt.core.sampling.tracked import TargetState\n"
    )
    (tmp_path / "core" / "sampling" / "tracked.py").write_text(
        "from edgewatt.core.sampling.contributors import NOT_COUNTED\n"
    )
    (tmp_path / "core" / "sampling" / "exits.py").write_text(
        "from edgewatt.core.sampling import tracked\n"
    )
    assert _circles(_graph(tmp_path)) == [
        ["edgewatt.core.sampling.contributors", "edgewatt.core.sampling.tracked"]
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("edgewatt-*.whl")
    return built


def test_the_wheel_installs_only_edgewatt(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"edgewatt"}
    assert "edgewatt/client/thread_monitor.py" in names
    assert "edgewatt/core/data/carbon_intensity.json" in names
    assert not any(n.startswith("edgewatt/__init__") for n in names)  # a namespace


# A Flower-style project: its own client.py and exporter.py beside the training script.
USER_CLIENT = "raise SystemExit('the user client.py was imported instead of edgewatt.client')\n"
SCRIPT = """
import json, sys, time
from edgewatt.client import register, track
from edgewatt.client.thread_monitor import FileMonitor
from edgewatt.client.process_monitor import FileMonitor as ProcessFileMonitor
import edgewatt

for monitor_class, name in ((FileMonitor, "thread.jsonl"), (ProcessFileMonitor, "process.jsonl")):
    monitor = monitor_class(name, 0.1, records="edgewatt")
    monitor.start()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    monitor.stop()
    assert monitor.summary()["samples"] >= 1, monitor.summary()
with register(labels={"run": "wheel"}, fallback="always") as reg:
    mode = reg.mode
print(json.dumps({"path": list(edgewatt.__path__), "mode": mode}))
"""


def test_a_project_with_its_own_client_py_uses_the_installed_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # The dependencies come from the test environment, as a plain path: its .pth files
    # (the editable install's finder among them) are not processed from there.
    deps = subprocess.run(
        [sys.executable, "-c", "import psutil, os; print(os.path.dirname(psutil.__path__[0]))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(deps + "\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "client.py").write_text(USER_CLIENT)
    (project / "exporter.py").write_text(USER_CLIENT.replace("client", "exporter"))
    (project / "train.py").write_text(SCRIPT)
    result = subprocess.run(
        [str(python), "train.py"],
        capture_output=True,
        text=True,
        cwd=project,
        env={"PATH": "/usr/bin:/bin", "EDGEWATT_SOCKET": str(tmp_path / "none.sock")},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = __import__("json").loads(result.stdout.splitlines()[-1])
    assert out == {"path": [str(Path(site) / "edgewatt")], "mode": "local"}
    for name in ("thread.jsonl", "process.jsonl"):
        assert (project / name).read_text().startswith('{"type": "header"')
