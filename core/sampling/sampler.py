"""The sampling loop: once per interval, read every target and the host into a Snapshot.

This is the only place that touches /proc on the hot path; exporters and the API
read the snapshot and the target table. A pass reads each target through its
reader (sampling/trees.py), adds what the contributors count for it
(sampling/contributors.py), shares the energy out (power/attribution.py) and
records an ended target's exit sample (sampling/exits.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.core.facts import procfs
from edgewatt.core.facts.cgroups import CgroupEnded, CgroupGone
from edgewatt.core.facts.process import TreeReading
from edgewatt.core.platforms.context import DeviceContext
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution, PassInputs, TargetUse, gpu_totals
from edgewatt.core.power.meter import WINDOW_BOOST_S, PowerMeter, PowerSnapshot
from edgewatt.core.sampling.clock import Clock
from edgewatt.core.sampling.contributors import Contributor, check_declared, gather
from edgewatt.core.sampling.exits import Ending, exit_reading, mark_exited
from edgewatt.core.sampling.host import HostReader
from edgewatt.core.sampling.passes import READ, RECORDED, Passes, Step
from edgewatt.core.sampling.tracked import TargetState
from edgewatt.core.sampling.trees import ProcessTrees, TargetEnded
from edgewatt.core.snapshot import HostSample, ProcessSample, SamplerStats, Snapshot
from edgewatt.core.targets import MAX_SAMPLE_AGE_S, Target, TargetTable

log = logging.getLogger(__name__)

# Phases exported per target as series (each phase name is a label value): enough for
# a dashboard's recent-phases table, bounded whatever a client sends.
EXPORTED_PHASES = 10


@dataclass(frozen=True)
class Parts:
    """What a sampler reads through, all given at construction (the daemon's are
    started by exporter/collectors.py): the targets' readers, the contributors of
    per-target figures, the clock."""

    trees: ProcessTrees
    contributors: Sequence[Contributor] = ()
    clock: Clock = field(default_factory=Clock)


class Sampler:
    def __init__(
        self,
        table: TargetTable,
        *,
        interval: float,
        host_name: str,
        on_pass: Callable[[Snapshot], None] | None = None,
        power: PowerMeter | None = None,
        attribution: Attribution | None = None,
        carbon: CarbonIntensity | None = None,
        parts: Parts | None = None,
        context: Callable[[], DeviceContext | None] | None = None,
    ) -> None:
        """``context``: the device's latest context read (core/platforms/context.py: its own
        thread reads it, never a pass), put in each snapshot."""
        parts = parts or Parts(ProcessTrees(LinuxPlatform()))
        self.table = table
        self.interval = interval
        self.host_name = host_name
        self.power = power
        self.attribution = attribution or Attribution(None, 3600.0)
        self.carbon = carbon
        self._on_pass = on_pass
        self._context = context
        self._trees = parts.trees
        self._contributors: tuple[Contributor, ...] = (parts.trees, *parts.contributors)
        check_declared(self._contributors)
        self._clock = parts.clock
        self._host = HostReader(parts.trees.platform)
        self._inputs = PassInputs(parts.trees.platform.holds_gpu)
        self._states: dict[str, TargetState] = {}  # every tracked target's, by id
        self._relist = False  # a tree lost members or a target exited: list /proc anew
        self._errors = self._exits = self._sequence = 0
        self.logical_cpus = parts.trees.logical_cpus
        if power is not None:  # the summaries settle their windows' edges by it
            table.settlement = power
        self.snapshot = Snapshot(time=self._clock.time(), sequence=0, host=None)
        self._passes = Passes(self, self._clock)  # when passes run
        self.closed = False

    def run(self, stop: threading.Event) -> None:
        """Sample at a fixed cadence until ``stop`` is set (then call :meth:`wake`).
        Passes on demand (:meth:`sample_now`) run meanwhile in their callers' threads
        and leave the cadence as it was."""
        self._passes.run(stop)

    def wake(self) -> None:
        """End the wait between passes now: to stop."""
        self._passes.wake()

    def sample_now(self, target_id: str | None = None, timeout_s: float = 2.0) -> Snapshot:
        """A pass that starts after this call, and its snapshot: the edge of a
        registration, a phase or a monitor's read is then a sample, not the nearest
        pass. It runs in the caller's thread (no hand-off to the sampling thread: a
        few hundred us); asks that come together share one pass, which reads only the
        targets that asked (``target_id``; None: every target) and adds a row to their
        histories; the others keep their last samples until the regular passes."""
        return self._passes.on_demand(target_id, timeout_s)

    def sample_edge(
        self, target_id: str, until: Step, timeout_s: float = 2.0
    ) -> Callable[[], None]:
        """:meth:`sample_now` for one target's edge, run now up to ``until`` (READ or
        RECORDED); the rest of the pass is returned, for the caller to run once its
        answer is written. The next pass waits until it has."""
        return self._passes.edge(target_id, timeout_s, until)

    def sample_once(self, record: set[str] | None = None) -> Snapshot:
        """One pass over every target, each with a row in its history; with
        ``record`` (an edge), over those targets only: the others' last samples go into
        the snapshot as they were, and attribution lets their intervals run on."""
        steps = self.pass_steps(record)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def pass_steps(self, record: set[str] | None = None) -> Generator[Step, None, Snapshot]:
        """:meth:`sample_once` in steps: it stops after READ (the targets' counters
        and the host's CPU, read at the pass's instant) and after RECORDED (the
        power read, the rows in the histories), so that an edge's answer can be
        written before what it does not need."""
        started = self._clock.monotonic()
        for contributor in self._contributors:
            contributor.begin()
        host = self._host_figures(record)
        children_of = self._trees.platform.descendants(self._take_relist)
        running = self.table.running()
        # An edge reads only the targets that asked: the others keep their last
        # samples, and their intervals run on to their next reading.
        asked = running if record is None else [t for t in running if t.id in record]
        read = [s for t in asked if (s := self._read(t, children_of)) is not None]
        edge = record is not None
        figures, refused = gather(self._contributors, read, edge, at_edges=True)
        # The clocks once for every sample (after every reading): a reading's instant on
        # the monotonic clock is its wall time moved by their offset (see _sample).
        now = (self._clock.time(), self._clock.monotonic())
        yield READ
        # The gauges (PSS) after the counters' instant: an edge's answer waits for no
        # smaps_rollup (a new target's first: 5-12 ms for one of many mappings).
        gauges, refused_gauges = gather(self._contributors, read, edge, at_edges=False)
        self._errors += refused + refused_gauges
        for target_id, given in gauges.items():
            figures.setdefault(target_id, []).extend(given)
        power = None
        if self.power is not None:
            # After the targets: a pull source's reading is then at or after every
            # sample's instant, whose energy is final at once (targets/edges.py); the
            # device's energy at each instant is interpolated from the trace.
            edge = self._clock.monotonic()
            power = self.power.read(edge, self._window_until(edge))
        self.table.energy_period_s = power.period_s if power is not None else None
        if power is not None and power.provenance is not None:
            self.table.energy_provenance = power.provenance
        self._attribute(started, power, read, running if record is not None else ())
        samples = [self._sample(state, power, figures.get(state.target.id), now) for state in read]
        sequence = self._sequence + 1
        for state in read:  # a sample built anew carries this pass's figures
            if not state.copied:
                state.figures_since = sequence
        ended = [s for s in self._states.values() if s.ending is not None]
        ended_ids = {s.target.id for s in ended}
        self.table.record(
            samples,
            None if record is None else record | ended_ids,
            (None, None) if power is None else (power.power_min_w, power.power_max_w),
        )
        yield RECORDED
        # The phases' figures for export after RECORDED: no answer holds them.
        phases = self.table.recent_phases([s.target_id for s in samples], EXPORTED_PHASES)
        for state in ended:  # their exit sample is taken: let them go
            self._drop(state.target.id)
        if phases:  # a phase's figures move every pass
            samples = [
                dataclasses.replace(s, phases=phases[s.target_id]) if s.target_id in phases else s
                for s in samples
            ]
            for target_id in phases:
                if target_id in self._states:
                    self._states[target_id].figures_since = sequence
        if len(self._states) != len(running):  # each running target has a state now
            self._forget_missing({t.id for t in running})
        self.table.purge_exited(self._clock.time())
        self._sequence = sequence
        figures_since = {s.target.id: s.figures_since for s in read}
        if record is not None:
            samples, figures_since = self._with_waiting(samples, figures_since, running)
        statuses = [c.status() for c in self._contributors]
        snapshot = Snapshot(
            time=self._clock.time(),
            sequence=self._sequence,
            host=host,
            # An exit sample goes to the target's history only: its series leave the
            # exporters in the pass that finds the exit.
            processes=tuple(s for s in samples if s.target_id not in ended_ids),
            exits=tuple(s for s in samples if s.target_id in ended_ids),
            power=power,
            idle_power_w=self.attribution.idle_w_in_use if power is not None else None,
            energy_parts_j=dict(self.attribution.parts_j) if power is not None else {},
            carbon=self.carbon,
            host_name=self.host_name,
            figures_since=figures_since,
            context=self._context() if self._context is not None else None,
            stats=SamplerStats(
                duration_s=self._clock.monotonic() - started,
                overruns=self._passes.overruns,
                errors=self._errors,
                exits=self._exits,
                overflows={k: n for s in statuses for k, n in s.overflows.items()},
            ),
        )
        self.snapshot = snapshot
        try:
            if self._on_pass is not None:
                self._on_pass(snapshot)
        finally:
            # Marked only now, so a target the API calls exited is already out of
            # what the exporters serve.
            exact = all(s.exact for s in statuses)
            mark_exited(self.table, [(s.target.id, s.ending) for s in ended if s.ending], exact)
        return snapshot

    def _with_waiting(
        self, samples: list[ProcessSample], figures_since: dict[str, int], running: list[Target]
    ) -> tuple[list[ProcessSample], dict[str, int]]:
        """An edge's samples with the last pass's of the running targets it did not
        read, as they were (in the table's order), and the passes their figures are of."""
        last = self.snapshot
        fresh = {s.target_id: s for s in samples}
        kept = {s.target_id: s for s in last.processes if s.target_id not in fresh}
        ordered = [fresh.pop(t.id, None) or kept.get(t.id) for t in running]
        merged = [s for s in ordered if s is not None] + list(fresh.values())
        since = {t: n for t, n in last.figures_since.items() if t in kept}
        return merged, {**since, **figures_since}

    def _host_figures(self, record: set[str] | None) -> HostSample | None:
        """The host's figures: read whole by a regular pass. An edge's pass reads only
        what attribution shares by, the host's CPU, and with no power to share nothing
        (the last pass's figures; the next regular pass's utilization then spans the
        whole interval); memory and interfaces stay the last regular pass's."""
        last = self.snapshot.host
        if record is None or last is None:
            return self._host.read()
        if self.power is None:
            return last
        return self._host.read(kept=last)

    def _read(self, target: Target, children_of: Callable[[int], list[int]]) -> TargetState | None:
        """The target's state with this pass's reading (its exit sample where it
        ended); None where it has none."""
        state = self._states.get(target.id)
        if state is None:
            state = self._states[target.id] = TargetState(target)
        state.target, state.reading = target, self._reading(state, children_of)
        if state.reading is None:
            state.cpu_s = None  # attribution counts its CPU time from its next reading
            return None
        return state

    def _reading(
        self, state: TargetState, children_of: Callable[[int], list[int]]
    ) -> TreeReading | None:
        target = state.target
        if state.tree is None:
            try:
                state.tree = self._trees.open(target, self.table.lookups)
            except TargetEnded as ended:
                self._end(state, str(ended))
                return None
        tree = state.tree
        if tree is None:
            return None
        try:
            reading = tree.sample(children_of)
        except CgroupEnded as ended:
            self._relist = True
            self._exits += 1
            self._end(state, ended.reason)
            return self._exit_reading(state)
        except procfs.NoSuchProcess:
            self._relist = True
            self._end(state, None)
            self._exits += 1
            log.info("target %s (pid %d) exited", target.id, target.pid)
            return self._exit_reading(state)
        except (OSError, ValueError, CgroupGone) as exc:
            # One failing target never stops the others; say so once per target.
            self._errors += 1
            if not state.failed:
                state.failed = True
                log.warning("sampling target %s (pid %d) failed: %s", target.id, target.pid, exc)
            return None
        state.failed = False
        self._relist = self._relist or tree.lost_members
        abandoned = self._trees.abandoned(tree, reading)
        if abandoned is not None:
            self._exits += 1
            self._end(state, abandoned)
            return self._exit_reading(state)
        return reading

    def _end(self, state: TargetState, reason: str | None) -> None:
        """The target ends in this pass; ``reason``: why a cgroup target does (its
        summary says it)."""
        if state.ending is None:
            state.ending = Ending(self._clock.time())
        if reason is not None:
            state.ending.reason = reason
            log.info("target %s (%s) ends: %s", state.target.id, state.target.executable, reason)

    def _exit_reading(self, state: TargetState) -> TreeReading | None:
        target, tree, ending = state.target, state.tree, state.ending
        assert tree is not None and ending is not None
        return exit_reading(
            tree,
            ending,
            records=self._trees.exits is not None,
            cgroup=target.cgroup_name is not None,
            name=f"{target.id} (pid {target.pid})",
        )

    def _attribute(
        self,
        now: float,
        power: PowerSnapshot | None,
        read: list[TargetState],
        running: Sequence[Target],
    ) -> None:
        """Share the energy measured since the last pass among the targets read;
        ``running``, at an edge: every running target (those not read wait)."""
        if self.power is None:  # a daemon without a power source: nothing ever to share
            return
        used = {}
        for state in read:
            assert state.reading is not None
            cpu_s = state.reading.cpu_user_s + state.reading.cpu_system_s
            before = state.cpu_s if state.cpu_s is not None else cpu_s
            state.cpu_s = cpu_s
            if power is not None:  # nothing to share out otherwise
                used[state.target.id] = TargetUse(max(0.0, cpu_s - before), state.reading.pids)
        measured = self._inputs.measure(now, power, self._host.busy_delta, used)
        if measured is None:
            self.attribution.restart(s.target.id for s in read)
            return
        was_read = {s.target.id for s in read}
        waiting = [t.id for t in running if t.id not in was_read]
        self.attribution.update(*measured, waiting)

    def _sample(
        self,
        state: TargetState,
        power: PowerSnapshot | None,
        figures: Sequence[Mapping[str, Any]] | None,
        now: tuple[float, float],
    ) -> ProcessSample:
        """``now``: the wall and monotonic clocks, read after the pass's readings."""
        assert state.reading is not None
        target_id, pids = state.target.id, state.reading.pids
        # The reading's instant on the monotonic clock, once: its row's durations and
        # its device energy both come from it, so a pass's power edge read earlier (by
        # ms on a busy machine) skews no average power.
        age = min(max(0.0, now[0] - state.reading.time), MAX_SAMPLE_AGE_S)
        instant = now[1] - age
        return state.sample(
            self.host_name,
            power_w=self.attribution.power_w.get(target_id) if self.power else None,
            energy_j=self.attribution.energy_j.get(target_id, 0.0) if self.power else None,
            device_energy_j=self._device_energy(instant, power),
            gpu=gpu_totals(power, pids),
            figures=figures or (),
            monotonic=instant,
        )

    def _device_energy(self, instant: float, power: PowerSnapshot | None) -> float | None:
        """The device's energy at the sample's own instant: when its target was read,
        or, for an exit sample (dated at the exit by the kernel's records), the exit."""
        if power is None or self.power is None:
            return None
        at_instant = self.power.energy_at(instant)
        return power.host_energy_j if at_instant is None else at_instant

    def _window_until(self, started: float) -> float | None:
        """Until when (monotonic) the youngest running phase (a ``track`` call, an FL
        round) is young enough for the power reader's window rate; None: none is."""
        age = self.table.youngest_phase_age()
        if age is None or age >= WINDOW_BOOST_S:
            return None
        return started + WINDOW_BOOST_S - max(0.0, age)

    def _take_relist(self) -> bool:
        relist, self._relist = self._relist, False
        return relist

    def _forget_missing(self, running_ids: set[str]) -> None:
        for target_id in list(self._states):
            if target_id not in running_ids:
                self._drop(target_id)

    def _drop(self, target_id: str) -> None:
        state = self._states.pop(target_id, None)
        if state is not None:
            state.close()
        for contributor in self._contributors:
            contributor.forget(target_id)
        self.attribution.forget(target_id)

    def close(self) -> None:
        self.closed = True
        for target_id in list(self._states):
            self._drop(target_id)
        if self.power is not None:
            self.power.close()
        for contributor in reversed(self._contributors):
            contributor.close()
