"""The Linux platform: every fact from /proc (``proc`` may be a host's /proc mounted in
a container, or a captured tree in tests)."""

from __future__ import annotations

from collections.abc import Callable

from edgewatt.core.facts import procfs, system
from edgewatt.core.facts.membership import Lineage
from edgewatt.core.facts.process import ProcessTree
from edgewatt.core.kernel.taskstats import TaskExits


class LinuxPlatform:
    name = "procfs"
    clock_ticks = procfs.CLOCK_TICKS

    def __init__(self, proc: str = "/proc", *, children_files: bool = False) -> None:
        self.proc = proc
        # Two ways to find descendants: the parent index (one /proc listing, redone only
        # after a process was created: cheapest for many targets) or the kernel's
        # children files (a few reads per member: for one target sampled from inside a
        # busy process, where every GIL release of a /proc listing costs a thread switch).
        self._children_files = children_files and procfs.has_children_files(proc)
        self._parents = procfs.ParentIndex(proc)
        self._host: system.HostFiles | None = None  # opened on first use

    def boot_time(self) -> float:
        return procfs.boot_time(self.proc)

    def open_process(
        self, pid: int, proc: str = "", expect_start: int | None = None
    ) -> procfs.ProcHandle:
        return procfs.ProcHandle(pid, proc or self.proc, expect_start=expect_start)

    def logical_cpus(self) -> int:
        return system.read_cpu(self.proc).logical_cpus

    def process_tree(
        self,
        handle: procfs.ProcHandle,
        *,
        children: bool,
        logical_cpus: int,
        lineage: Lineage | None = None,
        exits: TaskExits | None = None,
    ) -> ProcessTree:
        return ProcessTree(
            handle,
            children=children,
            logical_cpus=logical_cpus,
            proc=self.proc,
            lineage=lineage,
            exits=exits,
        )

    def read_host(
        self,
    ) -> tuple[system.HostCpu, system.HostMemory, dict[str, system.InterfaceBytes]]:
        if self._host is None:
            self._host = system.HostFiles(self.proc)
        return self._host.read()

    def read_host_cpu(self) -> system.HostCpu:
        if self._host is None:
            self._host = system.HostFiles(self.proc)
        return self._host.read_cpu()

    def descendants(self, fresh: Callable[[], bool]) -> Callable[[int], list[int]]:
        if self._children_files:
            return lambda pid: procfs.child_pids(pid, self.proc)
        # One parent index per pass serves every target, and only when some target
        # wants its children.
        table: dict[int, list[int]] | None = None

        def lookup(pid: int) -> list[int]:
            nonlocal table
            if table is None:
                table = self._parents.children(fresh=fresh())
            return table.get(pid, [])

        return lookup

    def holds_gpu(self, pid: int) -> bool:
        return procfs.holds_gpu(pid, self.proc)

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None
