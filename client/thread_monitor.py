"""heflwr.monitor.thread_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a thread of this process. heflwr 0.1.91's keys, file format, gauge
names, wire format and attributes (``records="edgewatt"`` for edgewatt's own); network
bytes are the process's own TCP bytes, loopback to other processes included.
"""

from edgewatt.client import _monitor, _workers


class FileMonitor(_monitor.FileMonitor):
    worker = _workers.ThreadWorker
    records = "heflwr"
    network = "process"


class PrometheusMonitor(_monitor.PrometheusMonitor):
    worker = _workers.ThreadWorker
    records = "heflwr"
    network = "process"


class RemoteMonitor(_monitor.RemoteMonitor):
    worker = _workers.ThreadWorker
    records = "heflwr"
    network = "process"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
