"""Flower, natively: a client mod that measures every message a ClientApp handles, and
a server-side collector that writes what each client measured, one JSON line per
client per round.

On each SuperNode, add the mod (``ClientApp(mods=[edgewatt_mod])``, or per function,
``@app.train(mods=[edgewatt_mod])``; a ``client_fn`` app takes it the same way). Each
message is a phase named by its round and kind (``round-3/train``). The round is the
``server-round`` of the message's config record where the strategy wrote one, else
its ``group_id``. The phase belongs to the daemon's target that holds the ClientApp
process (the SuperNode's, when it runs under ``edgewatt run`` or was registered with
its children); with none, the mod registers the ClientApp itself, and without a
daemon it measures in-process. The reply carries the phase's figures as a config
record named ``edgewatt`` (never a metrics record: the strategies expect exactly one
and average every key in it).

On the ServerApp, one line: ``strategy = collect(FedAvg(...), "fl.jsonl")``;
``edgewatt report fl.jsonl`` then prints the per-round table.

Bytes: the SuperNode receives the message before the ClientApp (and this mod) sees it
and sends the reply after the mod returns, so no window inside the mod holds them.
The record gives the payload Flower moves for the message (its arrays as serialised,
down and up) and says so in ``bytes_source``.

Monitoring never raises into Flower: a failure is logged once per kind of failure and
the message goes on unmeasured. This is the only module of edgewatt that imports
Flower, and only when it is imported itself.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict

from edgewatt.client import DaemonBackend, Options, Registration, register
from edgewatt.client.fl_record import KIND, MAX_TEXT, client_figures
from edgewatt.core import energy_source, transport
from edgewatt.core.text import shown

log = logging.getLogger(__name__)

RECORD = "edgewatt"  # the reply's config record
BYTES_SOURCE = "flower payload: the message's arrays as serialised, down and up"


def payload_bytes(content: RecordDict) -> int:
    """The bytes of every array a message's content holds, as Flower serialises them."""
    return sum(len(a.data) for record in content.array_records.values() for a in record.values())


def round_of(msg: Message) -> int | str:
    """The server round: ``server-round`` of the message's config record (the current
    strategies write it), else the message's ``group_id``."""
    if msg.has_content():
        for record in msg.content.config_records.values():
            value = record.get("server-round")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    group = msg.metadata.group_id
    return int(group) if group.isdigit() else group


class _Failures:
    """Logs each kind of failure once."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if what in self._seen:
                return
            self._seen.add(what)
        log.warning("edgewatt: %s failed (%s); the message goes on unmeasured", what, exc)


def _own(name: str) -> tuple[Registration, bool, int | None]:
    """A registration of this process's own (no target holds it), and its phase."""
    registration = register(labels={"flower_message": "clientapp"})
    return registration, False, registration.window(name)


class _Window:
    """One message's phase, on the target that holds this process."""

    def __init__(self, msg: Message) -> None:
        self.kind = msg.metadata.message_type
        self.round = round_of(msg)
        self.name = f"round-{self.round}/{self.kind}"
        self.received = payload_bytes(msg.content) if msg.has_content() else 0
        self.registration, self.attached, self.depth = self._open(self.name)

    @staticmethod
    def _open(name: str) -> tuple[Registration, bool, int | None]:
        """The registration the phase goes on, whether it is another's target, and
        the phase's depth. The phase starts inside whatever phase the app runs (an
        epoch of its own): it never ends one. One request where the daemon finds the
        target holding this process itself; a daemon before that, a listing first."""
        found = transport.find_daemon(keep=True)
        if found.path is None or found.connection is None:
            return _own(name)
        pid, connection = os.getpid(), found.connection
        try:
            started = connection.call_ok(
                "POST", f"/v1/members/{pid}/phase", {"name": name, "inside": True}
            )
        except transport.DaemonError as exc:
            started = None
            if exc.status == 404 and exc.body.get("error") == "not held":
                connection.close()
                return _own(name)
        except BaseException:
            connection.close()
            raise
        if started is not None:  # on the widest holder: the SuperNode's target
            daemon = DaemonBackend(found.path, {"id": started["target"]}, connection)
            pid_of_target = int(started.get("pid") or 0)  # 0: a cgroup's
            held = Registration(found.path, Options(pid_of_target, {}), "never", daemon)
            return held, True, int(started.get("depth") or 0)
        try:
            listed = connection.call_ok("GET", f"/v1/targets?member={pid}")
        except BaseException:
            connection.close()
            raise
        # The widest holder: the SuperNode's target rather than one of our own.
        holders = [t for t in listed["targets"] if t["pid"] != pid] or listed["targets"]
        if not holders:
            connection.close()
            return _own(name)
        target = holders[0]
        daemon = DaemonBackend(found.path, {"id": target["id"]}, connection)
        held = Registration(found.path, Options(target["pid"], {}), "never", daemon)
        return held, True, held.window(name)

    def close(self, reply: Message, duration: float) -> dict[str, Any]:
        """The reply's record; ``duration``: the ClientApp's own call, in seconds (the
        phase's edges include this mod's requests to the daemon)."""
        phase = self.registration.end_phase(self.depth) if self.depth is not None else None
        phase = phase or {}
        source = self.registration.mode  # before closing: a closed one is "inactive"
        if not self.attached:
            self.registration.close()
        user, system = phase.get("cpu_user_s"), phase.get("cpu_system_s")
        figures: dict[str, Any] = {
            "round": self.round,
            "kind": self.kind,
            "phase": self.name,
            "duration_s": duration,
            "bytes_received": self.received,
            "bytes_sent": payload_bytes(reply.content) if reply.has_content() else 0,
            "bytes_source": BYTES_SOURCE,
            "host_name": socket.gethostname(),
            "source": source,
            "target": self.registration.id or "",
            # From samples taken at the window's two edges, by the daemon or in-process.
            "exact": user is not None and system is not None,
        }
        if user is not None and system is not None:
            figures["cpu_s"] = user + system
        if phase.get("energy_j") is not None:
            figures["energy_j"] = phase["energy_j"]
        if phase.get("device_energy_j") is not None:  # the whole device, at the sensor's rate
            figures["device_energy_j"] = phase["device_energy_j"]
        for key in ("energy_provenance", "device_energy_provenance"):
            if isinstance(phase.get(key), dict):  # what measured it, or why it is unknown
                figures[key] = energy_source.line(phase[key])[:MAX_TEXT]
        if phase.get("shorter_than_sensor_period") is not None:  # None: period unknown
            figures["shorter_than_sensor_period"] = phase["shorter_than_sensor_period"]
        if isinstance(phase.get("final"), bool):  # false: the power line after it has not come
            figures["final"] = phase["final"]
        if phase.get("memory_rss_peak_bytes") is not None:
            figures["rss_peak_bytes"] = phase["memory_rss_peak_bytes"]
        return figures


