"""The state file's journal: one line per change of the registrations since the last
snapshot (targets.json), so a change costs a few bytes instead of a rewrite of them all.

A line is a JSON record, a space, its CRC-32 in 8 hex digits and a newline. The first
names the snapshot it follows ({"journal": 1, "snapshot": token}); then
``{"put": entry}`` (a target as the snapshot holds it: written once, labels and all),
``{"drop": id}`` and ``{"set": id, "to": {field: value}, "labels": {added}}``
(holders, and the labels a joining registration added: only those). Reading stops at
the first line that is torn (no newline: a kill or ENOSPC mid-write) or corrupt (a
power cut's garbage): what came before it is the state.
"""

from __future__ import annotations

import json
import typing
import zlib
from collections.abc import Iterator
from typing import Any

VERSION = 1

Entry = typing.Dict[str, Any]  # 3.8: dict takes no [...] at run time


def encode(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode()
    return b"%s %08x\n" % (payload, zlib.crc32(payload))


def header(snapshot: str) -> bytes:
    return encode({"journal": VERSION, "snapshot": snapshot})


def lines(data: bytes) -> Iterator[tuple[dict[str, Any], int]]:
    """The whole, intact records at the start of ``data``, each with the offset its line
    ends at, up to the first that is not."""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        payload, _, crc = data[start:end].rpartition(b" ")
        if len(crc) != 8 or crc != b"%08x" % zlib.crc32(payload):
            return
        try:
            record = json.loads(payload)
        except (ValueError, RecursionError):
            return
        if not isinstance(record, dict):
            return
        start = end + 1
        yield record, start


def replay(data: bytes, snapshot: str, live: dict[str, Entry]) -> tuple[int, int]:
    """Apply the journal ``data`` to ``live`` (the snapshot's entries by id) where it
    follows ``snapshot``; returns how many records were applied and the bytes they
    took, the header's included (less than ``len(data)``: a torn or corrupt tail)."""
    records = lines(data)
    first = next(records, None)
    if first is None or first[0] != {"journal": VERSION, "snapshot": snapshot}:
        return 0, len(data)  # a crash between a snapshot and its journal: the snapshot holds all
    applied, used = 0, first[1]
    for record, end in records:
        if not apply(live, record):
            break
        applied, used = applied + 1, end
    return applied, used


def apply(live: dict[str, Entry], record: dict[str, Any]) -> bool:
    """``record`` applied to ``live``; False for one this version cannot read."""
    if isinstance(put := record.get("put"), dict) and isinstance(put.get("id"), str):
        live[put["id"]] = put
    elif isinstance(gone := record.get("drop"), str):
        live.pop(gone, None)
    elif isinstance(target_id := record.get("set"), str) and target_id in live:
        old = live[target_id]
        to, added = record.get("to", {}), record.get("labels", {})
        if not isinstance(to, dict) or not isinstance(added, dict):
            return False
        labels = old.get("labels")
        labels = {**labels, **added} if isinstance(labels, dict) else added
        live[target_id] = {**old, **to, "labels": labels}
    else:
        return False
    return True


def changes(disk: dict[str, Entry], wanted: dict[str, Entry]) -> list[tuple[str, dict[str, Any]]]:
    """The records that turn ``disk`` into ``wanted``, one per target that changed, each
    with the target's id."""
    records = [(gone, {"drop": gone}) for gone in disk.keys() - wanted.keys()]
    for target_id, new in wanted.items():
        old = disk.get(target_id)
        if old is None:
            records.append((target_id, {"put": new}))
        elif new is not old:
            change = _change(old, new)
            if change is not None:
                records.append((target_id, change))
    return records


def weight(record: dict[str, Any]) -> int:
    """A record's rough size, to write the small first where the budget is short (a
    thin registration ahead of a fat one): drops, then sets, then puts by label bytes."""
    if "drop" in record:
        return 0
    if "set" in record:
        return 1
    labels = record["put"].get("labels") or {}
    return 2 + sum(len(k) + len(v) for k, v in labels.items())


def _change(old: Entry, new: Entry) -> dict[str, Any] | None:
    """The set record from ``old`` to ``new`` (None: the same), or a put where a label
    went (no registration removes one: a put keeps it right anyway)."""
    to = {k: v for k, v in new.items() if k != "labels" and (k not in old or old[k] != v)}
    kept, labels = old.get("labels", {}), new.get("labels", {})
    added: dict[str, Any] = {}
    if labels is not kept and labels != kept:
        if not kept.keys() <= labels.keys():
            return {"put": new}
        added = {k: v for k, v in labels.items() if kept.get(k) != v}
    if old.keys() - new.keys():
        return {"put": new}
    if not to and not added:
        return None
    record: dict[str, Any] = {"set": new["id"], "to": to}
    if added:
        record["labels"] = added
    return record
