"""Where an energy figure comes from, carried beside it: measured by which sensor and
rail at what rate, attributed to a process by which rule (docs/attribution.md), or
unknown and why. The device's is built where its energy is (meter.py, at every edge),
a target's from it beside its figures (targets/summary.py), and each is shown wherever
its figure is (core/energy_source.py words it): never a silent constant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from edgewatt.core.compat import SLOTS
from edgewatt.core.power.source import BOARD_INPUT_RAILS, PowerReading

MEASURED, ATTRIBUTED, UNKNOWN = "measured", "attributed", "unknown"
# How a sensor is read (meter.py): polled at the reader's rate, printing on its own at
# its rate, or a hardware energy counter read at every edge (no rate: the counter
# counts every joule between two reads).
STREAM, PRINTED, COUNTER = "stream", "printed", "counter"
# The rule a target's energy is shared out by: the dynamic energy above idle, by CPU
# time and GPU load (docs/attribution.md, "The model").
ATTRIBUTION_RULE = "dynamic-by-cpu-gpu-time"
NO_SOURCE = "no power source on this device (edgewatt doctor says why)"


@dataclass(frozen=True, **SLOTS)
class Sensor:
    source: str  # the power source's name (source.py's registry)
    rail: str  # the rail(s) its total is: "VDD_IN", "package-0+dram"
    read: str  # STREAM, PRINTED or COUNTER
    rate_hz: float | None  # readings per second (None: a counter, read at every edge)


@dataclass(frozen=True, **SLOTS)
class Provenance:
    method: str  # MEASURED, ATTRIBUTED or UNKNOWN
    sensors: tuple[Sensor, ...] = ()  # what measured the device's energy
    rule: str | None = None  # ATTRIBUTED: the rule it was shared out by
    reason: str | None = None  # UNKNOWN: why there is no figure

    def attributed(self) -> Provenance:
        """A target's share of this measured energy (unknown stays unknown)."""
        if self.method != MEASURED:
            return self
        return replace(self, method=ATTRIBUTED, rule=ATTRIBUTION_RULE)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "sensors": [
                {"source": s.source, "rail": s.rail, "read": s.read, "rate_hz": s.rate_hz}
                for s in self.sensors
            ],
            "rule": self.rule,
            "reason": self.reason,
        }


def info_labels(provenance: Provenance) -> list[dict[str, str]]:
    """edgewatt.energy.source.info's attributes: one set per sensor (the device's energy
    measured by it, a target's attributed from it by ``rule``), or the reason where
    unknown; a label is absent where it has no value (a counter's rate)."""
    if provenance.method == UNKNOWN:
        return [{"method": UNKNOWN, "reason": provenance.reason or ""}]
    found = []
    for s in provenance.sensors:
        labels = {"method": MEASURED, "source": s.source, "rail": s.rail, "read": s.read}
        if s.rate_hz is not None:
            labels["rate_hz"] = f"{s.rate_hz:g}"
        found.append({**labels, "rule": ATTRIBUTION_RULE})
    return found


def unknown(reason: str) -> Provenance:
    return Provenance(UNKNOWN, reason=reason)


def total_rail(reading: PowerReading) -> str:
    """The rail(s) a reading's total is: the source's own word where it says
    (``total_of``), else a board's input rail, else all its rails summed."""
    names = [r.name for r in reading.rails]
    if reading.total_of:
        return "+".join(reading.total_of)
    board_input = next((n for n in BOARD_INPUT_RAILS if n in names), None)
    return board_input or "+".join(names)
