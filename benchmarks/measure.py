"""Helpers the benchmarks share: a free port, a process's RSS and per-thread counters,
percentiles, starting and waiting for a daemon, an older revision to run beside it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Counters:
    run_ns: int
    voluntary: int
    involuntary: int


def thread_counters(pid: int) -> dict[str, Counters]:
    """Per thread name (the main thread as "main"; same names summed): its counters now."""
    found: dict[str, Counters] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = "main" if tid == str(pid) else f.read().strip()
            with open(f"{base}/schedstat") as f:
                run_ns = int(f.read().split()[0])
            with open(f"{base}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # a connection's thread that ended meanwhile
        counters = Counters(
            run_ns,
            int(fields["voluntary_ctxt_switches"]),
            int(fields["nonvoluntary_ctxt_switches"]),
        )
        old = found.get(name)
        if old is not None:
            counters = Counters(
                old.run_ns + counters.run_ns,
                old.voluntary + counters.voluntary,
                old.involuntary + counters.involuntary,
            )
        found[name] = counters
    return found


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """``rev``'s tree as an importable ``edgewatt`` package: the directory to put first
    on PYTHONPATH."""
    top = Path(tempfile.mkdtemp(prefix="edgewatt-rev-"))
    try:
        package = top / "edgewatt"
        package.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)
