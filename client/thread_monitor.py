"""heflwr.monitor.thread_monitor's path: the drop-ins of ``edgewatt.client.heflwr``."""

from edgewatt.client.heflwr.thread_monitor import FileMonitor, PrometheusMonitor, RemoteMonitor

__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
