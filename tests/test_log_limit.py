"""The daemon's log is bounded per kind of line, whatever a client sends."""

from __future__ import annotations

import logging

from edgewatt.exporter.log_limit import MAX_KINDS, KindLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "edgewatt.api") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_one_kind_is_written_burst_times_a_window_and_the_rest_counted() -> None:
    clock = Clock()
    limit = KindLimit(burst=3, window_s=60.0, clock=clock)
    # One kind: the template, whatever its arguments (each request another path).
    written = [limit.filter(_record("api: error on %s", f"/p{i}")) for i in range(100)]
    assert written == [True] * 3 + [False] * 97
    # Another kind, another logger: a share of their own.
    assert limit.filter(_record("other %s", 1))
    assert limit.filter(_record("api: error on %s", "/x", name="edgewatt.scrape"))
    clock.now += 59.9
    assert not limit.filter(_record("api: error on %s", "/late"))
    clock.now += 0.1  # the next window: its first line says how many were left out
    first = _record("api: error on %s", "/next")
    assert limit.filter(first)
    assert first.getMessage() == "api: error on /next [98 more like this left out in 60 s]"
    second = _record("api: error on %s", "/next")
    assert limit.filter(second) and second.getMessage() == "api: error on /next"


def test_the_kinds_remembered_are_bounded() -> None:
    limit = KindLimit(burst=1, window_s=60.0, clock=Clock())
    for i in range(MAX_KINDS + 500):
        assert limit.filter(_record(f"kind {i}"))
    assert len(limit._windows) == MAX_KINDS
    assert limit.filter(_record("kind 0"))  # forgotten first: a window of its own again
    assert not limit.filter(_record(f"kind {MAX_KINDS + 499}"))  # the newest are kept
