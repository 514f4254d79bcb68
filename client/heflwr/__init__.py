"""heflwr 0.1.91's monitors, drop-in: thread_monitor.py and process_monitor.py (each
FileMonitor, PrometheusMonitor, RemoteMonitor), the attributes heflwr's have
(shape.py) and heflwr's records (records.py); ``edgewatt.client.thread_monitor`` and
``process_monitor`` name the same classes.

Nothing is imported here: the sinks import records.py alone.
"""
