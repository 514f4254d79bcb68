"""A target's history: a bounded ring of sample rows, the running figures that outlive
the ring, and the phases (named spans) bounded by those rows."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from edgewatt.core.compat import SLOTS
from edgewatt.core.labels import LabelError, validate_value
from edgewatt.core.targets.errors import TargetError
from edgewatt.core.targets.row import SampleRow

# Phases a target's summary lists: the newest, so a tracked training step or an FL
# round keeps being measured past the bound; the older ones are counted as dropped.
MAX_PHASES = 1000
MAX_PHASE_NAME = 128  # bytes of UTF-8
# The network rate spans the last this many intervals between rows: one is the
# freshest, two smooth a pass on demand that came just after a scheduled one.
RATE_INTERVALS = 2


def phase_name(name: object) -> str:
    """``name`` checked as a phase's name: it becomes a label value, so the same rules
    hold, with a shorter bound (TargetError naming what is wrong)."""
    try:
        return validate_value(name, "the phase name", MAX_PHASE_NAME)
    except LabelError as exc:
        raise TargetError("invalid phase name", str(exc)) from None


@dataclass(**SLOTS)
class MemoryPeaks:
    """The largest PSS summed and largest single process's RSS of the rows added (None:
    never read)."""

    pss: int | None = None
    rss_largest: int | None = None

    def add(self, row: SampleRow) -> None:
        if row.memory_pss_bytes is not None:
            self.pss = max(self.pss or 0, row.memory_pss_bytes)
        if row.memory_rss_largest_bytes is not None:
            self.rss_largest = max(self.rss_largest or 0, row.memory_rss_largest_bytes)


@dataclass(**SLOTS)
class Phase:
    """A named span bounded by samples: from the first sample taken after it began to
    the first taken after it ended. Adjacent phases share that boundary sample, so
    their figures add up; each edge is late by less than one interval."""

    name: str
    started_at: float  # unix seconds: when, as users see it
    started_monotonic: float = 0.0  # for its age (time.monotonic)
    # What its samples and end make of it (none given at its start):
    first: SampleRow | None = field(default=None, init=False)
    last: SampleRow | None = field(default=None, init=False)
    ended_at: float | None = field(default=None, init=False)
    closed: bool = field(default=False, init=False)  # the sample after the end was taken
    rss_peak: int = field(default=0, init=False)  # of the RSS summed
    memory: MemoryPeaks = field(default_factory=lambda: MemoryPeaks(), init=False)
    # The power sensors' coarsest period over the intervals between its samples (the
    # window is flagged against it; None: no sensor, or no interval yet).
    period_s: float | None = field(default=None, init=False)

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def add(self, row: SampleRow, period_s: float | None = None) -> None:
        """A sample; ``period_s``: the sensors' period over the interval it ends."""
        if self.first is None:
            self.first = row
        elif period_s is not None:
            self.period_s = max(self.period_s or 0.0, period_s)
        self.last = row
        self.rss_peak = max(self.rss_peak, row.memory_rss_bytes)
        self.memory.add(row)
        if self.ended_at is not None:
            self.closed = True


