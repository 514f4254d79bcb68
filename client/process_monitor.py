"""heflwr.monitor.process_monitor, drop-in: FileMonitor, PrometheusMonitor, RemoteMonitor.

Sampling runs in a helper process started with "spawn" (no fork of this process).
"""

from edgewatt.client import _monitor


class FileMonitor(_monitor.FileMonitor):
    variant = "process"


class PrometheusMonitor(_monitor.PrometheusMonitor):
    variant = "process"


class RemoteMonitor(_monitor.RemoteMonitor):
    variant = "process"


__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
