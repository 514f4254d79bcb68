"""heflwr.monitor.thread_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a thread of this process. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from edgewatt.client import _monitor


class FileMonitor(_monitor.FileMonitor):
    variant = "thread"
    records = "heflwr"
    network = "process"


class PrometheusMonitor(_monitor.PrometheusMonitor):
    variant = "thread"
    records = "heflwr"
    network = "process"


class RemoteMonitor(_monitor.RemoteMonitor):
    variant = "thread"
    records = "heflwr"
    network = "process"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
