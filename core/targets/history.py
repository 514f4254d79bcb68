"""A target's history: a bounded ring of sample rows, the running figures that outlive
the ring, and the phases (named spans) bounded by those rows.

Phases nest: each has a depth (0: the outermost). A phase started at depth d ends the
running ones at d and deeper and leaves those above it running, each with its own
figures (an epoch holding tracked calls, a round holding its messages); ending at
depth d ends d and deeper (docs/reference.md, "Phases and windows")."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgewatt.core.compat import SLOTS
from edgewatt.core.labels import LabelError, validate_value
from edgewatt.core.targets.edges import EdgeEnergy, Settle
from edgewatt.core.targets.errors import TargetError
from edgewatt.core.targets.row import RowRing, SampleRow

# Phases a target's summary lists: the newest, so a tracked training step or an FL
# round keeps being measured past the bound; the older ones are counted as dropped.
MAX_PHASES = 1000
# A phase kept is ~850 bytes of every summary and GET /v1/top that lists it, and its
# target's labels again in 4 series of /metrics; at most 2,600 B of the daemon's
# memory of its own (docs/reference.md, "Shares per person"): a person
# keeps at most this many over her targets, all users together the next
# (access.forget_phases); root's, MAX_PHASES a target.
MAX_PERSON_PHASES = 1000
MAX_USERS_PHASES = 1000
MAX_PHASE_NAME = 128  # bytes of UTF-8
# Phases running inside each other at most (a depth beyond is refused): bounds what
# every pass adds each row to.
MAX_PHASE_DEPTH = 16
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
class Spread:
    """The lowest and highest of a figure over a window (None: none seen), widened as
    its intervals come: no window ever rescans its samples."""

    low: float | None = None
    high: float | None = None

    def widen(self, low: float | None, high: float | None) -> None:
        if low is not None and (self.low is None or low < self.low):
            self.low = low
        if high is not None and (self.high is None or high > self.high):
            self.high = high


@dataclass(**SLOTS)
class Memory:
    """A window's memory over its samples of live members (an exit's row repeats the
    last reading's): the RSS summed (its lowest, highest, and sum over ``rows`` for the
    mean), the highest PSS summed and the highest RSS of one process (None: never
    read, or no sample yet)."""

    rss: Spread = field(default_factory=Spread)
    rss_sum: float = 0.0
    rows: int = 0
    pss_peak: int | None = None
    rss_largest_peak: int | None = None
    largest_at_exit: bool = False  # rss_largest_peak is an exit record's, above the samples'

    def add(self, row: SampleRow) -> None:
        rss = row.memory_rss_bytes
        # No member, or zombies only (a live process always maps some pages): the pass
        # that reads a command exited but not yet reaped finds no memory held.
        if not row.processes or not rss:
            return
        # Written out rather than through widen() and max(): every target, every pass.
        spread = self.rss
        if spread.low is None or rss < spread.low:
            spread.low = rss
        if spread.high is None or rss > spread.high:
            spread.high = rss
        self.rss_sum += rss
        self.rows += 1
        pss, largest = row.memory_pss_bytes, row.memory_rss_largest_bytes
        if pss is not None and (self.pss_peak is None or pss > self.pss_peak):
            self.pss_peak = pss
        if largest is not None and (
            self.rss_largest_peak is None or largest > self.rss_largest_peak
        ):
            self.rss_largest_peak = largest

    def exited(self, rss_peak_bytes: int | None, largest_peak_bytes: int | None) -> None:
        """The kernel's peak RSS of a one-process target at its exit (no sample can
        miss it, and that one process is the largest), and the largest in its
        processes' exit records (a peak between two passes)."""
        if rss_peak_bytes is not None:
            self.rss.widen(None, rss_peak_bytes)
        peak = max(rss_peak_bytes or 0, largest_peak_bytes or 0)
        if peak and peak >= (self.rss_largest_peak or 0):
            self.rss_largest_peak, self.largest_at_exit = peak, True


