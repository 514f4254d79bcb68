"""Every answer of the API is built once a pass and shared (exporter/shared_answer.py):
however many requests come between two passes, the table is asked once for each
answer, and each reader is sent what the read rules let her read of it."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

from edgewatt.core.targets import NotFound
from edgewatt.exporter.api import (
    ApiContext,
    get_samples,
    get_summary,
    get_target,
    get_top,
    list_targets,
)
from edgewatt.exporter.shared_answer import Encoded
from edgewatt.exporter.unix_http import Request

OWNERS = {"a": 1000, "b": 0}  # a user's target and root's


class CountingTable:
    """Two targets, and a count of every document the API asks it for."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()

    def _document(self, target_id: str) -> dict[str, Any]:
        return {"id": target_id, "labels": {"run": target_id}, "memory_pss_bytes": 4096}

    def get(self, target_id: str) -> Any:
        if target_id not in OWNERS:
            raise NotFound("no such target", target_id)
        return SimpleNamespace(uid=OWNERS[target_id], state="running", holders=1, members=(1,))

    def network_rate(self, target_id: str) -> None:
        return None

    def describe_all(self, member: int | None = None) -> list[dict[str, Any]]:
        self.asked["describe_all"] += 1
        return [self._document(t) for t in OWNERS]

    def describe(self, target_id: str) -> dict[str, Any]:
        self.asked["describe"] += 1
        self.get(target_id)
        return self._document(target_id)

    def summary(self, target_id: str, logical_cpus: int) -> dict[str, Any]:
        self.asked["summary"] += 1
        self.get(target_id)
        return {**self._document(target_id), "disk_read_bytes": 10, "cpu_seconds": 1.5}

    def final(self, target_id: str) -> bool:
        self.get(target_id)
        return True

    def samples(self, target_id: str, since: float | None) -> list[dict[str, Any]]:
        self.asked["samples"] += 1
        self.get(target_id)
        return [{"time": 1.0, "memory_pss_bytes": 4096, "cpu_seconds": 1.5}]


def read(handler: Any, api: ApiContext, uid: int, path: str, **params: str) -> Any:
    request = Request("GET", path, "", 1, uid, lambda: b"", params=params, person=uid)
    body = handler(api, request).body
    assert isinstance(body, Encoded)  # the shared bytes, never a document of its own
    return json.loads(b"".join(body.parts))


def test_n_requests_between_two_passes_build_each_answer_once() -> None:
    table = CountingTable()
    at = [1]  # the pass
    api = ApiContext(
        table,  # type: ignore[arg-type]
        logical_cpus=2, health=dict, host=lambda: {"time": 1.0}, sample_units={"cpu_seconds": "s"},
        sample_now=lambda target_id: None, pass_key=lambda: at[0],
    )  # fmt: skip
    for _ in range(20):
        for uid in (1000, 2000, 0):  # the owner, another user, root
            listing = read(list_targets, api, uid, "/v1/targets")["targets"]
            target = read(get_target, api, uid, "/v1/targets/a", id="a")
            summary = read(get_summary, api, uid, "/v1/targets/a/summary", id="a")
            samples = read(get_samples, api, uid, "/v1/targets/a/samples", id="a")
            top = read(get_top, api, uid, "/v1/top")["targets"]
            mine = uid != 2000  # her target: hers and root's to read whole
            assert ("labels" in listing[0]) == mine and ("labels" in listing[1]) == (uid == 0)
            assert target.get("labels") == ({"run": "a"} if mine else None)
            assert summary["memory_pss_bytes"] == (4096 if mine else None)
            assert summary["disk_read_bytes"] == (10 if mine else None)
            assert summary["cpu_seconds"] == 1.5  # what /proc shows anyone
            assert samples["samples"][0]["memory_pss_bytes"] == (4096 if mine else None)
            assert top[0].get("labels") == ({"run": "a"} if mine else None)
    # /v1/top's once too: its own describe_all, and each target's summary.
    assert table.asked == {"describe_all": 2, "describe": 1, "summary": 3, "samples": 1}
    # The next pass, the host's time as it was (a pass on demand reads the targets
    # alone): each built again, once, /v1/top's too.
    at[0] += 1
    for uid in (1000, 2000, 0):
        read(list_targets, api, uid, "/v1/targets")
        read(get_summary, api, uid, "/v1/targets/a/summary", id="a")
        read(get_top, api, uid, "/v1/top")
    assert table.asked["describe_all"] == 4 and table.asked["summary"] == 6
    api.changed()  # a request changed the table between two passes: built again
    read(list_targets, api, 0, "/v1/targets")
    read(get_top, api, 0, "/v1/top")
    assert table.asked["describe_all"] == 6


def test_a_change_between_two_passes_is_in_the_next_answer(daemon_factory: Any, spawn: Any) -> None:
    daemon = daemon_factory(interval=30.0)  # no pass of its own while it runs
    pid = spawn("import time; time.sleep(60)").pid
    daemon.register(pid, labels={"a": "1"})
    assert daemon.call("GET", "/v1/targets")[1]["targets"][0]["labels"] == {"a": "1"}
    daemon.register(pid, labels={"b": "2"})  # joined: no pass, labels added
    assert daemon.call("GET", "/v1/targets")[1]["targets"][0]["labels"] == {"a": "1", "b": "2"}
