"""A running target as the state file keeps it: its identity and holders, enough for a
restarted daemon to register it again (exporter/statefile.py writes the file,
exporter/registration.py's parse_saved reads an entry back)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from edgewatt.core.targets.target import Target


def saved(target: Target) -> dict[str, Any]:
    """The state file's entry for ``target``."""
    me = target.identity
    entry: dict[str, Any] = {
        "id": me.id,
        "pid": me.pid,
        "start_ticks": me.start_ticks,
        "labels": me.labels,
        "children": me.children,
        "uid": me.uid,
        "registered_at": me.registered_at,
        "holders": target.holders,
    }
    if me.command is not None:  # its name until a restarted daemon sees it exec'd too
        entry["command"] = me.command
    if me.cgroup_name is not None:  # resolved again at restore: it may have restarted
        name = me.cgroup_name
        entry["cgroup"] = {
            "kind": name.kind,
            "name": name.name,
            "runtime": name.runtime,
            "container_id": name.container_id,
        }
    return entry


class StateSaver:
    """Hands the table's state to ``on_change`` (the daemon's state file; None:
    nothing is kept, as in the in-process client)."""

    def __init__(self, on_change: Callable[[list[dict[str, Any]]], None] | None) -> None:
        self._on_change = on_change
        self._lock = threading.Lock()

    def save(self, state: Callable[[], list[dict[str, Any]]]) -> None:
        """Save what ``state()`` returns now."""
        if self._on_change is not None:
            # Taken and handed on under one lock: of two changes saved at once, the
            # state read last is also saved last (never an older over a newer).
            with self._lock:
                self._on_change(state())