class EdgewattMod:
    """The mod: ``mod(msg, context, call_next) -> Message``."""

    def __init__(self) -> None:
        self._failed = _Failures()

    def __call__(
        self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
    ) -> Message:
        try:
            window: _Window | None = _Window(msg)
        except Exception as exc:  # monitoring never raises into Flower
            self._failed("opening the measurement window", exc)
            window = None
        started = time.monotonic()
        reply = call_next(msg, context)
        duration = time.monotonic() - started
        if window is None or reply.has_error():
            return reply
        try:
            figures = window.close(reply, duration)
            reply.content[RECORD] = ConfigRecord(figures)
        except Exception as exc:
            self._failed("closing the measurement window", exc)
        return reply


edgewatt_mod = EdgewattMod()


class _Collector:
    """Appends one JSON line per client per round to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._failed = _Failures()
        self._warned: set[int] = set()  # nodes whose dropped fields were logged
        self._lock = threading.Lock()

    def wrap(self, aggregate: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def aggregate_and_collect(server_round: int, replies: Iterable[Message]) -> Any:
            replies = list(replies)
            try:
                self.write(server_round, kind, replies)
            except Exception as exc:  # the aggregation goes on regardless
                self._failed(f"writing {self.path}", exc)
            return aggregate(server_round, replies)

        return aggregate_and_collect

    def write(self, server_round: int, kind: str, replies: list[Message]) -> None:
        lines = []
        for reply in replies:
            if reply.has_error() or RECORD not in reply.content:
                continue
            node = reply.metadata.src_node_id
            try:
                figures, dropped = client_figures(dict(reply.content[RECORD]))
            except Exception as exc:  # this client's line only: the others still go
                self._failed(f"reading node {node}'s {RECORD} record", exc)
                continue
            if dropped:
                self._dropped(node, dropped)
            # The server's fields from its own knowledge: figures holds none of them.
            record = {"type": KIND, "round": server_round, "kind": kind, "node_id": node}
            record.update(figures)
            lines.append(json.dumps(record, allow_nan=False) + "\n")
        with open(self.path, "a") as out:
            out.writelines(lines)

    def _dropped(self, node: int, keys: list[str]) -> None:
        """Logs once per client per run: a client sends the same record every round."""
        with self._lock:
            if node in self._warned:
                return
            self._warned.add(node)
        log.warning(
            "edgewatt: node %s sent %s in its %s record: unknown, of the wrong type or out "
            "of bounds; dropped from its line of %s",
            node, shown(keys), RECORD, self.path,
        )  # fmt: skip


def collect(strategy: Any, path: str) -> Any:
    """``strategy``, writing each reply's ``edgewatt`` record to ``path`` (JSON lines)
    before it aggregates them; its own aggregation is untouched (the record is neither
    an array nor a metrics record)."""
    collector = _Collector(path)
    for name, kind in (("aggregate_train", "train"), ("aggregate_evaluate", "evaluate")):
        aggregate = getattr(strategy, name, None)
        if aggregate is not None:  # the instance's own, so start() calls it
            setattr(strategy, name, collector.wrap(aggregate, kind))
    return strategy
