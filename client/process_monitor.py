"""heflwr.monitor.process_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a helper interpreter (`python -m edgewatt.client._helper`, no fork),
which takes its own CPU and memory out of the figures. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from edgewatt.client import _monitor


class FileMonitor(_monitor.FileMonitor):
    variant = "process"
    records = "heflwr"
    network = "process"


class PrometheusMonitor(_monitor.PrometheusMonitor):
    variant = "process"
    records = "heflwr"
    network = "process"


class RemoteMonitor(_monitor.RemoteMonitor):
    variant = "process"
    records = "heflwr"
    network = "process"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
