"""What the daemon hands each pass to: an output (the /metrics exposition, the OTLP and
InfluxDB pushes, the recent power average), one protocol for them all, as the
OpenTelemetry Collector's exporters are. Which ones run is ``outputs.py``'s list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from edgewatt.core.snapshot import Snapshot


@dataclass(frozen=True)
class OutputStatus:
    """What /healthz shows of an output, under its name."""

    failing: bool
    shown: Mapping[str, Any] = field(default_factory=dict)


class Output(Protocol):
    """Built from the config, started once, handed every pass's snapshot on the
    sampler's thread, stopped once."""

    name: str  # its key in the daemon's map and in /healthz

    def start(self) -> None:
        """Serve or push from now on (the first pass was handed over already)."""

    def update(self, snapshot: Snapshot) -> None:
        """The latest pass: kept, the work done on the output's own thread (the
        sampler waits on this)."""

    def stop(self, deadline: float) -> None:
        """Last writes, then nothing more; done by ``deadline`` (time.monotonic())."""

    def report(self) -> OutputStatus | None:
        """None where it has nothing to show in /healthz."""
