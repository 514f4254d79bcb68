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
from typing import Any

from edgewatt.cli.report import summary_table
from edgewatt.client._monitor import FileMonitor

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label must be KEY=VALUE, got {pair!r}")
        labels[key] = value
    return labels


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
        code = child.wait()
    finally:
        monitor.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = 128 - code if code < 0 else code
    shown = " ".join(shlex.join(command).split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    title = f"edgewatt run: {shown} (exit status {status}, monitored via {monitor.source})"
    print(summary_table(monitor.summary(), title), file=sys.stderr)
    if output:
        print(f"  samples written to {output}", file=sys.stderr)
    return status
