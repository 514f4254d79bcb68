"""The one list of per-target contributors, in the order a pass calls them: the
daemon (exporter/collectors.py) and the in-process client (client/_local.py) build
theirs here from what each could start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgewatt.core.sampling.contributors import CgroupTrafficCounts, Contributor, TcpAccounting
from edgewatt.core.sampling.pss import ProportionalMemory

if TYPE_CHECKING:  # cgroup_traffic is the daemon's alone: the client never loads it (fcntl)
    from edgewatt.core.facts.cgroup_traffic import CgroupTraffic
    from edgewatt.core.facts.network import NetworkAccounting


def contributors(
    network: NetworkAccounting | None,
    *,
    pss_proc: str | None,
    cgroups: bool,
    traffic: CgroupTraffic | None = None,
    traffic_problem: str | None = None,
) -> tuple[Contributor, ...]:
    """TCP bytes of process targets (``network``: None where sock_diag is not read),
    cgroup targets' traffic or why it is absent (``cgroups``: where cgroup targets can
    be registered; ``traffic`` None: not counted, for ``traffic_problem``), and PSS
    (``pss_proc``: the /proc whose smaps_rollup files are read; None: not read)."""
    found: list[Contributor] = [] if network is None else [TcpAccounting(network)]
    if cgroups:
        found.append(CgroupTrafficCounts(traffic, traffic_problem))
    if pss_proc is not None:
        found.append(ProportionalMemory(pss_proc))
    return tuple(found)
