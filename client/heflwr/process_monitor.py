"""heflwr.monitor.process_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a helper interpreter (`python -m edgewatt.client._helper`, no fork),
which takes its own CPU and memory out of the figures. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from __future__ import annotations

from edgewatt.client import _monitor
from edgewatt.client.heflwr.shape import HelperShape


class FileMonitor(HelperShape, _monitor.FileMonitor):
    pass


class PrometheusMonitor(HelperShape, _monitor.PrometheusMonitor):
    pass


class RemoteMonitor(HelperShape, _monitor.RemoteMonitor):
    pass


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
