"""An energy figure's provenance as summaries hold it (JSON: core/power/provenance.py
builds it), as text: for run's and report's tables, top and the Flower round records.
Standard library only, without the power sources: the client's side imports it."""

from __future__ import annotations

from typing import Any


def line(provenance: dict[str, Any]) -> str:
    """A summary's provenance of an energy figure (core/power/provenance.py) as one line:
    "measured by tegrastats VDD_IN at 10 Hz; attributed by ...", or "unknown: why"."""
    if provenance.get("method") == "unknown":
        return f"unknown: {provenance.get('reason')}"
    text = f"measured by {sensors(provenance) or 'an unnamed sensor'}"
    if provenance.get("method") == "attributed":
        text += f"; attributed by {provenance.get('rule')} (docs/attribution.md)"
    return text


def sensors(provenance: Any) -> str:
    """The sensors of a provenance, compactly: "tegrastats VIN at 10 Hz" ("": none)."""
    if not isinstance(provenance, dict):
        return ""
    return " and ".join(
        f"{s.get('source')} {s.get('rail')} "
        + ("counter" if s.get("rate_hz") is None else f"at {s['rate_hz']:g} Hz")
        for s in provenance.get("sensors") or ()
        if isinstance(s, dict)
    )
