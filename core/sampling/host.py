"""The host's figures for a pass: its CPU use since the last pass, memory, interfaces."""

from __future__ import annotations

import logging

from edgewatt.core.facts import system
from edgewatt.core.platforms import Platform
from edgewatt.core.snapshot import HostSample

log = logging.getLogger(__name__)


class HostReader:
    """Reads the host once per pass; keeps the last CPU reading for the next pass's use."""

    def __init__(self, platform: Platform) -> None:
        self._platform = platform
        self._last_cpu: system.HostCpu | None = None
        # CPU seconds the host was busy since the last pass (attribution's denominator);
        # None: not known (a first reading, a failed one, a counter that went back).
        self.busy_delta: float | None = None

    def read(self, kept: HostSample | None = None) -> HostSample | None:
        """The host's figures; with ``kept``, its CPU only, with ``kept``'s memory and
        interfaces (an edge's pass: attribution shares by the host's CPU alone)."""
        try:
            if kept is None:
                cpu, memory, network = self._platform.read_host()
            else:
                cpu, memory, network = self._platform.read_host_cpu(), kept.memory, kept.network
        except (OSError, ValueError, KeyError) as exc:
            log.warning("reading host figures failed: %s", exc)
            return None
        utilization = None
        self.busy_delta = None
        last, self._last_cpu = self._last_cpu, cpu
        if last is not None and cpu.total_seconds > last.total_seconds:
            busy = max(0.0, cpu.busy_seconds - last.busy_seconds)
            self.busy_delta = busy
            utilization = min(1.0, busy / (cpu.total_seconds - last.total_seconds))
        # By CPU number: one that came online since the last pass has no interval yet
        # (None); one that went offline is absent, as from /proc/stat.
        before = last.per_cpu if last is not None else {}
        cores: dict[int, float | None] = {}
        for number, (b1, t1) in cpu.per_cpu.items():
            if number not in before:
                cores[number] = None
                continue
            b0, t0 = before[number]
            cores[number] = min(1.0, max(0.0, b1 - b0) / (t1 - t0)) if t1 > t0 else 0.0
        return HostSample(cpu, utilization, memory, network, core_utilization=cores)
