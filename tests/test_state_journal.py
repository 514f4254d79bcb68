"""What the state directory costs the flash it lives on: the real
daemon over its real socket, bytes written counted by the kernel (/proc/PID/io's
write_bytes: pages the daemon dirtied), and the state read back by a restarted daemon.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from edgewatt.exporter.statefile import JOURNAL, StateFile
from edgewatt.exporter.write_budget import WriteBudget
from tests.conftest import wait_for

# As fat as labels may be (core/labels.py): 64 values of 1,000 bytes, ~64 KiB a target.
FAT = {f"l{n:02}": chr(ord("a") + n % 26) * 1000 for n in range(64)}
SLEEP = "import time; time.sleep(120)"


def write_bytes(pid: int) -> int:
    """Bytes of page cache ``pid`` dirtied: what its writes will cost the storage."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_a_change_writes_bytes_independent_of_label_size(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(state_dir=tmp_path / "state")
    assert daemon.proc is not None
    pid = daemon.proc.pid
    sleepers = [spawn(SLEEP) for _ in range(22)]
    before = write_bytes(pid)
    ids = [daemon.register(p.pid, labels=FAT)["id"] for p in sleepers[:20]]
    registered = write_bytes(pid) - before
    if registered < 20 * 64_000:
        pytest.skip(f"this filesystem does not count written pages ({registered} bytes)")
    assert registered < 20 * 80_000  # the labels once per target, no more

    def cost(change: Any) -> int:
        at = write_bytes(pid)
        change()
        return write_bytes(pid) - at

    # Each with 1.3 MB of labels held: a few pages at most (a record, a log line).
    costs = {
        "unregister": cost(lambda: daemon.call("DELETE", f"/v1/targets/{ids[0]}")),
        "join": cost(lambda: daemon.register(sleepers[1].pid, labels={"also": "x"})),
        "register thin": cost(lambda: daemon.register(sleepers[20].pid, labels={"r": "1"})),
        "exit": cost(lambda: (sleepers[2].kill(), wait_for(lambda: exited(daemon, ids[2])))),
    }
    assert all(n <= 4 * 4096 for n in costs.values()), costs


def exited(daemon: Any, target_id: str) -> bool:
    return daemon.call("GET", f"/v1/targets/{target_id}")[1]["state"] != "running"


