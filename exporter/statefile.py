"""The daemon's state directory: registrations persisted so they survive a daemon
restart, and the instance id where the machine has none.

Registrations are a snapshot (targets.json) and a journal of the changes since
(targets.journal, journal.py): a change appends one record with one write(2) before
it is answered, its fsync within SYNC_S (5 s, batched: a power cut loses at most
that, a kill of the daemon nothing, as the page cache outlives it). A registration
writes its target's labels once; an unregistration, a join or an exit writes a record
of a few dozen bytes whatever the labels. The journal is folded into a new snapshot
when it grows past COMPACT_RATIO times the live set (and COMPACT_MIN_BYTES), and at
each start. A change is paid from its person's WriteBudget (bytes per hour), its
share of the snapshot that will fold it included: past it, her changes wait in memory
and are written, coalesced, as her budget refills (``deferred`` counts them), and
everyone else's are written at once.

A file is replaced with write-to-temp, fsync, rename, fsync-directory: a crash at any
point leaves either the old or the new file, never a torn one; a snapshot names its
journal, so a journal left from before a snapshot is never replayed over it. A short
write (a nearly full filesystem: eMMC fills) is continued until all is written; one
that cannot finish (ENOSPC, EIO) removes the temporary file, or cuts the journal back
to its last whole record, and raises: the files keep the previous state. A failed
fsync makes the next write a new snapshot.

The daemon often runs as root, so the directory must be its own: one another user
could write would let that user plant a symlink at the temporary file and have root
overwrite what it points to. The directory is refused unless the daemon's user owns it
and nobody else may write to it; every file in it is opened relative to the directory
descriptor held from that check, with O_NOFOLLOW, and the temporary file with O_EXCL.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import threading
import uuid
from pathlib import Path
from typing import Any

from edgewatt.core.transport import directory_problem
from edgewatt.exporter import journal
from edgewatt.exporter.journal import Entry
from edgewatt.exporter.write_budget import WriteBudget

log = logging.getLogger(__name__)

# 2: the snapshot names its journal; 1 (before the journal) is read, its entries kept.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
REGISTRATIONS = "targets.json"
JOURNAL = "targets.journal"
INSTANCE_ID = "instance-id"
# The journal is folded into a snapshot past this many times the live set's bytes, and
# past COMPACT_MIN_BYTES: a snapshot costs at most a quarter of the journal it ends.
COMPACT_RATIO = 4
COMPACT_MIN_BYTES = 1 << 20
# Seconds at most from a change's write(2) to its fsync: what a power cut may lose (a
# kill of the daemon loses nothing). ext4's own commit interval: at most 720 fsyncs an
# hour, each rewriting at most the journal's last partial page (2.8 MiB an hour) and
# the filesystem's commit of its size.
SYNC_S = 5.0
# What a record pays for each byte it writes: its own, and its share of the snapshot
# that will fold it (a compaction writes at most 1 / COMPACT_RATIO of the journal it
# ends), so compactions need no budget of their own and never make anyone wait.
PREPAID = 1 + 1 / COMPACT_RATIO
# Seconds before a write that failed (ENOSPC, EIO) is tried again without a change.
RETRY_S = 5.0


class StateDirError(OSError):
    """A state directory the daemon must not use; the message says why and the fix."""


def open_own_directory(directory: Path) -> int:
    """A descriptor of ``directory``, created if missing, refused if another user owns
    it or may write to it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    euid = os.geteuid()
    problem = directory_problem(os.fstat(fd), (euid,), f"the daemon's uid {euid}")
    if problem is not None:
        os.close(fd)
        raise StateDirError(
            f"refusing state directory {directory}: {problem}; use a directory of the "
            "daemon's user that only it may write (--state-dir)"
        )
    return fd


