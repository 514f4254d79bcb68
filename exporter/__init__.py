"""edgewatt daemon: samples registered processes and power sensors, exports OpenTelemetry."""

__version__ = "0.1.0"