def test_a_kill_right_after_registrations_keeps_them_all(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    # The journal's fsync waits up to SYNC_S; a kill of the daemon loses nothing
    # write(2) was given, as the page cache outlives the process.
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    sleepers = [spawn(SLEEP) for _ in range(6)]
    ids = [first.register(p.pid, labels={"n": str(n)})["id"] for n, p in enumerate(sleepers)]
    first.register(sleepers[0].pid, labels={"more": "yes"})  # joined: two holders
    first.call("DELETE", f"/v1/targets/{ids[5]}")
    first.stop(signal.SIGKILL)

    second = daemon_factory(state_dir=state)
    listing = {t["id"]: t for t in second.call("GET", "/v1/targets")[1]["targets"]}
    assert sorted(listing) == sorted(ids[:5])
    assert listing[ids[0]]["labels"] == {"n": "0", "more": "yes"}
    assert holders(second, ids[0]) == 2
    assert [listing[i]["labels"] for i in ids[1:5]] == [{"n": str(n)} for n in range(1, 5)]


def holders(daemon: Any, target_id: str) -> int:
    """How many registrations hold a running target: DELETE each until it ends."""
    n = 1
    while daemon.call("DELETE", f"/v1/targets/{target_id}")[1]["state"] == "running":
        n += 1
    return n


def test_a_torn_last_record_is_skipped(daemon_factory: Any, spawn: Any, tmp_path: Path) -> None:
    # A kill mid-write or a power cut leaves part of a record at the journal's end.
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    kept = first.register(spawn(SLEEP).pid, labels={"run": "kept"})["id"]
    first.stop(signal.SIGKILL)
    whole = (state / JOURNAL).read_bytes()
    with open(state / JOURNAL, "ab") as f:
        f.write(whole.splitlines(keepends=True)[-1][:-20])

    second = daemon_factory(state_dir=state)
    listing = second.call("GET", "/v1/targets")[1]["targets"]
    assert [(t["id"], t["labels"]) for t in listing] == [(kept, {"run": "kept"})]
    assert "after its last whole record skipped" in second.log()


def test_a_journal_from_before_its_snapshot_is_not_replayed(tmp_path: Path) -> None:
    # A crash between a compaction's two renames: the new snapshot holds every change,
    # the journal left beside it names the snapshot before.
    budget = WriteBudget(1 << 20)
    entry = {"pid": 1, "start_ticks": 1, "children": True, "uid": 0, "registered_at": 1.0,
             "holders": 1, "labels": {"run": "a"}}  # fmt: skip
    first = StateFile(tmp_path, "boot", budget)
    first.save([{**entry, "id": "a" * 12}])
    first.save([{**entry, "id": "a" * 12}, {**entry, "id": "b" * 12}])
    first.close()
    stale = (tmp_path / JOURNAL).read_bytes()
    second = StateFile(tmp_path, "boot", budget)
    assert [e["id"] for e in second.load()] == ["a" * 12, "b" * 12]
    second.save([{**entry, "id": "b" * 12, "holders": 2}])  # a snapshot: it starts
    second.close()
    (tmp_path / JOURNAL).write_bytes(stale)  # its put of b, holders 1, would undo the 2
    third = StateFile(tmp_path, "boot", budget)
    assert third.load() == [{**entry, "id": "b" * 12, "holders": 2}]


def test_the_new_daemon_keeps_a_version_1_state_file(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    # targets.json as the daemon before the journal wrote it (FORMAT_VERSION 1).
    sleepers = [spawn(SLEEP) for _ in range(3)]
    entries = [
        {
            "id": f"{n:012x}",
            "pid": p.pid,
            "start_ticks": start_ticks(p.pid),
            "labels": {**FAT, "l00": f"old-{n}"},
            "children": True,
            "uid": os.geteuid(),
            "registered_at": 1.0 + n,
            "holders": 1 + n,
        }
        for n, p in enumerate(sleepers)
    ]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    old = {"version": 1, "boot_id": boot_id(), "targets": entries}
    (state / "targets.json").write_text(json.dumps(old, indent=1))

    def listing(daemon: Any) -> list[tuple[str, dict[str, str]]]:
        return sorted(
            (t["id"], t["labels"]) for t in daemon.call("GET", "/v1/targets")[1]["targets"]
        )

    expected = [(e["id"], e["labels"]) for e in entries]
    daemon = daemon_factory(state_dir=state)
    assert listing(daemon) == expected
    daemon.call("DELETE", "/v1/targets/000000000002")  # a change in the new format
    daemon.stop(signal.SIGKILL)
    again = daemon_factory(state_dir=state)
    assert listing(again) == expected
    assert json.loads((state / "targets.json").read_text())["version"] == 2
    assert [holders(again, e["id"]) for e in entries] == [1, 2, 2]


def test_a_churning_users_bytes_are_bounded_by_the_budget(
    daemon_factory: Any, spawn: Any, tmp_path: Path
) -> None:
    budget = 1 << 20  # bytes an hour: the bucket holds 512 KiB, refilled 291 B/s
    state = tmp_path / "state"
    daemon = daemon_factory(state_dir=state, env={"EDGEWATT_STATE_WRITE_BUDGET": str(budget)})
    assert daemon.proc is not None
    pid = daemon.proc.pid
    held = [daemon.register(spawn(SLEEP).pid, labels=FAT)["id"] for _ in range(3)]
    churner = spawn(SLEEP)
    at = write_bytes(pid)
    for n in range(30):  # 2 MB of registrations; the old daemon rewrote 0.2 MB each
        target_id = daemon.register(churner.pid, labels={**FAT, "l00": str(n)})["id"]
        status, _ = daemon.call("DELETE", f"/v1/targets/{target_id}")
        assert status == 200
    last = daemon.register(churner.pid, labels=FAT)["id"]  # answered, its write held back
    churned = write_bytes(pid) - at
    assert churned <= budget // 2 + 64 * 4096, churned
    health = daemon.call("GET", "/healthz")[1]
    assert health["state_deferred"] == 1 and health["state_error"] is None
    assert daemon.log().count("state writes over their budget") == 1  # said once, not per cycle

    # A stop writes what waited: the last registration with those held.
    daemon.stop()
    again = daemon_factory(state_dir=state)
    listing = again.call("GET", "/v1/targets")[1]["targets"]
    assert sorted(t["id"] for t in listing) == sorted([*held, last])


def test_an_hour_of_churn_writes_at_most_the_budget_and_a_rewrite(tmp_path: Path) -> None:
    # The state file alone over a simulated hour of the worst churn: fat registrations
    # and unregistrations as fast as they come, beside 20 fat targets held; root's,
    # paid from the whole budget (users' from their shares: test_state_persons.py).
    now = [0.0]
    budget = WriteBudget(16 << 20, clock=lambda: now[0])
    statefile = StateFile(tmp_path / "state", "boot", budget)
    entry = {"pid": 1, "start_ticks": 1, "children": True, "uid": 0,
             "registered_at": 1.0, "holders": 1, "labels": FAT}  # fmt: skip
    held = [{**entry, "id": f"{n:012x}"} for n in range(20)]
    statefile.save(held)  # at start: a snapshot, outside the budget
    start = statefile.written
    for n in range(100_000):
        now[0] = n * 0.036  # 100,000 changes an hour
        statefile.save([*held, {**entry, "id": f"{n + 100:012x}"}] if n % 2 else held)
        if statefile.deferred:
            statefile.catch_up()
    assert now[0] < 3600
    live = len((tmp_path / "state" / "targets.json").read_bytes())
    assert statefile.written - start <= 1.5 * (16 << 20) + live
    assert statefile.written - start > 16 << 20  # the churn did use the budget
    statefile.save(held)  # the last churned one gone
    assert statefile.catch_up(budgeted=False)  # at a stop: all written
    statefile.close()
    assert len(StateFile(tmp_path / "state", "boot", budget).load()) == 20