@dataclass(**SLOTS)
class History:
    """A bounded ring of samples plus running figures that outlive the ring."""

    capacity: int  # rows kept
    # What its rows make of it (none given at its start):
    rows: deque[SampleRow] = field(init=False)
    first: SampleRow | None = field(default=None, init=False)
    last: SampleRow | None = field(default=None, init=False)
    count: int = field(default=0, init=False)
    # Memory over the rows of live members since the root's last exec: before it, the
    # root was another program (`edgewatt run`'s own fork, held before the exec).
    execs: int = field(default=0, init=False)
    rss_peak: int | None = field(default=None, init=False)  # of the RSS summed
    rss_sum: float = field(default=0.0, init=False)
    memory_rows: int = field(default=0, init=False)
    memory: MemoryPeaks = field(default_factory=lambda: MemoryPeaks(), init=False)
    phases: list[Phase] = field(default_factory=list, init=False)
    phases_dropped: int = field(default=0, init=False)  # the oldest, beyond MAX_PHASES
    # The sensors' coarsest period since the last row (passes that added none to this
    # target's history: on demand for others), and over the whole history.
    pending_period_s: float | None = field(default=None, init=False)
    period_s: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.rows = deque(maxlen=self.capacity)

    def note_period(self, period_s: float | None) -> None:
        """A pass's sensor period, whether or not it adds a row here."""
        if period_s is not None:
            self.pending_period_s = max(self.pending_period_s or 0.0, period_s)

    def add(self, row: SampleRow, execs: int = 0) -> None:
        """A sample; ``execs``: the programs its root exec'd since registration."""
        period, self.pending_period_s = self.pending_period_s, None
        if self.first is not None and period is not None:
            self.period_s = max(self.period_s or 0.0, period)
        self.rows.append(row)
        if self.first is None:
            self.first = row
        self.last = row
        self.count += 1
        if execs != self.execs:  # the memory so far was the previous program's
            self.execs = execs
            self.rss_peak, self.rss_sum, self.memory_rows = None, 0.0, 0
            self.memory = MemoryPeaks()
        if row.processes:  # an exit's row repeats the last reading's memory
            rss = row.memory_rss_bytes
            self.rss_peak = max(self.rss_peak or 0, rss)
            self.rss_sum += rss
            self.memory_rows += 1
            self.memory.add(row)
        # Only the last two phases can still be open: the running one, and the one
        # that ended since the previous sample and waits for its closing sample.
        for phase in self.phases[-2:]:
            if not phase.closed:
                phase.add(row, period)

    @property
    def running_phase(self) -> Phase | None:
        """The phase not yet ended, if any (only the newest can be)."""
        phases = self.phases
        return phases[-1] if phases and phases[-1].ended_at is None else None

    def start_phase(self, phase: Phase, now: float) -> None:
        """End the running phase at ``now`` and start ``phase``; the oldest beyond the
        bound go (they are closed: only the last two can still take samples)."""
        self.end_phase(now)
        phases = self.phases
        phases.append(phase)
        if len(phases) > MAX_PHASES:
            del phases[0]  # a list, not a deque: the pass slices the last few
            self.phases_dropped += 1

    def end_phase(self, now: float) -> Phase | None:
        """End the running phase at ``now``; returns it (None: none was running)."""
        phase = self.running_phase
        if phase is not None:
            phase.ended_at = now
        return phase

    def network_rate(self) -> dict[str, float] | None:
        """TCP bytes per second sent and received between the last row and the one
        ``RATE_INTERVALS`` before it (fewer while the history is shorter), on the
        monotonic clock, with the window's length and its rows' times; None without two
        rows or with a counter unknown or gone back."""
        rows = self.rows
        if len(rows) < 2:
            return None
        last, first = rows[-1], rows[-1 - min(RATE_INTERVALS, len(rows) - 1)]
        span = last.monotonic - first.monotonic
        sent = _growth(first.network_transmit_bytes, last.network_transmit_bytes)
        received = _growth(first.network_receive_bytes, last.network_receive_bytes)
        if span <= 0 or sent is None or received is None:
            return None
        return {
            "transmit_bytes_per_s": round(sent / span, 1),
            "receive_bytes_per_s": round(received / span, 1),
            "window_s": round(span, 6),
            "from_time": first.time,
            "to_time": last.time,
        }

    def end(self, when: float, rss_peak_bytes: int | None) -> None:
        """The target exited at ``when``: its running phase ends there, and the kernel's
        peak RSS of its one process (``rss_peak_bytes``, where known, of the program it
        exec'd last) counts, as no sample can miss it."""
        if rss_peak_bytes is not None:
            self.rss_peak = max(self.rss_peak or 0, rss_peak_bytes)
            largest = self.memory.rss_largest
            self.memory.rss_largest = max(largest or 0, rss_peak_bytes)
        for phase in self.phases:
            if phase.ended_at is None:
                phase.ended_at = when


def _growth(before: int | None, after: int | None) -> int | None:
    if before is None or after is None or after < before:
        return None
    return after - before
