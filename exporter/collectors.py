"""The daemon's collaborators of the sampler, started from the configuration: the
kernel's exit records, process events, TCP accounting and cgroup traffic counters.
Each that cannot start (a capability missing, a module absent) is left out with a
warning that says what is lost and the fix; the sampler gets what started."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from edgewatt.core.facts import cgroups, procfs
from edgewatt.core.facts.cgroup_traffic import CgroupTraffic
from edgewatt.core.facts.membership import LINEAGE, Membership
from edgewatt.core.facts.network import NetworkAccounting
from edgewatt.core.kernel.proc_events import ProcEvents
from edgewatt.core.kernel.sockets import DestroyListener
from edgewatt.core.kernel.taskstats import TaskExits, TaskstatsSocket
from edgewatt.core.platforms import Platform
from edgewatt.core.sampling.contributor_list import contributors
from edgewatt.core.sampling.sampler import Parts
from edgewatt.core.sampling.trees import ProcessTrees
from edgewatt.core.targets import TargetTable
from edgewatt.exporter.config import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Collectors:
    """What started, for the sampler and for /healthz."""

    parts: Parts
    # Whether a target's figures end at its exit (the kernel's exit records and TCP
    # destroy notifications) or at the last pass before it.
    exact_exits: bool
    cgroup_traffic_problem: str | None  # None: cgroup targets' traffic is counted


def start_collectors(
    config: Config, platform: Platform, table: TargetTable, person: Callable[[int], int]
) -> Collectors:
    """Start what the configuration asks for and the daemon may have; ``person``: the
    person a uid is (core/persons.py), whose share bounds count it in."""
    exits = _start_exits(config)
    membership = _start_lineage(config, table)
    network = _start_network(config)
    traffic, problem = _start_cgroup_traffic(config, person)
    return Collectors(
        parts=Parts(
            ProcessTrees(platform, exits=exits, membership=membership),
            contributors(
                network,
                pss_proc=getattr(platform, "proc", "/proc"),
                cgroups=True,
                traffic=traffic,
                traffic_problem=problem,
            ),
        ),
        exact_exits=exits is not None and (network is None or network.destroyed is not None),
        cgroup_traffic_problem=problem,
    )


def _start_exits(config: Config) -> TaskExits | None:
    """The kernel's exit records (taskstats): a target's figures end at its exit,
    not at the last pass. Needs CAP_NET_ADMIN."""
    if not config.exact_exits:
        return None
    try:
        # Kept for a few passes: an exit is matched at the pass after it.
        return TaskExits(TaskstatsSocket(), keep_s=max(10.0, 5 * config.interval))
    except OSError as exc:
        log.warning(
            "exact exit figures unavailable (taskstats: %s): a target's summary ends "
            "at the last pass before its exit; grant CAP_NET_ADMIN for exact ones",
            exc.strerror or exc,
        )
        return None


def _start_lineage(config: Config, table: TargetTable) -> Membership | None:
    """The kernel's process events: every fork of a target's members is heard, so
    its descendants count until they exit (facts/membership.py)."""
    if not config.follow_forks:
        return None
    try:
        membership = Membership(ProcEvents())
    except OSError as exc:
        log.warning(
            "process events unavailable (%s): a target's descendants are found by "
            "the parent links each pass sees, so a double fork between two passes "
            "escapes it; grant CAP_NET_ADMIN to follow every fork",
            exc.strerror or exc,
        )
        return None
    table.membership = LINEAGE
    return membership


def _start_network(config: Config) -> NetworkAccounting | None:
    try:
        destroyed = DestroyListener() if config.exact_exits else None
    except OSError as exc:
        destroyed = None
        log.warning(
            "final TCP counts of closed connections unavailable (sock_diag destroy "
            "groups: %s): a connection's bytes after the last pass that saw it are "
            "lost; grant CAP_NET_ADMIN to count them",
            exc.strerror or exc,
        )
    try:
        network = NetworkAccounting(config.proc_path, destroyed=destroyed)
    except OSError as exc:
        if destroyed is not None:
            destroyed.close()
        log.warning("per-process network bytes unavailable (sock_diag: %s)", exc)
        return None
    if not procfs.sees_other_users(config.proc_path):
        log.warning(
            "running as uid %d without CAP_SYS_PTRACE: network bytes are counted for "
            "this user's targets only",
            os.geteuid(),
        )
    return network


def _start_cgroup_traffic(
    config: Config, person: Callable[[int], int]
) -> tuple[CgroupTraffic | None, str | None]:
    """nftables counters for cgroup targets: root (or CAP_NET_ADMIN), libnftables
    and a cgroup v2 mount; without them a cgroup target's network figures are
    absent, and /healthz, doctor and each summary say why (the second item)."""
    where = cgroups.mounts()
    if where.v2 is None:
        log.info("no cgroup v2 mount: cgroup targets have no network figures")
        return None, "no cgroup v2 mount"
    try:
        traffic = CgroupTraffic(where.v2, config.proc_path, person=person)
        stale = traffic.clean_stale()
    except OSError as exc:
        log.warning(
            "cgroup targets' network bytes unavailable (nftables: %s); the daemon needs "
            "CAP_NET_ADMIN and libnftables (apt-get install nftables)",
            exc,
        )
        return None, f"nftables: {exc}"
    if not procfs.may_join_namespaces():
        log.info(
            "without CAP_SYS_ADMIN, containers with a network namespace of their own "
            "are counted by the frames of their interfaces (docs/reference.md, Cgroup "
            "targets)"
        )
    if stale:
        log.info("removed %d nftables table(s) left by an earlier daemon", stale)
    return traffic, None
