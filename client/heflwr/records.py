"""heflwr 0.1.91's shapes of the monitors' figures: stats() and summary() with its seven
keys always, the FileMonitor line, the RemoteMonitor message, the /log record and the
stdout echo through the "HeFlwr" logger (heflwr/monitor and heflwr/log are the
contract, tests/test_heflwr_compat.py checks it against the package itself).

The figures under those keys are edgewatt's (``_samples.py``): CPU of the process and
its descendants, memory without the process variant's helper, the process's own TCP
bytes, power integrated over the real elapsed time.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

STATS_KEYS = (
    "cpu_usage",
    "memory_usage",
    "network_bytes_sent",
    "network_bytes_recv",
    "power_vdd_in",
    "power_vdd_cpu_gpu_cv",
    "power_vdd_soc",
)
SUMMARY_KEYS = (
    "avg_cpu_usage",
    "avg_memory_usage",
    "total_network_bytes_sent",
    "total_network_bytes_recv",
    "total_power_vdd_in",
    "total_power_vdd_cpu_gpu_cv",
    "total_power_vdd_soc",
)
LOGGER_NAME = "HeFlwr"  # heflwr.log's logger, whose records /log receives
LOG_FORMAT = "%(levelname)s %(name)s %(asctime)s | %(filename)s:%(lineno)d | %(message)s"
# (key, FileMonitor's label, RemoteMonitor's label, unit suffix) in heflwr's order.
FIELDS = (
    ("cpu_usage", "CPU Usage", "Cpu Usage", "%"),
    ("memory_usage", "Memory Usage", "Memory Usage", "%"),
    ("network_bytes_sent", "Bytes Sent", "Bytes Sent", ""),
    ("network_bytes_recv", "Bytes Recv", "Bytes Recv", ""),
    ("power_vdd_in", "VDD In", "VDD In", ""),
    ("power_vdd_cpu_gpu_cv", "VDD Cpu_Gpu_Cv", "VDD cpu_gpu_cv", ""),
    ("power_vdd_soc", "VDD Soc", "VDD soc", ""),
)


def value(key: str, figure: Any) -> Any:
    """A sample's figure as heflwr types it: cpu_usage rounded to 0.1 % (psutil's
    cpu_percent), bytes and milliwatts as int (tegrastats prints whole mW)."""
    if key == "cpu_usage":
        return round(figure, 1)
    if key == "memory_usage":
        return float(figure)
    return round(figure)


def stats(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """heflwr's stats(): the seven keys, each a list (empty when off or unmeasured)."""
    return {key: [value(key, s[key]) for s in samples if key in s] for key in STATS_KEYS}


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    """heflwr's summary(): the seven keys, 0 where nothing was measured; the figures
    are edgewatt's (``Recorder.summary()``: time-weighted CPU, power integrated over
    the real elapsed time in mJ)."""
    return {key: figures.get(key, 0) for key in SUMMARY_KEYS}


def _parts(sample: dict[str, Any], label: int) -> str:
    return "".join(
        f"{field[label]}: {value(field[0], sample[field[0]])}{field[3]}, "
        for field in FIELDS
        if field[0] in sample
    )


def file_line(sample: dict[str, Any]) -> str:
    """FileMonitor's line: ``CPU Usage: 1.0%, Memory Usage: 0.5%, Bytes Sent: 0, ...``."""
    return _parts(sample, 1)


def message(sample: dict[str, Any]) -> str:
    """RemoteMonitor's message: ``Cpu Usage: 1.0%, Memory Usage: 0.5%, ...``."""
    return _parts(sample, 2)


def record(text: str) -> logging.LogRecord:
    """The record heflwr's logger.info(message) makes in update_metrics(), formatted
    as its console handler formats it (which sets ``message`` and ``asctime``, both
    posted to /log)."""
    made = logging.getLogger(LOGGER_NAME).makeRecord(
        LOGGER_NAME, logging.INFO, __file__, 0, text, (), None, func="update_metrics"
    )
    logging.Formatter(LOG_FORMAT).format(made)
    return made


def log_fields(identifier: str, made: logging.LogRecord) -> dict[str, Any]:
    """heflwr's CustomHTTPHandler.mapLogRecord: the identifier, then the record's fields."""
    return {"identifier": identifier, **made.__dict__}


class _Stdout(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever sys.stdout is at each record (heflwr's binds the one at
    import; a replaced stdout, pytest's capture, would then get nothing)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, _value: Any) -> None: ...


def echo(text: str) -> None:
    """Each RemoteMonitor sample on stdout through the "HeFlwr" logger, as heflwr.log
    sets it up at import (level DEBUG, a stdout handler with its format), unless
    something (heflwr itself, the script) already gave that logger a handler."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = _Stdout()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    logger.info(text)
