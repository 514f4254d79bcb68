"""The plain cumulative per-target counters (channels), each declared once: where the
kernel shows it on each way in, and how it is exported.

A channel counts each process's own events: a target's figure is its live members'
counts plus every departed member's final count (its exit record's, which covers all
its threads to its exit, else as last read), carried at once and never backwards
(core/facts/departures.py). Every reader and writer iterates :data:`CHANNELS`: /proc
(core/facts/procfs.py), the exit records (core/kernel/taskstats.py), psutil
(core/platforms/portable.py), `edgewatt run`'s wait4 (cli/run.py), the kept figures
(core/figures.py), the metric table (core/metrics.py) and `edgewatt run`'s table
(cli/report.py). A new channel is its declaration here, its ProcessSample field
(core/snapshot.py) and its SampleRow column (core/targets/row.py); tests/test_channels.py
checks that those two match this list. CPU time and disk bytes are not channels: the
reapers' counters show them (core/facts/process.py's two rules).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exported:
    """A counter metric some channels are exported in, one value of its attribute each."""

    name: str  # the OpenTelemetry name
    unit: str  # UCUM
    attribute: str  # the attribute that tells its channels apart
    description: str
    row: str  # its row in `edgewatt run`'s table


@dataclass(frozen=True)
class Channel:
    name: str  # the figure: ProcessSample field, history column, API and summary key
    unit: str  # in words, as the API's units document says it
    taskstats_member: str  # its struct taskstats member (linux/taskstats.h)
    taskstats_offset: int  # that member's byte offset in struct taskstats
    rusage: str  # getrusage's field: `edgewatt run`'s count of every process it reaped
    # psutil's (Process method, field of what it returns); None: not on this platform
    # (the figure is null on the psutil backend).
    psutil: tuple[str, str] | None
    metric: Exported
    metric_value: str  # its value of the metric's attribute
    words: str  # after its figure in `edgewatt run`'s table row
    # How /proc shows a live process's count: a /proc/PID/status key (its main thread's
    # only), or else a /proc/PID/stat field by its number in proc(5) (every thread's).
    status_key: str = ""
    stat_field: int = 0
    # Where the kernel keeps its reaped children's count: a /proc/PID/stat field's
    # number; 0: only the exit records have it. Not read: a departed member's count
    # is carried at once (its exit record's), never waited for in its reaper's.
    reaped_stat_field: int = 0


_SWITCHES = Exported(
    "process.context_switches",
    "{context_switch}",
    "process.context_switch.type",
    "Context switches of the target and its descendants, by type: voluntary (it "
    "waited: I/O, a lock, a sleep) and involuntary (preempted); a live process's main "
    "thread's (/proc/PID/status), a departed one's whole count (its exit record's)",
    "switches",
)

_FAULTS = Exported(
    "process.paging.faults",
    "{fault}",
    "process.paging.fault_type",
    "Page faults of the target and its descendants, by type: minor (a page mapped "
    "without a read from storage); a live process's every thread's (/proc/PID/stat), a "
    "departed one's whole count (its exit record's)",
    "faults",
)


def _switches(
    kind: str, unit: str, status_key: str, member: str, offset: int, what: str
) -> Channel:
    """A kind of context switch: the main thread's in /proc/PID/status, psutil's
    num_ctx_switches(), wait4's ru_n[i]vcsw."""
    return Channel(
        f"context_switches_{kind}",
        f"count of context switches where a process {unit}, cumulative",
        taskstats_member=member,
        taskstats_offset=offset,
        rusage=f"ru_{member}",
        psutil=("num_ctx_switches", kind),
        metric=_SWITCHES,
        metric_value=kind,
        words=f"{kind} ({what})",
        status_key=status_key,
    )


CHANNELS: tuple[Channel, ...] = (
    _switches(
        "voluntary",
        "waited (I/O, a lock, a sleep)",
        status_key="voluntary_ctxt_switches",
        member="nvcsw",
        offset=272,
        what="waits",
    ),
    _switches(
        "involuntary",
        "was preempted",
        status_key="nonvoluntary_ctxt_switches",
        member="nivcsw",
        offset=280,
        what="preempted",
    ),
    Channel(
        "page_faults_minor",
        "count of minor page faults (a page mapped without a read from storage), cumulative",
        taskstats_member="ac_minflt",
        taskstats_offset=168,
        rusage="ru_minflt",
        # psutil gives no minor faults: macOS's pfaults and Windows' num_page_faults
        # count every fault, Linux's none.
        psutil=None,
        metric=_FAULTS,
        metric_value="minor",
        words="minor (no read from storage)",
        stat_field=10,  # minflt
        reaped_stat_field=11,  # cminflt
    ),
)

NAMES: tuple[str, ...] = tuple(c.name for c in CHANNELS)
NO_COUNTS: tuple[int, ...] = (0,) * len(CHANNELS)
# The metrics, each once, in the order of their first channel.
EXPORTED: tuple[Exported, ...] = tuple(dict.fromkeys(c.metric for c in CHANNELS))

for _channel in CHANNELS:
    if bool(_channel.status_key) == bool(_channel.stat_field):
        raise ValueError(f"{_channel.name}: one of status_key and stat_field, not both")
