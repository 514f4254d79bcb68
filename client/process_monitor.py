"""heflwr.monitor.process_monitor's path: the drop-ins of ``edgewatt.client.heflwr``."""

from edgewatt.client.heflwr.process_monitor import FileMonitor, PrometheusMonitor, RemoteMonitor

__all__ = ["FileMonitor", "PrometheusMonitor", "RemoteMonitor"]