@dataclass(**SLOTS)
class Phase:
    """A named span bounded by samples: from the first sample taken after it began to
    the first taken after it ended. Adjacent phases share that boundary sample, so
    their figures add up; each edge is late by less than one interval."""

    name: str
    started_at: float  # unix seconds: when, as users see it
    started_monotonic: float = 0.0  # for its age (time.monotonic)
    depth: int = 0  # how many phases it runs inside (0: none)
    # What its samples and end make of it (none given at its start):
    first: SampleRow | None = field(default=None, init=False)
    last: SampleRow | None = field(default=None, init=False)
    ended_at: float | None = field(default=None, init=False)
    ended_monotonic: float | None = field(default=None, init=False)  # None: at once
    closed: bool = field(default=False, init=False)  # the sample after the end was taken
    # The device's energy at its edges once the power trace has settled them.
    edges: EdgeEnergy = field(default_factory=EdgeEnergy, init=False)
    memory: Memory = field(default_factory=Memory, init=False)
    # The power sensors' coarsest period over the intervals between its samples (the
    # window is flagged against it; None: no sensor, or no interval yet).
    period_s: float | None = field(default=None, init=False)
    # Over the intervals between its samples: the device's power (W) at the sensor's
    # rate, the target's CPU utilization per interval.
    power: Spread = field(default_factory=Spread, init=False)
    cpu_utilization: Spread = field(default_factory=Spread, init=False)

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def final(self) -> bool:
        """Its device energy is the trace's integral over its rows (settled), and, once
        ended, its closing sample is taken: its figures change no more, unless it
        runs (then they grow with its rows)."""
        return (self.closed or self.ended_at is None) and self.edges.final(self.first, self.last)

    @property
    def done(self) -> bool:
        """Ended, closed and final: no pass need visit it again."""
        return self.closed and self.final

    def add(
        self,
        row: SampleRow,
        period_s: float | None = None,
        power: tuple[float, float] | None = None,
    ) -> None:
        """A sample; ``period_s``, ``power``: the sensors' period and the device's
        lowest and highest power over the interval it ends (the first sample's interval
        is before the phase: not counted). A sample read before the phase began (a pass
        under way when it was asked, recorded after) is not its first, and one read
        before it ended does not close it."""
        if self.first is None:
            if row.monotonic < self.started_monotonic:
                return
            self.first = row
        else:
            if period_s is not None:
                self.period_s = max(self.period_s or 0.0, period_s)
            if power is not None:
                self.power.widen(*power)
            utilization = row.cpu_utilization
            self.cpu_utilization.widen(utilization, utilization)
        self.last = row
        self.memory.add(row)
        if self.ended_at is not None and row.monotonic >= (self.ended_monotonic or 0.0):
            self.closed = True


