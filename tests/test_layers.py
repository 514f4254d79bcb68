"""The layers import one way: cli -> exporter (the daemon) and client (the library) ->
core. Checked over the source tree, so a new import that reaches up or across fails
here before it ships; and the built wheel installs nothing but ``edgewatt``."""

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
