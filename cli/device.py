"""The device's setting as a person reads it, in one line: a run's (its summary's
``context``: at its start, and what changed) or the device's now (``edgewatt top``)."""

from __future__ import annotations

from typing import Any


def context_line(context: Any) -> str | None:
    """The device's setting over a run, from a summary's ``context`` (docs/reference.md,
    The run's context): model, power mode, release, clocks, and what changed."""
    if not isinstance(context, dict) or not isinstance(context.get("start"), dict):
        return None
    start, parts = context["start"], []
    if start.get("model"):
        parts.append(str(start["model"]))
    mode = start.get("power_mode")
    if isinstance(mode, dict) and mode.get("name"):
        number = "" if mode.get("id") is None else f" ({mode['id']})"
        parts.append(f"power mode {mode['name']}{number}")
    if start.get("l4t_release"):
        parts.append(f"L4T {start['l4t_release']}")
    if start.get("clocks_pinned") is not None:
        parts.append("clocks pinned" if start["clocks_pinned"] else "clocks not pinned")
    events = [e for e in context.get("events") or () if isinstance(e, dict)]
    if events:
        what = sorted({str(e.get("what")) for e in events})
        parts.append(f"{len(events)} change(s) during the run: {', '.join(what)}")
    return ", ".join(parts) or None


def setting_line(context: Any) -> str | None:
    """The device's setting now (GET /v1/host's ``context``, the last read), as
    :func:`context_line` says a run's start."""
    return context_line({"start": context}) if isinstance(context, dict) else None
