"""What a target consumed between two of its samples, and the summary's JSON: pure
functions of the rows, the phases and the target, called under the table's lock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.figures import INCREASES
from edgewatt.core.power.provenance import UNKNOWN, Provenance, unknown
from edgewatt.core.snapshot import PhaseFigures
from edgewatt.core.targets.edges import EdgeEnergy
from edgewatt.core.targets.history import Memory, Phase, Spread
from edgewatt.core.targets.row import SampleRow, pss_age

if TYPE_CHECKING:
    from edgewatt.core.targets.target import Target


_new = tuple.__new__  # skips PhaseFigures' Python-level __new__ (see row.py)


def _change(before: Any, after: Any) -> Any:
    """A cumulative figure's increase (None where either end lacks it)."""
    return None if before is None or after is None else after - before


def phase_figures(phase: Phase) -> PhaseFigures:
    """A phase's exported figures, as span gives them (two of its fields: this runs for
    the last phases of every target at every pass)."""
    first, last = phase.first, phase.last
    if first is None or last is None:
        return _new(PhaseFigures, (phase.name, phase.ended_at is None, None, 0.0, None))
    energy = _change(first.energy_j, last.energy_j)
    high = phase.power.high
    return _new(
        PhaseFigures,
        (
            phase.name,
            phase.ended_at is None,
            None if energy is None else round(energy, 3),
            round(last.monotonic - first.monotonic, 3),
            None if high is None else round(high, 3),
        ),
    )


def span(
    first: SampleRow | None,
    last: SampleRow | None,
    logical_cpus: int,
    carbon: CarbonIntensity | None,
    period_s: float | None = None,
    edges: EdgeEnergy | None = None,
) -> dict[str, Any]:
    """Differences between two samples: what the target consumed in between;
    ``period_s``: the power sensors' coarsest period over the span (None: unknown);
    ``edges``: the device's energy at the two samples as the trace settled it."""

    def delta(name: str) -> Any:
        if first is None or last is None:
            return None
        return _change(getattr(first, name), getattr(last, name))

    duration = 0.0 if first is None or last is None else last.monotonic - first.monotonic
    user, system, energy = delta("cpu_user_s"), delta("cpu_system_s"), delta("energy_j")
    device = (edges or EdgeEnergy()).device_energy(first, last)
    if energy is not None and device is not None:
        # Each pass shares out the energy its edge saw, past a push source's last line
        # its last power held; the window's settled device energy can come out lower
        # (the power fell before the next line). A target never gets more than the
        # device measured over the same span (docs/attribution.md).
        energy = min(energy, max(0.0, device))
    cpu = None if user is None or system is None else user + system
    per_second = duration > 0 and cpu is not None
    figures = {
        "duration_s": round(duration, 3),
        "cpu_user_s": None if user is None else round(user, 3),
        "cpu_system_s": None if system is None else round(system, 3),
        "cpu_avg_cores": round(cpu / duration, 4) if per_second else None,
        "cpu_avg_utilization": round(cpu / duration / logical_cpus, 4) if per_second else None,
        **{name: delta(name) for name in INCREASES},
        "energy_j": None if energy is None else round(energy, 3),
        "power_avg_w": round(energy / duration, 3) if energy is not None and duration > 0 else None,
        "device_energy_j": None if device is None else round(device, 3),
        "device_power_avg_w": round(device / duration, 3)
        if device is not None and duration > 0
        else None,
        # A window shorter than the sensors' period is not resolved by them: its energy
        # is interpolated between readings outside it (None: no sensor, or its period
        # is unknown).
        "shorter_than_sensor_period": None
        if device is None or period_s is None
        else duration < period_s,
    }
    if carbon is not None:  # of the energy as reported, so that the product is exact
        figures["carbon_g"] = None if energy is None else carbon.grams(figures["energy_j"])
    return figures


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def spreads(power: Spread, cpu_utilization: Spread, memory: Memory) -> dict[str, Any]:
    """A window's lowest and highest, beside the means span gives: the device's power
    at the sensor's rate (W; its mean is device_power_avg_w), the target's CPU
    utilization per interval (its mean cpu_avg_utilization); its memory, each under
    its name: PSS summed (what the work holds), the largest process's RSS, and the RSS
    summed (a page shared by N processes counted N times), the RSS's lowest and mean
    too (a run's since its held fork's exec: history.py)."""
    rows = memory.rows
    return {
        "power_min_w": _round(power.low, 3),
        "power_max_w": _round(power.high, 3),
        "cpu_utilization_min": _round(cpu_utilization.low, 4),
        "cpu_utilization_max": _round(cpu_utilization.high, 4),
        "memory_pss_peak_bytes": memory.pss_peak,
        "memory_rss_largest_peak_bytes": memory.rss_largest_peak,
        "memory_rss_peak_bytes": memory.rss.high,
        "memory_rss_min_bytes": memory.rss.low,
        "memory_rss_avg_bytes": round(memory.rss_sum / rows) if rows else None,
    }


def summarize_phase(
    phase: Phase, logical_cpus: int, carbon: CarbonIntensity | None, period_s: float | None
) -> dict[str, Any]:
    """One phase as the summary lists it; ``period_s``: the sensors' period now, for a
    phase with no interval of its own yet."""
    item = {
        "name": phase.name,
        "depth": phase.depth,
        "started_at": phase.started_at,
        "ended_at": phase.ended_at,
        # False while the device's energy at an edge is the last power held (a push
        # source's line after it not come yet), or its closing sample is not taken.
        "final": phase.final,
    }
    period = phase.period_s or period_s
    item.update(span(phase.first, phase.last, logical_cpus, carbon, period, phase.edges))
    item.update(spreads(phase.power, phase.cpu_utilization, phase.memory))
    return item


