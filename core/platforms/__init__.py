"""The operating-system seam: what the sampler needs from a platform, and which one runs.

Two implementations, each a small class with the same few methods (:class:`Platform`):
``linux.py`` reads /proc (the daemon's, and the client's on Linux) and ``portable.py``
reads through psutil (wherever /proc is absent: macOS, Windows, BSD). The sampler is
given one; it never subclasses.

``EDGEWATT_CLIENT_BACKEND=procfs|psutil`` forces the client's choice (the test suite
runs the client tests under both). Standard library only at import.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edgewatt.core.facts.departures import ExitFigures
    from edgewatt.core.facts.membership import Lineage
    from edgewatt.core.facts.process import TreeReading
    from edgewatt.core.facts.system import HostCpu, HostMemory, InterfaceBytes
    from edgewatt.core.kernel.taskstats import TaskExits

log = logging.getLogger(__name__)

ENV = "EDGEWATT_CLIENT_BACKEND"
BACKENDS = ("procfs", "psutil")


class Tree(Protocol):
    """A target and (by default) its descendants, read once per pass."""

    lost_members: bool  # in the last sample: orphans may be re-parented, list anew
    last: TreeReading | None  # the last reading

    def sample(self, children_of: Callable[[int], list[int]]) -> TreeReading: ...

    def exit_figures(self) -> ExitFigures | None:
        """The counters when the last member went, from the kernel's records, when
        complete."""

    def close(self) -> None: ...


class Platform(Protocol):
    name: str  # "procfs" or "psutil"
    clock_ticks: int  # resolution of a process's start time, which names it with the pid

    def boot_time(self) -> float: ...

    def open_process(self, pid: int, proc: str = ..., expect_start: int | None = None) -> Any:
        """A handle that pins the process's identity; NoSuchProcess when it is gone."""

    def logical_cpus(self) -> int: ...

    def process_tree(
        self,
        handle: Any,
        *,
        children: bool,
        logical_cpus: int,
        lineage: Lineage | None = None,
        exits: TaskExits | None = None,
    ) -> Tree:
        """``lineage``: who is in, where the daemon learns it from the kernel's events
        (membership.py); ``exits``: the kernel's exit records."""

    def read_host(self) -> tuple[HostCpu, HostMemory, dict[str, InterfaceBytes]]: ...

    def read_host_cpu(self) -> HostCpu:
        """The host's CPU alone, as read_host gives it (an edge's: cheaper)."""

    def descendants(self, fresh: Callable[[], bool]) -> Callable[[int], list[int]]:
        """A lookup pid -> child pids for one pass; ``fresh()`` says (once, when the
        lookup is first used) whether cached knowledge must be dropped."""

    def holds_gpu(self, pid: int) -> bool:
        """Whether the process has a GPU device open (docs/attribution.md)."""

    def close(self) -> None:
        """Let go of what it holds open between passes."""


def choose(environ: Mapping[str, str] = os.environ) -> str:
    """The forced backend if valid, else procfs where /proc shows this process."""
    forced = environ.get(ENV, "").strip().lower()
    if forced in BACKENDS:
        return forced
    if forced:
        log.warning("edgewatt: %s=%r is not one of %s; choosing by platform", ENV, forced, BACKENDS)
    proc = environ.get("EDGEWATT_PROC_PATH") or "/proc"
    linux = sys.platform.startswith("linux")
    return "procfs" if linux and os.path.exists(os.path.join(proc, "self", "stat")) else "psutil"


def create(backend: str, **options: Any) -> Platform:
    """The platform named ``backend`` (see :func:`choose`)."""
    if backend == "psutil":
        from edgewatt.core.platforms.portable import PsutilPlatform

        return PsutilPlatform()
    from edgewatt.core.platforms.linux import LinuxPlatform

    return LinuxPlatform(**options)
