"""The device's power averaged over the last minute, from the energies of the passes.

An ``Output`` (output.py) of the daemon, fed one snapshot a pass; read by GET /v1/top
and /v1/host. An average is
the energy the sensors counted over the window divided by its length, so a short spike
is neither lost nor overweighted, whatever the reader's rate.
"""

from __future__ import annotations

import threading
from collections import deque

from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter.output import OutputStatus

WINDOW_S = 60.0
HOST = ""  # the key of the device's total beside the rails' names
_MAX_EDGES = 6001  # a 10 ms interval for a minute: the deque's bound whatever the config


class RecentPower:
    name = "recent_power"

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._edges: deque[tuple[float, dict[str, float | None]]] = deque(maxlen=_MAX_EDGES)
        self._lock = threading.Lock()

    def start(self) -> None:
        """Nothing runs: the API's threads read the average."""

    def stop(self, deadline: float) -> None:
        """Nothing to write."""

    def report(self) -> OutputStatus | None:
        return None

    def update(self, snapshot: Snapshot) -> None:
        power = snapshot.power
        if power is None or power.measured_at is None:
            return
        energies = {r.name: r.energy_j for r in power.rails}
        energies[HOST] = power.host_energy_j
        now = power.measured_at  # monotonic: a stepped clock moves no window
        with self._lock:
            if self._edges and now <= self._edges[-1][0]:
                return  # the same reading again (no new sensor edge this pass)
            self._edges.append((now, energies))
            while now - self._edges[0][0] > self.window_s:
                self._edges.popleft()

    def average_w(self) -> tuple[dict[str, float], float]:
        """(W by rail name, HOST for the total; the seconds the average spans): only
        what has an energy at both ends of the window."""
        with self._lock:
            if len(self._edges) < 2:
                return {}, 0.0
            (t0, first), (t1, last) = self._edges[0], self._edges[-1]
        span = t1 - t0
        averages = {}
        for name, end in last.items():
            start = first.get(name)
            if start is not None and end is not None:
                averages[name] = (end - start) / span
        return averages, span