def _membership(target: Target, membership: str) -> str:
    """Who is counted: the process alone, or everything it forked until each exits,
    learnt from the kernel's events ("lineage") or from the parent links each pass
    sees ("parent-links": a double fork between two passes escapes it), or the
    kernel's members of a cgroup ("cgroup")."""
    if target.cgroup_name is not None:
        return "cgroup"
    return membership if target.children else "process"


def _network_counts(target: Target) -> str | None:
    """What the network figures count: TCP payload acknowledged, or every IP byte of
    the cgroup's sockets, headers included, or the frames of the interfaces of a
    network namespace the daemon may not enter, or both (docs/reference.md)."""
    if target.cgroup_name is None:
        return "tcp-payload"
    if target.observed.network_unknown:
        return None
    return target.observed.network_counts or "ip-bytes"


def covers(target: Target) -> dict[str, Any]:
    """Which part of the target's run its figures cover: all of it since registration,
    or, where the daemon restarted meanwhile, only the time since it restored the
    registration (what ran while it was down was counted by no one)."""
    if target.restored_at is None:
        return {"whole": True}
    first = target.history.first
    return {
        "whole": False,
        "from": round(first.time if first is not None else target.restored_at, 3),
        "registered_at": round(target.identity.registered_at, 3),
        "why": "the daemon restarted: the figures cover the time since it restored the "
        "registration, not the time it was down",
    }


def summarize(
    target: Target,
    logical_cpus: int,
    carbon: CarbonIntensity | None,
    membership: str,
    period_s: float | None,
) -> dict[str, Any]:
    """Totals and per-phase figures; gCO2e beside each energy only when ``carbon``;
    ``membership``: how descendants are learnt (facts/membership.py); ``period_s``:
    the power sensors' period now, for a window with no interval of its own yet (the
    others keep the coarsest period they were read at)."""
    h = target.history
    result: dict[str, Any] = {
        "id": target.id,
        "kind": target.kind,
        "pid": target.pid,
        "command": target.command,  # what runs (``python3 train.py``), as describe() names it
        "labels": dict(target.labels),
        "state": target.state,
        "registered_at": round(target.identity.registered_at, 3),
        "exited_at": target.exited_at,
        # How the figures end: at the kernel's exit records with every teardown
        # ("exact"), at the exit records with a reaped child's teardown missing
        # ("exit-records"), or at the last pass before the exit ("last-sample");
        # None while running.
        "exit": target.exit_mode,
        # The registered process's exit code (-N: killed by signal N), or the command's
        # of `edgewatt run`'s cgroup, where the kernel's exit records gave it; None while
        # running, or unknown (a container's, a unit's, another cgroup's: no such root).
        "exit_status": target.exit_status,
        "membership": _membership(target, membership),
        "network_counts": _network_counts(target),
        # A process target's TCP bytes come from the sockets a pass found it holding (to
        # their close): a connection opened and closed between two passes is never
        # seen, so its figures (its phases' too) are at least what was counted; a
        # cgroup's counters see every packet.
        "network_lower_bound": target.cgroup_name is None,
        "samples": h.count,
    }
    if target.cgroup_name is not None:
        # Why it ended (its cgroup removed, or followed to one not the registrant's).
        result["end_reason"] = target.end_reason
    # Every window's device energy settled up to its last sample: what ?final waits for.
    result["final"] = h.final
    result["covers"] = covers(target)
    result.update(span(h.first, h.last, logical_cpus, carbon, h.period_s or period_s, h.edges))
    result.update(spreads(h.power, h.cpu_utilization, h.memory))
    # Whether its largest process's peak is the kernel's record at an exit, not a pass's.
    result["memory_rss_largest_at_exit"] = h.memory.largest_at_exit
    # How old the last PSS figure is at the last sample: a dear read waits (pss.py).
    result["memory_pss_age_s"] = None if h.last is None else pss_age(h.last)
    result["phases"] = [summarize_phase(p, logical_cpus, carbon, period_s) for p in h.phases]
    result["phases_dropped"] = h.phases_dropped
    if target.cgroup_name is not None:
        # Why its network figures are absent (None: they are counted).
        result["network_unknown"] = target.observed.network_unknown
        result["cgroup"] = target.cgroup_info()
    if carbon is not None:
        result["carbon_intensity_g_per_kwh"] = carbon.g_per_kwh
        result["carbon_intensity_source"] = carbon.source
    return result


def with_provenance(item: dict[str, Any], measured: Provenance) -> dict[str, Any]:
    """Each energy figure's provenance beside it (power/provenance.py), in a summary or
    a phase and in its phases: the device's as measured, the target's attributed from
    it; a figure absent while the sensors measure says why."""
    for window in (item, *item.get("phases", ())):
        for key, provenance in (
            ("energy_j", measured.attributed()),
            ("device_energy_j", measured),
        ):
            if window.get(key) is None and provenance.method != UNKNOWN:
                provenance = unknown("no sample with the device's energy in this window yet")
            window[key.replace("_j", "_provenance")] = provenance.as_dict()
    return item
