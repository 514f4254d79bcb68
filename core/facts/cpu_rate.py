"""CPU seconds as a utilization: a share of all logical CPUs, by mode (user, system).

One home for the arithmetic, so a process tree (``process.py``), a cgroup
(``cgroups.py``) and psutil's trees (``platforms/portable.py``) report the same figure
the same way. Standard library only: the client imports it.
"""

from __future__ import annotations


def cpu_shares(
    used: tuple[float, float], elapsed_s: float, logical_cpus: int
) -> tuple[float, float]:
    """CPU seconds ``used`` (user, system) over ``elapsed_s`` wall seconds as shares of
    all logical CPUs, by mode. The modes add up to the share of both together: a tree
    whose user/system split moved (/proc and the exit records split differently) may
    show one mode going back, so the whole is split in proportion to the modes that
    grew, and nothing is negative."""
    total = max(0.0, used[0] + used[1]) / (elapsed_s * max(logical_cpus, 1))
    # At most all of them: /proc counts CPU in whole ticks (10 ms), so between two edges
    # a few ms apart (edges never wait) one tick read as 3.2 of a 2-core machine.
    total = min(total, 1.0)
    user, system = max(0.0, used[0]), max(0.0, used[1])
    if user + system == 0:
        return (0.0, 0.0)
    return (total * user / (user + system), total * system / (user + system))


_IDLE = (0.0, 0.0)


class CpuRate:
    """CPU seconds over wall seconds between two reads, as a share of all logical CPUs,
    by mode (user, system)."""

    def __init__(self, logical_cpus: int) -> None:
        self._cpus = logical_cpus
        self._last: tuple[float, float, float] | None = None  # (monotonic, user s, system s)

    def update(self, now: float, user_s: float, system_s: float) -> tuple[float, float] | None:
        last, self._last = self._last, (now, user_s, system_s)
        if last is None or now <= last[0]:
            return None
        if user_s == last[1] and system_s == last[2]:
            return _IDLE  # most trees at most passes: one object, no arithmetic
        return cpu_shares((user_s - last[1], system_s - last[2]), now - last[0], self._cpus)
