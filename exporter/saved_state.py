"""The registrations kept across a daemon restart: saved to the state file
(statefile.py) on each change of the table, fsynced and caught up by the state thread
(run), registered again at start."""

from __future__ import annotations

import logging
import threading
from typing import Any

from edgewatt.core.targets import TargetError, TargetTable
from edgewatt.core.text import printable
from edgewatt.exporter.registration import InvalidRegistration, parse_saved
from edgewatt.exporter.statefile import StateFile

log = logging.getLogger(__name__)


class SavedState:
    def __init__(self, statefile: StateFile) -> None:
        self.statefile = statefile
        self.error: str | None = None  # why the last save failed; None: it worked
        self._deferred = False  # the write budget holds changes back (logged)
        self._restoring = False

    def save(self, state: list[dict[str, Any]]) -> None:
        """Save the registrations (the table's on_change); a failure keeps the files'
        previous state (statefile.py), is logged once until a save works again, and
        shown by /healthz meanwhile: the registration itself holds, only a restart
        would lose it."""
        if self._restoring:
            return  # one snapshot after the last, not one write per entry restored
        try:
            self.statefile.save(state)
        except OSError as exc:
            self._failed(exc)
            return
        self._worked()

    def run(self, stop: threading.Event) -> None:
        """The state thread: each fsync when due, the changes the budget held back
        when it allows them, a failed write again every few seconds; until ``stop``
        (then wake())."""
        while True:
            self.statefile.wait(stop)
            if stop.is_set():
                return
            try:
                caught_up = self.statefile.catch_up()
            except OSError as exc:
                self._failed(exc)
                continue
            if caught_up:
                self._worked()
            else:
                self._note_deferred()

    def wake(self) -> None:
        self.statefile.wake()

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            log.error(
                "cannot persist registrations to %s (%s): the files keep the last state "
                "saved; registrations since are lost at a restart",
                self.statefile.path,
                exc,
            )
        self.error = f"{self.statefile.path}: {exc}"

    def _worked(self) -> None:
        if self.error is not None:
            log.info("registrations persisted to %s again", self.statefile.path)
        self.error = None
        self._note_deferred()

    def _note_deferred(self) -> None:
        """Logged when the write budget starts holding changes back, and when it stops."""
        deferred = self.statefile.lagging
        if deferred and not self._deferred:
            budget = self.statefile.budget
            log.warning(
                "state writes over their budget (%d bytes an hour a person, %d all users, "
                "%d in all): those changes are kept in memory and written as the budget "
                "allows (a restart meanwhile loses them); others are written at once",
                budget.person_per_hour,
                budget.users_per_hour,
                budget.per_hour,
            )
        elif self._deferred and not deferred:
            log.info("state writes within their budget again: every change is persisted")
        self._deferred = deferred

    def restore(self, table: TargetTable, pid_max: int) -> int:
        """Register the saved entries in ``table`` again, each checked as a new
        registration is (fields, labels, and who may watch the live process); one log
        line per entry skipped. Returns how many were restored."""
        restored = 0
        self._restoring = True  # before the API serves: no registration comes meanwhile
        try:
            for n, entry in enumerate(self.statefile.load()):
                try:
                    saved = parse_saved(entry, pid_max)
                    request = saved.registration
                    kept = {
                        "target_id": saved.target_id,
                        "registered_at": saved.registered_at,
                        "holders": saved.holders,
                        "command": request.command,
                    }
                    if request.cgroup is not None:  # resolved anew: it may have restarted
                        table.register_cgroup(
                            request.cgroup, request.labels, saved.uid, limited=False, **kept
                        )
                    else:
                        table.register(
                            request.pid,
                            request.labels,
                            request.children,
                            saved.uid,
                            expect_start=saved.start_ticks,
                            **kept,
                        )
                    restored += 1
                except (InvalidRegistration, TargetError) as exc:
                    name = entry.get("id") if isinstance(entry, dict) else None
                    name = printable(name[:64]) if isinstance(name, str) else f"#{n + 1}"
                    log.info("not restoring registration %s: %s", name, exc)
        finally:
            self._restoring = False
        table.persist()
        return restored

    def close(self) -> None:
        """What the budget held back written, the journal fsynced: a stop keeps all."""
        try:
            self.statefile.catch_up(budgeted=False)
        except OSError as exc:
            self._failed(exc)
        self.statefile.close()
