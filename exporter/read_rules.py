"""Who may read what of a target (docs/reference.md, "Read rules"). What /proc shows
any user of a process (its name, pid, state, CPU times, RSS, threads) any user may
read; what /proc keeps to the process's owner (its PSS from smaps_rollup, its disk
bytes from io) and the labels its registrant gave, only the target's registrant and
root. A subordinate uid of the registrant is not her: the kernel refuses it her /proc
files too."""

from __future__ import annotations

from typing import Any

# What a reader who may not read them finds: "labels" left out, every figure whose
# name holds "pss" or starts with "disk_" null (a sample's, the summary's, each
# phase's; /samples' "units" stay); the document's "redacted" lists these.
REDACTED = ("labels", "pss", "disk")


def may_read_all(reader_uid: int, owner_uid: int | None) -> bool:
    """Whether ``reader_uid`` reads a target of ``owner_uid`` whole (None: unknown, as
    one gone between two reads)."""
    return reader_uid == 0 or reader_uid == owner_uid


def redacted(document: dict[str, Any]) -> dict[str, Any]:
    """A target's document (its description, summary, samples or top entry) as a
    reader who is neither its registrant nor root reads it."""
    return {**_strip(document), "redacted": list(REDACTED)}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: v if k == "units" else None if "pss" in k or k.startswith("disk_") else _strip(v)
            for k, v in value.items()
            if k != "labels"
        }
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value