@dataclass(**SLOTS)
class History:
    """A bounded ring of samples plus running figures that outlive the ring."""

    capacity: int  # rows kept
    # What its rows make of it (none given at its start):
    rows: RowRing = field(init=False)
    first: SampleRow | None = field(default=None, init=False)
    last: SampleRow | None = field(default=None, init=False)
    count: int = field(default=0, init=False)
    # As a phase's (Phase.power, Phase.cpu_utilization, Phase.memory), over the whole
    # history; its memory over the rows since its held fork's exec (``execs``: 1 once
    # seen, held_fork.py): before it, the fork was `edgewatt run`'s own, not the
    # command's.
    power: Spread = field(default_factory=Spread, init=False)
    cpu_utilization: Spread = field(default_factory=Spread, init=False)
    memory: Memory = field(default_factory=Memory, init=False)
    execs: int = field(default=0, init=False)
    phases: list[Phase] = field(default_factory=list, init=False)
    phases_dropped: int = field(default=0, init=False)  # the oldest, beyond MAX_PHASES
    # The phases not final yet, oldest first: running, waiting for their closing
    # sample, or for their edges' energy to settle (a few: the passes visit them).
    pending: list[Phase] = field(default_factory=list, init=False)
    # The device's energy at the first row, and at the last as a summary settles it.
    edges: EdgeEnergy = field(default_factory=EdgeEnergy, init=False)
    # The sensors' coarsest period since the last row (passes that added none to this
    # target's history: on demand for others), and over the whole history.
    pending_period_s: float | None = field(default=None, init=False)
    period_s: float | None = field(default=None, init=False)
    # The device's lowest and highest power over the passes since the last row.
    pending_power: Spread = field(default_factory=Spread, init=False)
    # The newest rows whose device energy is not settled yet (settle_rows).
    young: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.rows = RowRing(self.capacity)

    def note(self, period_s: float | None, low: float | None, high: float | None) -> None:
        """A pass's sensor period, and the device's lowest and highest power (W) over it,
        whether or not it adds a row here."""
        if period_s is not None:
            self.pending_period_s = max(self.pending_period_s or 0.0, period_s)
        if low is not None or high is not None:
            self.pending_power.widen(low, high)

    def add(self, row: SampleRow, execs: int = 0) -> None:
        """A sample; ``execs``: 1 once its held fork exec'd (TreeReading.root_execs)."""
        period, self.pending_period_s = self.pending_period_s, None
        pending, power = self.pending_power, None
        if pending.low is not None or pending.high is not None:  # a power source's
            if pending.low is not None and pending.high is not None:
                power = (pending.low, pending.high)
            pending.low = pending.high = None
        if self.first is None:
            self.first = row
        else:
            if period is not None:
                self.period_s = max(self.period_s or 0.0, period)
            if power is not None:
                self.power.widen(*power)
            utilization = row.cpu_utilization
            if utilization is not None:  # widen() written out: every target, every pass
                spread = self.cpu_utilization
                if spread.low is None or utilization < spread.low:
                    spread.low = utilization
                if spread.high is None or utilization > spread.high:
                    spread.high = utilization
        self.rows.append(row)
        self.last = row
        self.count += 1
        if row.device_energy_j is not None or self.young:  # the young: the newest rows
            self.young += 1
        if execs != self.execs:  # the memory so far was the registrant's fork's
            self.execs = execs
            self.memory = Memory()
        self.memory.add(row)
        if self.pending:
            for phase in self.pending:
                if not phase.closed:
                    phase.add(row, period, power)
            # Without a power sensor a closed phase is final at once.
            self.pending = [p for p in self.pending if not p.done]

    def settle(self, settle: Settle, to_last: bool = False) -> None:
        """Settle the device's energy at the edges not final yet: the first row's and
        the pending phases' at every pass, while the trace still holds their
        readings; ``to_last``: the last row's too (a summary's)."""
        if self.edges.start_j is None or to_last:
            self.edges.settle(self.first, self.last if to_last else self.first, settle)
        if self.pending:
            for phase in self.pending:
                phase.edges.settle(phase.first, phase.last, settle)
            self.pending = [p for p in self.pending if not p.done]

    def settle_rows(self, settle: Settle) -> bool:
        """The young rows' device energy, taken at their pass past the last reading (a
        push source's last power held), made the trace's integral up to each row's
        instant once final, oldest first: the rows' differences are then the energy
        between them, never below 0. A row older than the readings the trace keeps (a
        source stalled for minutes) keeps the energy its pass saw. Whether none is left
        to settle."""
        rows = self.rows
        count = len(rows)
        young = min(self.young, count)  # those the ring dropped are gone
        while young:
            index = count - young
            at, held = rows.device_energy(index)
            if at is not None and held is not None:  # a row without a sensor stays so
                joules = settle(at)
                if joules is None:
                    newest, _ = rows.device_energy(count - 1)
                    if newest is None or settle(newest) is None:
                        break  # the reading after it has not come: nor after the rest
                    young -= 1  # too old for the trace, as the newest is settled
                    continue
                rows.settle_device_energy(index, joules)
            young -= 1
        self.young = young
        return not young

    @property
    def final(self) -> bool:
        """Every window's device energy settled up to its last row (edges.py)."""
        return self.edges.final(self.first, self.last) and all(p.final for p in self.pending)

    def settled(self, ended: bool) -> bool:
        """Nothing left for the passes to settle: the first row's energy (where it has
        one), every phase, and, once ``ended``, the last row's."""
        first = self.first
        if first is None or self.pending:
            return False
        if first.device_energy_j is not None and self.edges.start_j is None:
            return False
        return not ended or self.final

    @property
    def running_phases(self) -> list[Phase]:
        """The phases not yet ended, outermost first."""
        return [p for p in self.pending if p.ended_at is None]

    @property
    def depth(self) -> int:
        """The depth a phase started inside every running one takes."""
        running = self.running_phases
        return running[-1].depth + 1 if running else 0

    def start_phase(self, phase: Phase, now: float) -> None:
        """End the running phases at ``phase``'s depth and deeper at ``now``, and start
        ``phase``; the oldest beyond the bound go from the list (a pending one is still
        settled)."""
        self.end_phase(now, phase.depth, phase.started_monotonic)
        phases = self.phases
        phases.append(phase)
        self.pending.append(phase)
        if len(phases) > MAX_PHASES:
            self.drop_oldest_phase()

    def drop_oldest_phase(self) -> None:
        """The oldest phase leaves the list (a pending one is still settled)."""
        del self.phases[0]  # a list, not a deque: the pass slices the last few
        self.phases_dropped += 1

    def end_phase(
        self, now: float, depth: int | None = None, monotonic: float | None = None
    ) -> Phase | None:
        """End the running phases at ``depth`` and deeper (None: the innermost) at
        ``now`` (``monotonic``: the same instant on the monotonic clock; None: the next
        sample closes them whenever it was read); returns the one at ``depth`` (else
        the outermost ended; None: none was running)."""
        running = self.running_phases
        if not running:
            return None
        if depth is None:
            depth = running[-1].depth
        ended = [p for p in running if p.depth >= depth]
        for phase in ended:
            phase.ended_at = now
            phase.ended_monotonic = monotonic
        return next((p for p in ended if p.depth == depth), ended[0] if ended else None)

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

    def end(
        self, when: float, rss_peak_bytes: int | None, largest_peak_bytes: int | None = None
    ) -> None:
        """The target exited at ``when``: its running phase ends there, and the kernel's
        peak RSS of its one process (``rss_peak_bytes``, where known, of the program it
        exec'd last) counts, as no sample can miss it, and so does the largest in its
        processes' exit records (``largest_peak_bytes``)."""
        self.memory.exited(rss_peak_bytes, largest_peak_bytes)
        for phase in self.pending:
            if phase.ended_at is None:
                phase.ended_at = when
            phase.closed = True  # the exit sample, their last, is taken


def _growth(before: int | None, after: int | None) -> int | None:
    if before is None or after is None or after < before:
        return None
    return after - before
