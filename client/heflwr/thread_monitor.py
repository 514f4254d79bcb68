"""heflwr.monitor.thread_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a thread of this process. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from __future__ import annotations

from edgewatt.client import _monitor
from edgewatt.client.heflwr.shape import HeflwrShape


class FileMonitor(HeflwrShape, _monitor.FileMonitor):
    pass


class PrometheusMonitor(HeflwrShape, _monitor.PrometheusMonitor):
    pass


class RemoteMonitor(HeflwrShape, _monitor.RemoteMonitor):
    pass


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
