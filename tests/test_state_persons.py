"""The state directory's write budget is a person's: one who churns past her share
waits, never anyone else (exporter/write_budget.py). The real daemon, as root, with
other users' processes registering over its socket; what is on disk read from the
journal itself, and a kill -9 then a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgewatt.exporter import journal
from edgewatt.exporter.statefile import JOURNAL, PREPAID, StateFile
from edgewatt.exporter.write_budget import PERSON_SHARE, RESERVE, WriteBudget
from tests.conftest import SYSTEM_PYTHON, call_as
from tests.test_hostile import STRANGER, run_as
from tests.test_hostile_persons import ALICE_RANGE, subuid_file

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")

# Her 16 KiB of labels (core/labels.py), each byte's character written \u00e9 in JSON
# (6 bytes for its 2): a registration ~46 KB of journal, the most she can make one.
WIDE = {f"l{n:02}": "\u00e9" * 512 for n in range(15)}
SLEEPER = "import time; time.sleep(120)"

# Run as one of her uids: ``count`` registrations of itself, each let go at once (a
# 429 while her finished one still holds her label bytes: tried again after the
# pass that forgets it), then one kept; prints the last id and waits for stdin.
CHURN = """
import json, sys, time
from edgewatt.core import transport
path, labels, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
for n in range(count + 1):
    while True:
        status, body = transport.call(path, "POST", "/v1/targets", {"labels": labels})
        if status == 201:
            break
        assert status == 429, (status, body)
        time.sleep(0.05)
    if n < count:
        transport.call(path, "DELETE", "/v1/targets/" + body["id"])
print(body["id"], flush=True)
sys.stdin.read()
"""


def journal_ids(state: Path) -> set[str]:
    """The targets the journal puts, read as a restart would."""
    data = (state / JOURNAL).read_bytes()
    return {r["put"]["id"] for r, _ in journal.lines(data) if "put" in r}


@as_root
def test_one_persons_churn_never_holds_back_anothers_registration(
    daemon_factory: Any, public_dir: Path, tmp_path: Path
) -> None:
    # The smallest budget, 1 MiB an hour: her share 128 KiB (a bucket of 64 KiB: one
    # wide registration), all users' 768 KiB, all 1 MiB (a bucket of 512 KiB, which
    # her 14 wide registrations, 650 KB, would empty).
    state = tmp_path / "state"
    env = {
        "EDGEWATT_STATE_WRITE_BUDGET": str(1 << 20),
        "EDGEWATT_EXITED_RETENTION": "0",
        **subuid_file(tmp_path, "nobody:100000:65536\n"),
    }
    daemon = daemon_factory(state_dir=state, socket_dir=public_dir, env=env)
    alice = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", CHURN, daemon.socket, json.dumps(WIDE), "14"],
        user=ALICE_RANGE + 1, group=ALICE_RANGE + 1, cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public_dir)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    bob = run_as(STRANGER, SLEEPER)
    try:
        assert alice.stdout is not None
        held = alice.stdout.readline().strip()
        assert held, "her churn ended before it reported"
        health = daemon.call("GET", "/healthz")[1]
        assert health["state_deferred"] == 1  # her last registration waits for her share
        assert held not in journal_ids(state)
        assert "state writes over their budget" in daemon.log()

        status, bobs = call_as(STRANGER, public_dir, daemon.socket, "POST", "/v1/targets",
                               {"pid": bob.pid, "labels": {"run": "bob"}})  # fmt: skip
        assert status == 201
        assert bobs["id"] in journal_ids(state)  # written before the answer
        assert daemon.call("GET", "/healthz")[1]["state_deferred"] == 1  # hers alone

        daemon.stop(signal.SIGKILL)
        again = daemon_factory(state_dir=state, socket_dir=public_dir, env=env)
        listing = {t["id"]: t for t in again.call("GET", "/v1/targets")[1]["targets"]}
        assert listing[bobs["id"]]["labels"] == {"run": "bob"}
        assert listing[bobs["id"]]["pid"] == bob.pid
        assert held not in listing  # what waited in memory went with the daemon
    finally:
        alice.communicate("", timeout=10)
        bob.kill()
        bob.wait()


# -- the budget alone, over a simulated hour ------------------------------------------

ENTRY = {"pid": 1, "start_ticks": 1, "children": True, "registered_at": 1.0, "holders": 1}


class Counted(WriteBudget):
    """The budget, with what each payer spent."""

    spent: dict[int | None, float]

    def spend(self, payer: int | None, size: float) -> None:
        self.spent[payer] = self.spent.get(payer, 0.0) + size
        super().spend(payer, size)


@pytest.mark.parametrize("count", [5, 10])
def test_an_hour_of_churn_by_every_person_stays_within_the_budget(
    tmp_path: Path, count: int
) -> None:
    """``count`` persons churning wide registrations as fast as they come, from several
    uids each, beside root's targets held: each pays at most 1.5 times her share (and
    one record into debt), all users together 1.5 times theirs; five use their whole
    shares (12 MiB an hour is six), ten all users'. The bytes written stay under what
    was paid; root's changes are written at once."""
    now = [0.0]
    per_hour = 16 << 20
    budget = Counted(per_hour, clock=lambda: now[0], person=lambda uid: uid // 100)
    budget.spent = {}
    statefile = StateFile(tmp_path / "state", "boot", budget)
    held = [{**ENTRY, "uid": 0, "id": f"root{n:08x}", "labels": {"n": str(n)}} for n in range(20)]
    statefile.save(held)  # at start: a snapshot, outside the budget
    start = statefile.written
    wide = {**ENTRY, "labels": WIDE}
    for n in range(1, 36_001):  # 10 changes a second for an hour
        now[0] = n * 0.1
        person = 1 + (n - 1) // 2 % count  # uids 100-106 are person 1's, 200-206 person 2's...
        churned = {**wide, "uid": person * 100 + n % 7, "id": f"{n // 2:012x}"}
        statefile.save([*held, churned] if n % 2 else held)
    assert now[0] <= 3600
    record = len(journal.encode({"put": churned})) * PREPAID
    share = per_hour * PERSON_SHARE
    persons = {payer: spent for payer, spent in budget.spent.items() if payer is not None}
    assert sorted(persons) == list(range(1, count + 1))
    assert all(spent <= 1.5 * share + record for spent in persons.values()), persons
    users = sum(persons.values())
    assert users <= 1.5 * per_hour * (1 - RESERVE) + count * record
    if count == 5:
        assert all(spent >= share for spent in persons.values()), persons
    else:
        assert users >= per_hour * (1 - RESERVE)
    assert statefile.written - start <= users  # the compactions were paid for by them

    # Root's change goes at once, whatever the persons spent; a stop writes the rest.
    statefile.save([*held[1:], {**held[0], "holders": 2}])
    assert statefile.deferred == 0
    assert statefile.catch_up(budgeted=False)
    statefile.close()
    saved = {e["id"]: e for e in StateFile(tmp_path / "state", "boot", budget).load()}
    assert sorted(saved) == sorted(e["id"] for e in held)
    assert saved["root00000000"]["holders"] == 2
