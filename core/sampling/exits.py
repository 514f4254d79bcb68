"""A target's end, merged: its last reading with the kernel's exit records, and the
mode its summary states ("exact", "exit-records" or "last-sample").

The sampler finds an end in a pass (a process gone, a cgroup gone or emptied); the
target's exit sample is this module's :func:`exit_reading`, recorded like any sample
in that pass; :meth:`Ending.mode` settles the mode once the pass's network accounting
says whether its sockets' final counts all came.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgewatt.core.facts.process import TreeReading
from edgewatt.core.platforms import Tree

if TYPE_CHECKING:
    from edgewatt.core.targets import TargetTable

log = logging.getLogger(__name__)


@dataclass
class Ending:
    """What is known of a target's end in the pass that found it."""

    when: float  # unix seconds the pass found it
    reason: str | None = None  # why a cgroup target ended, for its summary
    figures: bool = False  # its exit sample has final figures (the kernel's, a cgroup's)
    rss_peak_bytes: int | None = None  # the kernel's peak RSS, for a target of one process
    teardowns: bool = True  # every member's teardown is in the kernel's figures
    exit_status: int | None = None  # its root's exit code, or -N for signal N
    # The largest peak RSS of one of its processes in the exit records (a cgroup's:
    # its root's record only).
    largest_peak_bytes: int | None = None

    def mode(self, network_exact: bool) -> str:
        """The exit mode its summary states, given whether every closed connection's
        final counts came in this pass (the TCP destroy notifications)."""
        if not self.figures or not network_exact:
            return "last-sample"
        return "exact" if self.teardowns else "exit-records"


def exit_reading(
    tree: Tree, ending: Ending, *, records: bool, cgroup: bool, name: str
) -> TreeReading | None:
    """The target's last reading, at its exit: from the kernel's exit records where
    they are complete ("exact"), else as the last pass saw it ("last-sample").
    Recorded like any sample, so the summary ends at the exit, and the pass's network
    accounting and attribution count it (its sockets' final bytes, its share of the
    energy up to the exit). ``records``: the kernel's exit records are being read;
    ``cgroup``: a cgroup target (its counters are final once it is empty); ``name``
    names the target in the log. Fills in ``ending``'s figures."""
    last = tree.last
    if last is None:
        log.info("target %s exited before its first sample", name)
        return None
    figures = tree.exit_figures() if records else None
    if records and figures is None and not cgroup:
        log.info(
            "target %s: the kernel's exit records are incomplete (it started before the "
            "listener, or records were lost): its figures end at the last pass",
            name,
        )
    # A cgroup's counters are final once it is empty: its last reading then is exact.
    ending.figures = figures is not None or (cgroup and not last.pids)
    # A held fork's exec seen at the exit (a zombie's comm) counts: its memory before
    # was the registrant's (held_fork.py).
    execs = max(last.root_execs, getattr(tree, "root_execs", 0))
    peak = figures.rss_peak_bytes if figures is not None else None
    memory = {} if cgroup else _commands_memory(last, execs, peak)
    if figures is None:
        # A cgroup's root (`edgewatt run`'s command), where it has one: its own record.
        ending.exit_status = getattr(tree, "exit_status", None)
        ending.largest_peak_bytes = getattr(tree, "root_peak_bytes", None)
        return dataclasses.replace(
            last,
            cpu_utilization=None,
            cpu_mode_utilization=None,
            pids=(),
            idle_pids=frozenset(),
            root_execs=execs,
            **memory,
        )
    ending.rss_peak_bytes = figures.rss_peak_bytes
    ending.largest_peak_bytes = figures.largest_peak_bytes
    ending.exit_status = figures.exit_status
    ending.teardowns = figures.teardowns_counted
    read, write = last.read_bytes, last.write_bytes
    user, system = final_cpu(
        (last.cpu_user_s, last.cpu_system_s), (figures.cpu_user_s, figures.cpu_system_s)
    )
    return dataclasses.replace(
        last,
        time=max(last.time, figures.time),
        cpu_user_s=user,
        cpu_system_s=system,
        cpu_utilization=None,
        cpu_mode_utilization=None,
        read_bytes=None if read is None else max(read, figures.read_bytes),
        write_bytes=None if write is None else max(write, figures.write_bytes),
        counts=None if last.counts is None else tuple(map(max, last.counts, figures.counts)),
        pids=(),
        idle_pids=frozenset(),
        root_execs=execs,
        **memory,
    )


def _commands_memory(last: TreeReading, execs: int, peak: int | None) -> dict[str, int]:
    """A process target's exit reading's memory where the held fork exec'd after the
    last pass: that pass read `edgewatt run`'s fork (17-19 MiB of Python), never the
    command. The command's own is its exit record's peak RSS where the kernel gave one
    (a target of one process), else none was read alive: 0, as an emptied cgroup's
    reading holds. {} where the last pass read the command itself."""
    if execs <= last.root_execs:
        return {}
    return {"rss_bytes": peak or 0, "vms_bytes": 0}


def mark_exited(
    table: TargetTable, ended: Sequence[tuple[str, Ending]], network_exact: bool
) -> None:
    """Mark the targets ended in a pass exited in the table, each with its exit mode;
    ``network_exact``: every closed connection's final counts came in the pass."""
    for target_id, ending in ended:
        if ending.figures and not network_exact:
            log.info(
                "target %s: a closed connection's final counts did not come (lost "
                "notifications): its TCP bytes end at the last pass that saw it",
                target_id,
            )
        table.mark_exited(
            target_id,
            ending.when,
            exit_mode=ending.mode(network_exact),
            rss_peak_bytes=ending.rss_peak_bytes,
            largest_peak_bytes=ending.largest_peak_bytes,
            end_reason=ending.reason,
            exit_status=ending.exit_status,
        )


def final_cpu(last: tuple[float, float], final: tuple[float, float]) -> tuple[float, float]:
    """(user, system) at a target's exit: the larger CPU time of the last reading and
    the exit figures, whole, split as the exit figures split it where neither mode then
    goes below the last reading (both are counters). /proc and the exit records split
    the same runtime between user and system differently, so a maximum per mode
    over-counts: by 33 ms once, in a CI run."""
    (last_user, last_system), (final_user, final_system) = last, final
    total = max(last_user + last_system, final_user + final_system)
    user = max(last_user, min(final_user, total - last_system))
    return user, total - user
