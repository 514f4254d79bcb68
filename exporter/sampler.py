"""The sampling loop: once per interval, read every target and the host into a Snapshot.

This is the only place that touches /proc on the hot path; exporters and the API
read the snapshot and the target table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from exporter.sampling import procfs, system
from exporter.sampling.process import ProcessTree
from exporter.snapshot import HostSample, ProcessSample, SamplerStats, Snapshot
from exporter.targets import Target, TargetTable

log = logging.getLogger(__name__)


class Sampler:
    def __init__(
        self,
        table: TargetTable,
        *,
        interval: float,
        host_name: str,
        proc: str = "/proc",
        on_pass: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.table = table
        self.interval = interval
        self.host_name = host_name
        self.proc = proc
        self._on_pass = on_pass
        self._trees: dict[str, ProcessTree] = {}
        self._attributes: dict[str, Mapping[str, str | int]] = {}
        self._children_files = procfs.has_children_files(proc)
        self._last_cpu: system.HostCpu | None = None
        self._failed: set[str] = set()
        self._overruns = 0
        self._errors = 0
        self._sequence = 0
        self.logical_cpus = system.read_cpu(proc).logical_cpus
        self.snapshot = Snapshot(time=time.time(), sequence=0, host=None)

    def run(self, stop: threading.Event) -> None:
        """Sample at a fixed cadence until ``stop`` is set."""
        deadline = time.monotonic()
        while not stop.is_set():
            try:
                self.sample_once()
            except Exception:
                # A bug in one pass must not end sampling for good; the log says what.
                log.exception("sampling pass failed")
            deadline += self.interval
            delay = deadline - time.monotonic()
            if delay < 0:
                self._overruns += 1
                deadline = time.monotonic()  # skip missed ticks rather than burst
                delay = 0
            stop.wait(delay)
        self.close()

    def sample_once(self) -> Snapshot:
        started = time.monotonic()
        host = self._sample_host()
        children_of = self._children_lookup()
        samples: list[ProcessSample] = []
        running = self.table.running()
        for target in running:
            sample = self._sample_target(target, children_of)
            if sample is not None:
                samples.append(sample)
                self.table.record(sample)
        self._forget_missing({t.id for t in running})
        self.table.purge_exited(time.time())
        self._sequence += 1
        snapshot = Snapshot(
            time=time.time(),
            sequence=self._sequence,
            host=host,
            processes=tuple(samples),
            stats=SamplerStats(
                duration_s=time.monotonic() - started,
                overruns=self._overruns,
                errors=self._errors,
            ),
        )
        self.snapshot = snapshot
        if self._on_pass is not None:
            self._on_pass(snapshot)
        return snapshot

    def _sample_target(
        self, target: Target, children_of: Callable[[int], list[int]]
    ) -> ProcessSample | None:
        tree = self._trees.get(target.id)
        if tree is None:
            if target.handle is None:
                return None
            tree = ProcessTree(
                target.handle,
                children=target.children,
                logical_cpus=self.logical_cpus,
                proc=self.proc,
            )
            self._trees[target.id] = tree
        try:
            reading = tree.sample(children_of)
        except procfs.NoSuchProcess:
            self.table.mark_exited(target.id, time.time())
            self._drop(target.id)
            log.info("target %s (pid %d) exited", target.id, target.pid)
            return None
        except (OSError, ValueError) as exc:
            # One failing target never stops the others; say so once per target.
            self._errors += 1
            if target.id not in self._failed:
                self._failed.add(target.id)
                log.warning("sampling target %s (pid %d) failed: %s", target.id, target.pid, exc)
            return None
        self._failed.discard(target.id)
        attributes = self._attributes.get(target.id)
        if attributes is None:
            attributes = {
                "process.pid": target.pid,
                "process.executable.name": target.executable,
                "edgewatt.target.id": target.id,
                "host.name": self.host_name,
                **target.labels,
            }
            self._attributes[target.id] = attributes
        return ProcessSample(
            target_id=target.id,
            pid=target.pid,
            executable=target.executable,
            attributes=attributes,
            time=time.time(),
            cpu_user_s=reading.cpu_user_s,
            cpu_system_s=reading.cpu_system_s,
            cpu_utilization=reading.cpu_utilization,
            memory_rss_bytes=reading.rss_bytes,
            memory_virtual_bytes=reading.vms_bytes,
            disk_read_bytes=reading.read_bytes,
            disk_write_bytes=reading.write_bytes,
            threads=reading.threads,
            open_fds=reading.open_fds,
            processes=reading.processes,
        )

    def _sample_host(self) -> HostSample | None:
        try:
            cpu = system.read_cpu(self.proc)
            memory = system.read_memory(self.proc)
            network = system.read_network(self.proc)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("reading host figures failed: %s", exc)
            return None
        utilization = None
        last, self._last_cpu = self._last_cpu, cpu
        if last is not None and cpu.total_seconds > last.total_seconds:
            busy = cpu.busy_seconds - last.busy_seconds
            utilization = max(0.0, min(1.0, busy / (cpu.total_seconds - last.total_seconds)))
        return HostSample(cpu=cpu, cpu_utilization=utilization, memory=memory, network=network)

    def _children_lookup(self) -> Callable[[int], list[int]]:
        if self._children_files:
            return lambda pid: procfs.child_pids(pid, self.proc)
        # Without CONFIG_PROC_CHILDREN one scan of /proc per pass serves every target,
        # and only when some target wants its children.
        table: dict[int, list[int]] | None = None

        def lookup(pid: int) -> list[int]:
            nonlocal table
            if table is None:
                table = procfs.parent_map(self.proc)
            return table.get(pid, [])

        return lookup

    def _forget_missing(self, running_ids: set[str]) -> None:
        for target_id in list(self._trees):
            if target_id not in running_ids:
                self._drop(target_id)

    def _drop(self, target_id: str) -> None:
        tree = self._trees.pop(target_id, None)
        if tree is not None:
            tree.close()
        self._attributes.pop(target_id, None)
        self._failed.discard(target_id)

    def close(self) -> None:
        for target_id in list(self._trees):
            self._drop(target_id)
