"""heflwr.monitor.process_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a helper interpreter (`python -m edgewatt.client._helper`, no fork),
which takes its own CPU and memory out of the figures. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from __future__ import annotations

import threading

from edgewatt.client import _monitor, _workers


class _Flag:
    @property
    def monitoring(self) -> threading.Event:
        """heflwr's multiprocessing.Event: set while monitoring."""
        return self._running  # type: ignore[attr-defined]


class FileMonitor(_Flag, _monitor.FileMonitor):
    worker = _workers.HelperProcessWorker
    records = "heflwr"
    network = "process"


class PrometheusMonitor(_Flag, _monitor.PrometheusMonitor):
    worker = _workers.HelperProcessWorker
    records = "heflwr"
    network = "process"


class RemoteMonitor(_Flag, _monitor.RemoteMonitor):
    worker = _workers.HelperProcessWorker
    records = "heflwr"
    network = "process"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
