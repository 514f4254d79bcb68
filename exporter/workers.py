"""The threads that serve the API's connections, kept for the next connection once one
ends: a connection is handed to an idle thread (one wake), not to a thread started for
it (a thread's start waits until it runs: 0.1 to 0.7 ms here, on the path of every
registration and every Flower ClientApp's first request). At most ``KEEP`` wait at
once, asleep until a connection comes (no timer: a thread with nothing to serve never
wakes); a burst's threads beyond them end with it. How many serve at once is the
server's to bound (unix_http.py: one thread a connection)."""

from __future__ import annotations

import queue
import threading
import typing  # a runtime alias: Python 3.8's abc.Callable takes no [...]

from edgewatt.core.compat import name_thread

KEEP = 4  # idle threads kept: connections come one after another (a registration, a round)
NAME = "api-conn"  # the kernel's name of each (top -H, /proc/PID/task/TID/comm)

Job = typing.Callable[[], None]


class Workers:
    """Runs each job (a connection served to its end) in a thread of its own, reusing
    an idle one where there is one."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Job | None]] = []  # each idle thread's inbox
        self._closed = False

    def run(self, job: Job) -> None:
        """``job`` in an idle thread, or in a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put(job)
            return
        threading.Thread(target=self._serve, args=(job,), name=NAME, daemon=True).start()

    def idle(self) -> int:
        """Threads waiting for a job now."""
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """End the idle threads now, and each busy one once its job is done."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)

    def _serve(self, first: Job) -> None:
        name_thread(threading.current_thread())
        inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        job: Job | None = first
        while job is not None:
            job()  # the server's job handles its own errors (socketserver's handle_error)
            with self._lock:
                if self._closed or len(self._idle) >= self._keep:
                    return
                self._idle.append(inbox)
            job = inbox.get()
