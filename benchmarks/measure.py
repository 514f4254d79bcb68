"""Helpers the benchmarks share: a free port, a process's RSS, percentiles, starting
and waiting for a daemon."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from edgewatt.core import transport

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_healthy(socket_path: str, timeout: float = 20.0) -> None:
    """Until the daemon at ``socket_path`` answers GET /healthz with 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if transport.call(socket_path, "GET", "/healthz")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no daemon answered at {socket_path} within {timeout:g} s")
        time.sleep(0.05)


def start_daemon(
    socket_path: str,
    state_dir: Path,
    *flags: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 20.0,
    nice: int = 0,
) -> subprocess.Popen:
    """`edgewatt serve` from this checkout on its own socket and state directory,
    logging warnings only, with further ``flags``, at ``nice`` (below 0: root's, as
    the systemd unit's Nice=); returns once it answers."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "edgewatt.cli", "serve", "--socket", socket_path,
            "--state-dir", str(state_dir), "--log-level", "warning", *flags,
        ],
        cwd=ROOT, env=env, preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )  # fmt: skip
    try:
        wait_healthy(socket_path, timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
