"""HelperProcessWorker's helper (``_workers.py``): ``python -m edgewatt.client._helper``.

Reads the monitor's spec (``_loop.Spec``) as one JSON line on stdin, answers one JSON line
``{"error", "info"}``, then one JSON line per reading on stdout. End of stdin (the
caller stopped, or died) ends it after a last reading.

The helper is a child of the monitored process, so the process tree's figures include
it: each reading has the helper's own CPU time and RSS taken out (read right after the
reading; what it ran between the two is within a clock tick).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading

from edgewatt.client._loop import LoopState, Mark, Spec, sampling_loop
from edgewatt.client._samples import Reading


def own_rss_bytes() -> int:
    """This process's resident memory (Linux: /proc/self/statm; elsewhere psutil)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil  # the psutil backend's platforms: it is installed there

        return int(psutil.Process().memory_info().rss)


def own_pss_bytes() -> int:
    """This process's PSS (Linux 4.14 on: smaps_rollup; 0 where none is read)."""
    from edgewatt.core.sampling.pss import read_rollup

    rollup = read_rollup(os.getpid())
    return 0 if rollup is None else rollup.pss


def without_self(reading: Reading) -> Reading:
    """The monitored tree's reading less this helper's CPU time and memory."""
    times = os.times()
    pss = reading.memory_pss_bytes
    return dataclasses.replace(
        reading,
        cpu_user_s=max(0.0, reading.cpu_user_s - times.user),
        cpu_system_s=max(0.0, reading.cpu_system_s - times.system),
        memory_rss_bytes=max(0, reading.memory_rss_bytes - own_rss_bytes()),
        memory_pss_bytes=None if pss is None else max(0, pss - own_pss_bytes()),
    )


def main() -> int:
    spec = Spec(**json.loads(sys.stdin.readline()))
    state = LoopState()
    out_lock = threading.Lock()

    def send(message: dict) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def read_input() -> None:
        # Phase marks, one JSON line each, until end of input: then stop. Each is
        # answered once the loop's reading at its edge is in (the caller waits for it).
        for line in sys.stdin:
            mark = json.loads(line)
            at = mark["at"]
            state.mark(Mark(mark["phase"], at, lambda at=at: send({"marked": at})))
        state.end()

    threading.Thread(target=read_input, daemon=True).start()
    try:
        sampling_loop(
            spec,
            state,
            emit=lambda reading: send(dataclasses.asdict(reading)),
            ready=lambda error, info: send({"error": error, "info": info}),
            adjust=without_self,
        )
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
