"""The Flower mod's round edges never wait for a power line either, and its record
says whether its energy is final: the mod (client/flower.py) run in this venv on a
minimal stand-in of the few `flwr.app` types it touches (Flower itself lives in a venv
of its own: tests/test_flower.py runs it whole), against the daemon with the stand-in
tegrastats printing once a second (tests/test_edges.py)."""

from __future__ import annotations

import importlib
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgewatt.client.fl_record import client_figures
from tests.conftest import DaemonProcess
from tests.test_edges import (
    WATTS,
    after_a_line,
    assert_none_waited,
    burn,
    none_printed,
    start_once_a_second,
)


class ConfigRecord(dict):  # type: ignore[type-arg]
    pass


class RecordDict(dict):  # type: ignore[type-arg]
    @property
    def config_records(self) -> dict[str, ConfigRecord]:
        return {k: v for k, v in self.items() if isinstance(v, ConfigRecord)}

    @property
    def array_records(self) -> dict[str, Any]:
        return {}


class Message:
    """A train message of a round, or its reply: content and the metadata read."""

    def __init__(self, content: RecordDict, server_round: int = 1) -> None:
        self.content = content
        self.metadata = types.SimpleNamespace(message_type="train", group_id=str(server_round))

    def has_content(self) -> bool:
        return True

    def has_error(self) -> bool:
        return False


class ClientApp:
    """The app's own call: 50 ms of CPU, timed."""

    def __init__(self) -> None:
        self.started = self.ended = 0.0

    def __call__(self, msg: Message, context: Any) -> Message:
        self.started = time.monotonic()
        burn(0.05)
        self.ended = time.monotonic()
        return Message(RecordDict(), int(msg.metadata.group_id))


@pytest.fixture
def flower(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """client/flower.py imported on the stand-in types, dropped again after."""
    app = types.ModuleType("flwr.app")
    for kind in (ConfigRecord, RecordDict, Message):
        setattr(app, kind.__name__, kind)
    app.Context = object  # type: ignore[attr-defined]
    package = types.ModuleType("flwr")
    package.app = app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flwr", package)
    monkeypatch.setitem(sys.modules, "flwr.app", app)
    sys.modules.pop("edgewatt.client.flower", None)
    try:
        yield importlib.import_module("edgewatt.client.flower")
    finally:
        sys.modules.pop("edgewatt.client.flower", None)


@pytest.fixture
def once_a_second(daemon_factory: Any, tmp_path: Path) -> DaemonProcess:
    return start_once_a_second(daemon_factory, tmp_path)


def test_a_rounds_edges_do_not_wait_and_its_record_says_when_it_is_final(
    flower: Any, once_a_second: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = once_a_second
    monkeypatch.setenv("EDGEWATT_SOCKET", daemon.socket)
    # The process's target, as a SuperNode's under `edgewatt run`, with an epoch of
    # the app's own running: each round runs inside it and leaves it running.
    target = daemon.register(os.getpid(), children=False)["id"]
    assert daemon.call("POST", f"/v1/targets/{target}/phase", {"name": "epoch"})[0] == 201
    costs, unfinal = [], 0
    for server_round in (1, 2, 3):
        after_a_line(tmp_path)  # the next line 0.9 s away: an edge that waited, 0.25 s
        app = ClientApp()
        before = time.monotonic()
        reply = flower.edgewatt_mod(Message(RecordDict(), server_round), None, app)
        costs += [app.started - before, time.monotonic() - app.ended]
        record = dict(reply.content[flower.RECORD])
        assert (record["source"], record["target"]) == ("daemon", target)
        assert record["phase"] == f"round-{server_round}/train"
        assert record["device_energy_j"] > 0
        # The collector keeps every figure of it, the flag too.
        assert client_figures(record)[1] == []
        if none_printed(tmp_path, app.ended):
            assert record["final"] is False, record
            unfinal += 1
    assert_none_waited(costs)
    assert unfinal >= 2
    summary = daemon.call("GET", f"/v1/targets/{target}/summary?final=5")[1]
    assert summary["final"] is True
    epoch, *rounds = summary["phases"]
    assert (epoch["name"], epoch["ended_at"]) == ("epoch", None)
    assert [(r["name"], r["depth"]) for r in rounds] == [(f"round-{n}/train", 1) for n in (1, 2, 3)]
    for phase in rounds:
        assert phase["final"] is True
        assert phase["device_energy_j"] == pytest.approx(WATTS * phase["duration_s"], rel=0.01)


def test_a_rounds_start_is_one_request_and_a_daemon_before_it_gets_the_listing_first(
    flower: Any, daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon finds the target holding the ClientApp and starts the round's phase on
    # it in one request; a daemon without that endpoint (404 "not found") is asked for
    # the holders first, and the phase started on the one chosen, as before.
    from edgewatt.core import transport

    monkeypatch.setenv("EDGEWATT_SOCKET", daemon.socket)
    target = daemon.register(os.getpid(), children=False)["id"]
    asked: list[tuple[str, str]] = []
    real = transport.Connection.call
    older = [False]

    def call(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        asked.append((method, path.split("?")[0]))
        if older[0] and path.startswith("/v1/members/"):
            return 404, {"error": "not found", "detail": f"no endpoint at {path!r}"}
        return real(self, method, path, *args, **kwargs)

    monkeypatch.setattr(transport.Connection, "call", call)
    for server_round, before in ((1, False), (2, True)):
        older[0], asked[:] = before, []
        reply = flower.edgewatt_mod(Message(RecordDict(), server_round), None, ClientApp())
        record = dict(reply.content[flower.RECORD])
        assert (record["target"], record["phase"]) == (target, f"round-{server_round}/train")
        start = [("POST", f"/v1/members/{os.getpid()}/phase")]
        if before:
            start += [("GET", "/v1/targets"), ("POST", f"/v1/targets/{target}/phase")]
        assert asked == [*start, ("DELETE", f"/v1/targets/{target}/phase")]
    summary = daemon.call("GET", f"/v1/targets/{target}/summary")[1]
    assert [p["name"] for p in summary["phases"]] == ["round-1/train", "round-2/train"]
