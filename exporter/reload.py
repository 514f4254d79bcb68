"""SIGHUP: every changed key the key table marks live is applied to the running parts;
the others are named in one warning and keep their running values until a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from edgewatt.core.sampling.sampler import Sampler
from edgewatt.core.targets import TargetTable
from edgewatt.exporter.api import ApiServer
from edgewatt.exporter.config import KEYS, WHERE, Config
from edgewatt.exporter.outputs import Outputs
from edgewatt.exporter.telemetry import OtelPipeline

log = logging.getLogger(__name__)


class Running(Protocol):
    """The parts a reload reaches (the daemon's)."""

    @property
    def api(self) -> ApiServer: ...
    @property
    def sampler(self) -> Sampler: ...
    @property
    def table(self) -> TargetTable: ...
    @property
    def outputs(self) -> Outputs: ...


@dataclass(frozen=True)
class Change:
    """What a new configuration changes in the running one."""

    config: Config  # the running one with the new live keys
    live: list[str]  # keys applied
    later: list[str]  # keys that keep their running values until a restart
    components: list[str]  # what the live keys configure, each once


def change(current: Config, new: Config) -> Change:
    changed = [k for k in KEYS if getattr(new, k) != getattr(current, k)]
    live = [k for k in changed if KEYS[k].live]
    components = dict.fromkeys(WHERE[k][0] for k in live)
    if "max_targets" in live:  # the OTel pipeline's cardinality limit follows it
        components["otlp"] = None
    return Change(
        config=current.with_values({k: getattr(new, k) for k in live}),
        live=live,
        later=[k for k in changed if not KEYS[k].live],
        components=list(components),
    )


def apply(running: Running, change: Change) -> None:
    """Bring each changed component to ``change.config`` (which the daemon runs
    with already: the OTLP exporter is rebuilt from it); warn of the others."""
    actions = appliers(running)
    for component in change.components:
        actions[component](change.config)
    if change.later:
        log.warning(
            "reload: %s changed but take%s effect only after a restart",
            ", ".join(change.later),
            "s" if len(change.later) == 1 else "",
        )


def appliers(running: Running) -> dict[str, Callable[[Config], None]]:
    """For each component with a live key, what brings its options (read from the
    configuration given) into the running parts."""

    def daemon(config: Config) -> None:
        logging.getLogger().setLevel(config.daemon.log_level.upper())

    def endpoints(config: Config) -> None:
        running.api.min_interval = config.endpoints.min_interval

    def sampler(config: Config) -> None:
        c = config.sampler
        running.sampler.interval = c.interval
        running.sampler.attribution.set_idle(c.idle_power_w)
        running.sampler.attribution.set_window(c.baseline_window)

    def targets(config: Config) -> None:
        running.table.set_limits(config.targets.limits())

    def otlp(config: Config) -> None:
        pipeline = running.outputs.by_name.get(OtelPipeline.name)
        if isinstance(pipeline, OtelPipeline):  # push off: kept for when a restart turns it on
            pipeline.reconfigure(
                series_rotation=config.otlp.series_rotation,
                max_targets=config.targets.max_targets,
            )

    return {
        "daemon": daemon,
        "endpoints": endpoints,
        "sampler": sampler,
        "targets": targets,
        "otlp": otlp,
    }
