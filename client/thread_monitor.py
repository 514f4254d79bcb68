"""heflwr.monitor.thread_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a thread of this process.
"""

from edgewatt.client import _monitor


class FileMonitor(_monitor.FileMonitor):
    variant = "thread"


class PrometheusMonitor(_monitor.PrometheusMonitor):
    variant = "thread"


class RemoteMonitor(_monitor.RemoteMonitor):
    variant = "thread"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
