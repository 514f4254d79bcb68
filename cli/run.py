"""`edgewatt run [--label k=v]... [--output FILE.jsonl] -- CMD ARGS...`

Runs a command, monitored without touching its code: registered with the daemon when
one answers, else sampled by this process. Signals are forwarded to the command, the
exit status is the command's (128+N when a signal N ended it), and a summary table is
printed on stderr so that the command's own output stays clean.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from edgewatt.cli.report import summary_table
from edgewatt.client._monitor import FileMonitor
from edgewatt.core.labels import validate_labels

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """--label KEY=VALUE pairs, checked by the daemon's own rule before the command
    starts: a label the daemon would refuse is an error here, not a silent fallback."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label must be KEY=VALUE, got {pair!r}")
        labels[key] = value
    return validate_labels(labels)


def run(
    command: list[str],
    labels: dict[str, str],
    output: str | None,
    interval: float,
    socket: str | None,
) -> int:
    if not command:
        raise ValueError("no command given: edgewatt run [options] -- CMD ARGS...")
    monitor = FileMonitor(output or os.devnull, interval, labels=labels, socket=socket)
    if output is None:
        monitor.sink = "none"
    monitor.set_metrics(power=True)
    monitor.command = shlex.join(command)
    started = time.monotonic()
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"edgewatt run: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    previous: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    monitor.pid = child.pid
    try:
        monitor.start()
    except OSError as exc:
        print(f"edgewatt run: monitoring unavailable: {exc}", file=sys.stderr)
    try:
        code, usage = _wait(child)
    finally:
        monitor.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    wall_s = time.monotonic() - started
    status = 128 - code if code < 0 else code
    shown = " ".join(shlex.join(command).split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    title = f"edgewatt run: {shown} (exit status {status}, monitored via {monitor.source})"
    print(summary_table(_exact(monitor.summary(), usage, wall_s), title), file=sys.stderr)
    if output:
        print(f"  samples written to {output}", file=sys.stderr)
    return status


def _wait(child: subprocess.Popen[bytes]) -> tuple[int, os.struct_rusage | None]:
    """The command's exit code and its resource usage as the kernel counted it for
    its parent (wait4): every CPU second of it and of its reaped descendants, up to
    the last, which no sampling can see."""
    try:
        _, status, usage = os.wait4(child.pid, 0)  # PEP 475: retried across signals
    except ChildProcessError:  # reaped elsewhere (cannot happen here; be safe)
        return child.wait(), None
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage


def _exact(summary: dict[str, Any], usage: os.struct_rusage | None, wall_s: float) -> dict:
    """The monitor's summary with the kernel's own figures for the whole command: CPU
    time and peak RSS from wait4, duration from start to exit."""
    if usage is None:
        return summary
    cpu_s = usage.ru_utime + usage.ru_stime
    exact = {**summary, "duration_s": wall_s, "cpu_time_s": cpu_s}
    exact["avg_cpu_usage"] = cpu_s / wall_s * 100 if wall_s > 0 else 0.0
    # ru_maxrss: KiB, the largest of the command and its descendants, one at a time.
    exact["memory_rss_peak_bytes"] = max(
        summary.get("memory_rss_peak_bytes") or 0, usage.ru_maxrss * 1024
    )
    return exact
