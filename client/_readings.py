"""Readings for the monitors: the daemon's API answers or an in-process snapshot, as
one raw :class:`Reading` (cumulative counters, instantaneous gauges)."""

from __future__ import annotations

import time as clock
from typing import TYPE_CHECKING, Any

from edgewatt.client._samples import Reading
from edgewatt.core.carbon import CarbonIntensity

if TYPE_CHECKING:
    from edgewatt.core.snapshot import Snapshot


# A reading's wall-clock age counts up to this much: beyond, the wall clock was stepped
# (the daemon's samples are at most an interval old), as core/targets/table.py holds.
MAX_READING_AGE_S = 60.0


def monotonic_instant(wall_time: float) -> float:
    """The monotonic instant of a figure stamped ``wall_time``: now less its wall-clock
    age, the age clamped to 0..60 s, so a step of the wall clock moves no interval."""
    age = min(max(0.0, clock.time() - wall_time), MAX_READING_AGE_S)
    return clock.monotonic() - age


def _network_totals(interfaces: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(sent, received) over every interface but loopback, from (receive, transmit)."""
    sent = sum(tx for name, (_, tx) in interfaces.items() if name != "lo")
    recv = sum(rx for name, (rx, _) in interfaces.items() if name != "lo")
    return sent, recv


def reading_from_api(target: dict[str, Any], host: dict[str, Any]) -> Reading | None:
    """A reading from the daemon's answers to GET /v1/targets/{id} and GET /v1/host."""
    latest = target.get("latest")
    if not latest or not host.get("memory_total_bytes"):
        return None
    sent, recv = _network_totals(
        {n: (v["receive_bytes"], v["transmit_bytes"]) for n, v in host["network"].items()}
    )
    power = host.get("power") or {}
    carbon = host.get("carbon") or {}  # present only when the daemon has an intensity
    return Reading(
        time=latest["time"],
        cpu_user_s=latest["cpu_user_s"],
        cpu_system_s=latest["cpu_system_s"],
        memory_rss_bytes=latest["memory_rss_bytes"],
        memory_total_bytes=host["memory_total_bytes"],
        net_sent_total=sent,
        net_recv_total=recv,
        power_w=power.get("host_power_w"),
        # The device's energy at the sample's own instant (an exit sample's at the exit).
        energy_j=latest.get("device_energy_j", power.get("host_energy_j")),
        rails_w={
            k: v["power_w"] for k, v in power.get("rails", {}).items() if v["power_w"] is not None
        },
        process_energy_j=latest.get("energy_j"),
        carbon=CarbonIntensity(carbon["intensity_g_per_kwh"], carbon["source"]) if carbon else None,
        tcp_sent_total=latest.get("network_transmit_bytes"),
        tcp_recv_total=latest.get("network_receive_bytes"),
        monotonic=monotonic_instant(latest["time"]),
        memory_pss_bytes=latest.get("memory_pss_bytes"),
        source="daemon",
    )


def reading_after_exit(snapshot: Snapshot, last: dict[str, Any]) -> Reading | None:
    """A reading at ``snapshot``'s pass of a target that has exited (``last``: its last
    sample, as the table describes it): its figures as they ended, and the device's
    energy up to this pass. The last reading of `edgewatt run`'s in-process monitor,
    taken once the command and its orphans are gone: the run's device energy then
    covers the whole run, not up to the last interval before the exit."""
    if not last or snapshot.host is None:
        return None
    power = snapshot.power
    return _local_reading(
        snapshot,
        time=snapshot.time,
        cpu=(last["cpu_user_s"], last["cpu_system_s"]),
        rss_bytes=last["memory_rss_bytes"],
        pss_bytes=last.get("memory_pss_bytes"),
        device_energy_j=power.host_energy_j if power else None,
        process_energy_j=last.get("energy_j"),
        tcp=(last.get("network_transmit_bytes"), last.get("network_receive_bytes")),
        # At the pass's power edge, where its device energy is (the snapshot's time
        # is the pass's end).
        monotonic=power.measured_at if power else None,
    )


def reading_from_snapshot(snapshot: Snapshot) -> Reading | None:
    """A reading from an in-process sampler's snapshot of its one target."""
    if not snapshot.processes or snapshot.host is None:
        return None
    p = snapshot.processes[0]
    return _local_reading(
        snapshot,
        time=p.time,
        cpu=(p.cpu_user_s, p.cpu_system_s),
        rss_bytes=p.memory_rss_bytes,
        pss_bytes=p.memory_pss_bytes,
        device_energy_j=p.device_energy_j,
        process_energy_j=p.energy_j,
        tcp=(p.network_transmit_bytes, p.network_receive_bytes),
        monotonic=p.monotonic,
    )


def _local_reading(
    snapshot: Snapshot,
    *,
    time: float,
    cpu: tuple[float, float],
    rss_bytes: int,
    pss_bytes: int | None,
    device_energy_j: float | None,
    process_energy_j: float | None,
    tcp: tuple[int | None, int | None],
    monotonic: float | None,
) -> Reading:
    """``monotonic``: the instant the device energy is at (None: ``time``'s)."""
    host, power = snapshot.host, snapshot.power
    assert host is not None
    sent, recv = _network_totals({n: (io.receive, io.transmit) for n, io in host.network.items()})
    return Reading(
        time=time,
        cpu_user_s=cpu[0],
        cpu_system_s=cpu[1],
        memory_rss_bytes=rss_bytes,
        memory_pss_bytes=pss_bytes,
        memory_total_bytes=host.memory.total_bytes,
        net_sent_total=sent,
        net_recv_total=recv,
        power_w=power.host_power_w if power else None,
        energy_j=device_energy_j if power else None,
        rails_w={r.name: r.power_w for r in power.rails if r.power_w is not None} if power else {},
        process_energy_j=process_energy_j,
        carbon=snapshot.carbon,
        tcp_sent_total=tcp[0],
        tcp_recv_total=tcp[1],
        monotonic=monotonic_instant(time) if monotonic is None else monotonic,
        source="in-process",
    )
