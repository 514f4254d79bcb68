"""The Python environment the system service runs edgewatt from.

The system unit sandboxes the daemon: ``ProtectHome=yes`` hides /home, /root and
/run/user, ``PrivateTmp=yes`` gives it an empty /tmp and /var/tmp. An edgewatt
installed in a venv or with ``pipx`` (in a home directory) or run from a clone under
/tmp is invisible to it. Ubuntu and Debian refuse a system-wide ``pip install``
(PEP 668), so that is the common case: install-service then copies edgewatt and
exactly the distributions it depends on (not the rest of a training venv) into a
venv of the system's own Python under /opt/edgewatt, without downloading anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# What the unit's sandbox hides or replaces (systemd.exec(5): ProtectHome, PrivateTmp).
HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
SERVICE_ENV = "opt/edgewatt"  # under the install root
MARKER = ".edgewatt-service"  # says the folder is ours to replace or remove
# The extras that change what the daemon can read (NVML); test and plot extras are not
# the daemon's.
DAEMON_EXTRAS = ("nvidia",)


class CannotRelocate(Exception):
    """The service cannot be given a copy of this edgewatt; the message says why."""


def hidden_part(path: str | os.PathLike[str], hidden: tuple[str, ...] = HIDDEN) -> str | None:
    """The hidden folder that ``path`` (resolved) lies under, or None."""
    real = os.path.realpath(path)
    for top in hidden:
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return top
    return None


def package_dirs() -> list[Path]:
    """The running edgewatt's package folders (in a clone, for an editable install)."""
    import edgewatt.cli
    import edgewatt.client
    import edgewatt.core
    import edgewatt.exporter

    packages = (edgewatt.cli, edgewatt.client, edgewatt.core, edgewatt.exporter)
    return [Path(p.__file__).resolve().parent for p in packages]


def needs_copy(hidden: tuple[str, ...] = HIDDEN) -> str | None:
    """Why the unit cannot run the installed edgewatt in place, or None when it can."""
    for location in [Path(sys.prefix), *package_dirs()]:
        top = hidden_part(location, hidden)
        if top is not None:
            return f"{location} is under {top}, which the service's sandbox hides"
    return None


def base_python(hidden: tuple[str, ...] = HIDDEN) -> str | None:
    """An interpreter of this Python version that the service can run: the one the
    running venv was made from, else the system's own of the same version (compiled
    dependencies such as psutil's are built for one version); None when neither."""
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (base, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.access(candidate, os.X_OK) and not hidden_part(candidate, hidden):
            return os.path.realpath(candidate)
    return None


def _name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return match.group(1) if match else ""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure() -> dict[str, metadata.Distribution]:
    """edgewatt's installed distribution and every one it needs, by normalised name.

    A requirement that is not installed here was excluded by its environment marker
    (or is an extra not asked for); extras are followed only for edgewatt's own
    DAEMON_EXTRAS, and only when installed."""
    found: dict[str, metadata.Distribution] = {}
    todo = ["edgewatt"]
    while todo:
        name = _normal(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for requirement in dist.requires or []:
            marker = requirement.partition(";")[2]
            if "extra" in marker and not (
                name == "edgewatt" and any(f'"{e}"' in marker for e in DAEMON_EXTRAS)
            ):
                continue
            todo.append(_name(requirement))
    return found


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def copy_environment(dest: Path, hidden: tuple[str, ...] = HIDDEN) -> int:
    """Make ``dest`` a venv of the system Python holding this edgewatt and its
    dependencies; returns how many distributions were copied. Replaces a folder this
    function made before; refuses any other."""
    python = base_python(hidden)
    if python is None:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        base = getattr(sys, "_base_executable", sys.executable)
        raise CannotRelocate(
            f"edgewatt runs on Python {version} from {base}, which "
            f"the service cannot see, and the system has no python{version}: make the "
            "environment with the system's Python (/usr/bin/python3 -m venv), or install "
            "with pipx --global"
        )
    if dest.exists():
        if not (dest / MARKER).exists():
            raise CannotRelocate(f"{dest} exists and was not made by edgewatt; move it away")
        shutil.rmtree(dest)
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = _site_packages(dest)
    closure = dependency_closure()
    for name, dist in closure.items():
        files = dist.files
        if files is None:
            raise CannotRelocate(f"{name} was installed without a file list (RECORD)")
        for file in files:
            parts = Path(str(file)).parts
            # Scripts (../../bin) are not needed: the unit runs `python -m`. An editable
            # edgewatt lists only its finder; its packages are copied below.
            if parts[0] == ".." or (name == "edgewatt" and not parts[0].endswith(".dist-info")):
                continue
            source = Path(str(dist.locate_file(file)))
            if source.is_file() and "__pycache__" not in parts:
                target = site / Path(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    for package in package_dirs():
        shutil.copytree(
            package,
            site / "edgewatt" / package.name,
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )
    (dest / MARKER).write_text(
        "Made by `edgewatt install-service` for the system service; run it again after "
        "upgrading edgewatt. `edgewatt uninstall-service` removes it.\n"
    )
    for path in [dest, *dest.rglob("*")]:  # the service's dynamic user reads it
        if path.is_symlink():  # bin/python: chmod would change the system's interpreter
            continue
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return len(closure)


def remove_environment(dest: Path) -> bool:
    """Remove the copy install-service made; never a folder it did not make."""
    if (dest / MARKER).exists():
        shutil.rmtree(dest)
        return True
    return False
