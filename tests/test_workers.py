"""The threads that serve the API's connections (exporter/workers.py): kept for the
next connection, a new one only where none waits, ended beyond the kept ones or when
closed."""

from __future__ import annotations

import threading
from pathlib import Path

from edgewatt.core import transport
from edgewatt.exporter.workers import Workers
from tests.conftest import DaemonProcess, wait_for


def test_a_job_goes_to_an_idle_thread_and_a_new_one_starts_only_where_none_waits() -> None:
    workers = Workers(keep=2)
    ran: list[int] = []
    done = threading.Semaphore(0)

    def job() -> None:
        ran.append(threading.get_ident())
        done.release()

    workers.run(job)
    done.acquire()
    wait_for(lambda: workers.idle() == 1)
    for _ in range(5):  # one after another: the same thread each time
        workers.run(job)
        done.acquire()
        wait_for(lambda: workers.idle() == 1)
    assert len(set(ran)) == 1
    # Three at once: the idle one and two new; two are kept after, the third ends.
    release = threading.Event()
    started = threading.Semaphore(0)

    def held() -> None:
        ran.append(threading.get_ident())
        started.release()
        release.wait(10)

    for _ in range(3):
        workers.run(held)
    for _ in range(3):
        started.acquire()
    assert len(set(ran[-3:])) == 3 and workers.idle() == 0
    release.set()

    def alive() -> int:
        return len({t.ident for t in threading.enumerate()} & set(ran[-3:]))

    wait_for(lambda: workers.idle() == 2 and alive() == 2)
    workers.close()
    wait_for(lambda: alive() == 0)
    assert workers.idle() == 0


def test_connections_one_after_another_are_served_by_a_kept_thread(
    daemon: DaemonProcess,
) -> None:
    # The daemon's threads seen while each of 20 connections is open, one after
    # another: one thread a connection would show 20 thread ids.
    def threads() -> set[str]:
        assert daemon.proc is not None
        return {p.name for p in Path(f"/proc/{daemon.proc.pid}/task").iterdir()}

    before = threads()
    seen: set[str] = set()
    for _ in range(20):
        connection = transport.Connection(daemon.socket)
        assert connection.call("GET", "/healthz")[0] == 200  # its thread serves it now
        seen |= threads()
        connection.close()
    # A connection that comes while the last one's thread still ends it (its socket
    # shut down, its count given back) gets another: a few, not one a connection.
    assert len(seen - before) <= 3
