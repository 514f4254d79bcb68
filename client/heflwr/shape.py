"""heflwr's public attributes of a monitor, on the drop-in classes: ``monitoring``,
``thread`` (the sampling thread), ``monitor_process`` (the helper, a
``subprocess.Popen``), ``process`` (a ``psutil.Process`` of the monitored pid) and
``update_metrics()`` (the sampling loop, which a script may run itself)."""

from __future__ import annotations

import subprocess
import threading
from typing import Any

from edgewatt.client._monitor import Monitor
from edgewatt.client._workers import HelperProcessWorker, ThreadWorker


class HeflwrShape(Monitor):
    """Mixed in before a monitor's class: heflwr's records, its network scope (the
    process's own TCP bytes) and its attributes."""

    records = "heflwr"
    network = "process"
    _process: Any = None  # psutil's, made on first use (psutil is optional)

    @property
    def monitoring(self) -> Any:
        """heflwr's flag: True while monitoring."""
        return self.running

    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread, where a ThreadWorker runs the loop."""
        return self._worker.thread if isinstance(self._worker, ThreadWorker) else None

    @property
    def monitor_process(self) -> subprocess.Popen[str] | None:
        """The helper, where a HelperProcessWorker runs the loop (heflwr's is a
        multiprocessing.Process)."""
        return self._worker.helper if isinstance(self._worker, HelperProcessWorker) else None

    @property
    def process(self) -> Any:
        """The monitored process as a ``psutil.Process`` (heflwr's thread variant's),
        one object, so its cpu_percent() compares with its previous call."""
        if self._process is None or self._process.pid != self.pid:
            try:
                import psutil
            except ImportError:
                why = "monitor.process is a psutil.Process: install psutil"
                raise AttributeError(why) from None
            self._process = psutil.Process(self.pid)
        return self._process

    def update_metrics(self) -> None:
        """heflwr's sampling loop: sample every interval until stop(), in the calling
        thread (a script may run it, as heflwr's)."""
        if self.running:
            return
        worker = ThreadWorker()
        self._worker = worker
        self._running.set()
        worker.run_here(self._spec(), self._observe, self._begin)


class HelperShape(HeflwrShape):
    """The process drop-ins': the loop in the helper, and ``monitoring`` an Event."""

    worker = HelperProcessWorker

    @property
    def monitoring(self) -> threading.Event:
        """heflwr's multiprocessing.Event: set while monitoring."""
        return self._running