class StateFile:
    def __init__(self, directory: Path, boot_id: str, budget: WriteBudget) -> None:
        self.path = directory / REGISTRATIONS
        self.budget = budget
        self._clock = budget.clock  # one clock for the budget and the fsync window
        self._boot_id = boot_id
        self._dir_fd = open_own_directory(directory)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # What the files hold, as a load would read it; each target's bytes in them.
        self._disk: dict[str, Entry] = {}
        self._sizes: dict[str, int] = {}
        # The table's latest state where the files lag behind it (budget, failure).
        self._wanted: dict[str, Entry] | None = None
        self._retry_at = 0.0  # monotonic: when a lagging write is tried again
        # -1: the next write is a snapshot (at start; after a failure that may have
        # left the journal behind the files' state).
        self._journal_fd = -1
        self._journal_bytes = 0
        self._started = False
        self._unsynced_since: float | None = None  # monotonic: the oldest write not fsynced
        self.lagging = False  # the budget holds writes back until _retry_at
        self.deferred = 0  # changes waiting for the budget
        self.written = 0  # bytes written to the state files since start

    def load(self) -> list[Any]:
        """Saved entries of this boot, unchecked (``registration.parse_saved`` checks
        each): the snapshot's, the journal's changes applied; an unreadable snapshot is
        logged and ignored, a journal read up to its last whole record."""
        try:
            raw = json.loads(self._read(REGISTRATIONS))
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring unreadable state file %s: %s", self.path, str(exc)[:200])
            return []
        if not isinstance(raw, dict) or raw.get("version") not in READABLE_VERSIONS:
            log.warning("ignoring state file %s: unknown format", self.path)
            return []
        if raw.get("boot_id") != self._boot_id:
            # pids and start ticks restart at boot: old registrations name strangers.
            log.info("state file %s is from an earlier boot; starting empty", self.path)
            return []
        targets = raw.get("targets")
        if not isinstance(targets, list):
            log.warning("ignoring state file %s: 'targets' is not a list", self.path)
            return []
        snapshot = raw.get("journal")
        if raw["version"] == 1 or not isinstance(snapshot, str):
            return targets
        # Entries the journal cannot name are left for parse_saved to refuse.
        odd: list[Any] = []
        live: dict[str, Entry] = {}
        for entry in targets:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                live[entry["id"]] = entry
            else:
                odd.append(entry)
        try:
            data = self._read(JOURNAL)
        except FileNotFoundError:
            return targets
        except OSError as exc:
            log.warning("ignoring unreadable journal %s: %s", JOURNAL, exc)
            return targets
        applied, used = journal.replay(data, snapshot, live)
        if used < len(data):
            log.warning(
                "state journal %s: %d byte(s) after its last whole record skipped (a write "
                "cut short)",
                self.path.with_name(JOURNAL),
                len(data) - used,
            )
        log.debug("state journal: %d change(s) replayed", applied)
        return [*odd, *live.values()]

    def save(self, targets: list[dict[str, Any]]) -> None:
        """Write the changes from the files' state to ``targets`` as their persons'
        budgets allow (the rest waits: ``deferred``); OSError where a write failed."""
        with self._changed:
            self._wanted = {entry["id"]: entry for entry in targets}
            try:
                self._write(budgeted=self._started)
            finally:
                self._changed.notify()

    def wait(self, stop: threading.Event) -> None:
        """Until an fsync or a lagging write is due, or ``stop`` is set (then wake())."""
        with self._changed:
            while not stop.is_set():
                due = self._due()
                now = self._clock()
                if due is not None and due <= now:
                    return
                self._changed.wait(None if due is None else due - now)

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def catch_up(self, budgeted: bool = True) -> bool:
        """What is due: the lagging changes the budget allows written, the journal
        fsynced; returns whether the files now hold the latest state. The fsync runs
        outside the lock: a slow card never holds up a registration."""
        now = self._clock()
        with self._lock:
            if self._wanted is not None and (self._retry_at <= now or not budgeted):
                self._write(budgeted)
            fd = -1
            since = self._unsynced_since
            if since is not None and (since + SYNC_S <= now or not budgeted):
                fd = os.dup(self._journal_fd)
                self._unsynced_since = None
        if fd >= 0:
            try:
                os.fsync(fd)
            except OSError:
                with self._lock:  # what the journal holds is unknown: a snapshot next
                    self._close_journal()
                    if self._wanted is None:
                        self._wanted = dict(self._disk)
                    self._retry_at = self._clock() + RETRY_S
                raise
            finally:
                os.close(fd)
        with self._lock:
            return self._wanted is None

    def instance_id(self) -> str:
        """An id kept here for a machine without /etc/machine-id."""
        try:
            value = self._read(INSTANCE_ID).decode("ascii", "replace").strip()
        except OSError:
            value = ""
        if not value:
            value = uuid.uuid4().hex
            with self._lock:
                self._replace(INSTANCE_ID, (value + "\n").encode())
        return value

    def close(self) -> None:
        with self._lock:
            self._close_journal()
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1

    def _due(self) -> float | None:
        """When catch_up has work (monotonic), None where it has none."""
        times = [self._retry_at] if self._wanted is not None else []
        if self._unsynced_since is not None:
            times.append(self._unsynced_since + SYNC_S)
        return min(times, default=None)

    def _write(self, budgeted: bool) -> None:
        """The changes to ``_wanted``; a failure is tried again in RETRY_S (by the state
        thread, or a change), not sooner: a full disk is not hammered."""
        try:
            self._write_changes(budgeted)
        except OSError:
            self._retry_at = self._clock() + RETRY_S
            raise

    def _write_changes(self, budgeted: bool) -> None:
        """The changes to ``_wanted``, smallest first, those their payers' budgets
        allow (a person past her share waits, nobody else); a snapshot instead where
        the journal is closed, and one after them where it is past its bound."""
        wanted = self._wanted
        if wanted is None:
            return
        if self._journal_fd < 0:
            if self._compact(wanted, budgeted):
                self._wanted, self.deferred, self.lagging = None, 0, False
            return
        pending = journal.changes(self._disk, wanted)
        pending.sort(key=lambda change: journal.weight(change[1]))
        waits: dict[int | None, float] = {}  # payers refused, and how long they wait
        held = 0
        for target_id, record in pending:
            entry = (self._disk if "drop" in record else wanted)[target_id]
            payer = self.budget.payer(entry.get("uid"))
            if payer in waits:  # her smaller change waits: so do her larger ones
                held += 1
                continue
            data = journal.encode(record)
            cost = len(data) * PREPAID
            if budgeted and not self.budget.allows(payer, cost):
                waits[payer] = self.budget.wait_s(payer, cost)
                held += 1
                continue
            self._spend(payer, cost, budgeted)
            self.written += len(data)
            self._append(data)
            if "drop" in record:
                self._disk.pop(target_id, None)
                self._sizes.pop(target_id, None)
            else:  # the files now hold the table's entry: kept by reference
                self._disk[target_id] = wanted[target_id]
                self._sizes[target_id] = self._sizes.get(target_id, 0) + len(data)
        live = sum(self._sizes.values())
        if self._journal_bytes > max(COMPACT_RATIO * live, COMPACT_MIN_BYTES):
            self._compact(dict(self._disk), budgeted=False)  # the records prepaid it
        if held:
            self._lag(held, min(waits.values()))
        else:
            # A churn's held change coalesced away: still lagging (for the log) until
            # the wait it was given is over, not once per registration and release.
            self._wanted, self.deferred = None, 0
            self.lagging = self.lagging and self._retry_at > self._clock()

    def _compact(self, entries: dict[str, Entry], budgeted: bool) -> bool:
        """A new snapshot of ``entries`` and an empty journal naming it (each replaced
        atomically, the snapshot first: a crash between leaves the new snapshot and a
        journal naming the old one, which is not replayed); False where the budget
        holds it back. ``budgeted``: a snapshot after a failure, the daemon's own."""
        estimate = sum(self._sizes.values())  # checked before paying for the encoding
        if budgeted and not self.budget.allows(None, estimate):
            # Appends wait too: the journal is closed until this is written.
            changes = len(journal.changes(self._disk, entries))
            self._lag(changes, self.budget.wait_s(None, estimate))
            return False
        token = secrets.token_hex(6)
        encoded = [json.dumps(entry, separators=(",", ":")).encode() for entry in entries.values()]
        head = json.dumps({"version": FORMAT_VERSION, "boot_id": self._boot_id, "journal": token})
        data = head[:-1].encode() + b', "targets": [' + b",".join(encoded) + b"]}"
        first = journal.header(token)
        self._spend(None, len(data) + len(first), budgeted)
        self.written += len(data) + len(first)
        self._started = True  # the snapshot at start is free; later ones are paid
        self._close_journal()  # a failure below leaves it closed: a snapshot again next
        self._replace(REGISTRATIONS, data)
        self._replace(JOURNAL, first)
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        self._journal_fd = os.open(JOURNAL, flags, dir_fd=self._dir_fd)
        self._journal_bytes = len(first)
        self._disk = dict(entries)
        self._sizes = {target_id: len(e) for target_id, e in zip(entries, encoded)}
        self._unsynced_since = None  # both files were fsynced by _replace
        return True

    def _append(self, data: bytes) -> None:
        """One record at the journal's end; where it cannot all be written, the journal
        is cut back to its last whole record (or closed: a snapshot next) and OSError
        raised."""
        try:
            _write_all(self._journal_fd, data)
        except OSError:
            try:
                os.ftruncate(self._journal_fd, self._journal_bytes)
            except OSError:
                self._close_journal()
            raise
        self._journal_bytes += len(data)
        if self._unsynced_since is None:
            self._unsynced_since = self._clock()

    def _spend(self, payer: int | None, cost: float, budgeted: bool) -> None:
        """Paid before writing: a write that fails costs its tries too (an ENOSPC retried
        stays within the budget)."""
        if budgeted:
            self.budget.spend(payer, cost)

    def _lag(self, changes: int, wait_s: float) -> None:
        self.deferred, self.lagging = changes, True
        self._retry_at = self._clock() + wait_s

    def _close_journal(self) -> None:
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = -1

    def _read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir_fd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _replace(self, name: str, data: bytes) -> None:
        """``data`` as the file ``name``, atomically; the caller holds the lock."""
        tmp = name + ".tmp"
        # Whatever is at the temporary name (a crash's leftover, or a planted link)
        # goes; O_EXCL then creates a fresh file or fails.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self._dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=self._dir_fd)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self._dir_fd)
            raise
        os.replace(tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        os.fsync(self._dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data``, or OSError: os.write may write less than asked (a filesystem
    with a page left writes that page), and the next call then names the cause."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # not seen from a regular file; would loop forever
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
