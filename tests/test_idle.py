"""A daemon with nothing to do sleeps: its threads' wake-ups as the kernel counted them
(voluntary context switches in /proc/PID/task/TID/status), not as a timer saw them."""

from __future__ import annotations

import os
import time
from typing import Any

from edgewatt.exporter.statefile import SYNC_S
from tests.conftest import wait_for

IDLE_S = 4.0


def wake_ups(pid: int) -> dict[str, int]:
    """Each thread's voluntary context switches so far, by its kernel name (the main
    thread as "main")."""
    counts = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "main" if tid == str(pid) else f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                line = next(s for s in f if s.startswith("voluntary_ctxt_switches:"))
        except FileNotFoundError:
            continue  # a connection's thread, ended
        counts[name] = counts.get(name, 0) + int(line.split()[1])
    return counts


def test_threads_with_nothing_to_serve_do_not_wake(daemon_factory: Any, spawn: Any) -> None:
    daemon = daemon_factory(interval=1.0)
    child = spawn("import time; time.sleep(60)")
    daemon.register(child.pid)
    assert daemon.proc is not None
    pid = daemon.proc.pid
    # The registration's connection ends; its thread waits for the next one (workers.py).
    wait_for(lambda: "api-conn" in wake_ups(pid))
    # Its journal record fsynced: the state thread batches fsyncs on a timer
    # (within SYNC_S of the change), so the window is the wait's meaning.
    time.sleep(SYNC_S + 1.0)
    before = wake_ups(pid)
    time.sleep(IDLE_S)  # no request, no scrape, no signal
    after = wake_ups(pid)
    names = ("api", "metrics", "main", "state", "api-conn")
    woken = {name: after[name] - before[name] for name in names}
    # At most one for the API and /metrics threads: the last block of the
    # registration's accept may fall inside. Polling every 0.2 s (the API) or 1 s
    # (/metrics) counts 20 and 4 here; the main thread waits for signals only, the
    # state thread for a change.
    assert woken["api"] <= 1 and woken["metrics"] <= 1 and woken["main"] == 0, woken
    assert woken["state"] == 0 and woken["api-conn"] == 0, woken  # no timer: asleep
    # The sampler has a pass to make every interval: its wakes are its work.
    assert after["sampler"] > before["sampler"]
    # Asleep without a timeout, yet the stop is as quick as documented (2 s).
    assert daemon.stop() < 2.0
