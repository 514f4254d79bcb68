"""What an edge pass (a pass on demand for one target) reads beside the target, in
process with a real child: what a regular pass reads for everyone it skips."""

from __future__ import annotations

from typing import Any

from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.sampling.sampler import Parts, Sampler
from edgewatt.core.sampling.trees import ProcessTrees
from tests.conftest import table_with
from tests.test_sampler_power import JetsonBoard


class CountedHost(LinuxPlatform):
    """The Linux platform, counting its reads of the host's files: all three, and
    /proc/stat alone."""

    def __init__(self) -> None:
        super().__init__()
        self.host_reads = self.cpu_reads = 0

    def read_host(self) -> Any:
        self.host_reads += 1
        return super().read_host()

    def read_host_cpu(self) -> Any:
        self.cpu_reads += 1
        return super().read_host_cpu()


def sampling(spawn: Any, power: bool) -> tuple[str, CountedHost, Sampler]:
    """A sleeping child's target id, the counted platform, and a sampler over it (with
    power: a JetsonBoard's, attribution sharing by the host's CPU)."""
    child = spawn("import time; time.sleep(60)")
    table = table_with(child.pid)
    (target,) = table.running()
    platform = CountedHost()
    sampler = Sampler(
        table,
        interval=0.2,
        host_name="h",
        power=PowerMeter([JetsonBoard(gpu_w=10.0)], max_gap_s=5.0) if power else None,
        attribution=Attribution(idle_w=5.0, window_s=600.0) if power else None,
        parts=Parts(ProcessTrees(platform)),
    )
    return target.id, platform, sampler


def test_an_edge_pass_without_power_keeps_the_host_figures_of_the_last_pass(
    spawn: Any,
) -> None:
    target_id, platform, sampler = sampling(spawn, power=False)
    regular = sampler.sample_once()
    assert platform.host_reads == 1 and regular.host is not None
    edges = [sampler.sample_now(target_id) for _ in range(3)]
    # Each edge is a pass with the target's row, and the host as the last pass read it.
    assert [e.sequence for e in edges] == [2, 3, 4]
    assert all(e.host is regular.host for e in edges)
    assert (platform.host_reads, platform.cpu_reads) == (1, 0)
    # The next regular pass reads it anew (its CPU use since the pass before the edges).
    after = sampler.sample_once()
    assert platform.host_reads == 2 and after.host is not regular.host
    sampler.close()


def test_an_edge_pass_with_power_reads_only_the_host_cpu_that_attribution_shares_by(
    spawn: Any,
) -> None:
    target_id, platform, sampler = sampling(spawn, power=True)
    regular = sampler.sample_once()
    edge = sampler.sample_now(target_id)
    assert (platform.host_reads, platform.cpu_reads) == (1, 1)
    # The CPU read at the edge; memory and interfaces the regular pass's.
    assert edge.host is not None and regular.host is not None
    assert edge.host.cpu is not regular.host.cpu
    assert edge.host.memory is regular.host.memory
    assert edge.host.network is regular.host.network
    sampler.sample_once()
    assert (platform.host_reads, platform.cpu_reads) == (2, 1)
    sampler.close()
