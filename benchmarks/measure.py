"""Helpers the benchmarks share: a free port, a process's RSS, percentiles, waiting
for a daemon."""

from __future__ import annotations

import socket
import time

from client import _transport


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
            if _transport.call(socket_path, "GET", "/healthz")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no daemon answered at {socket_path} within {timeout:g} s")
        time.sleep(0.05)
