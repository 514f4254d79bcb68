"""The daemon's outputs, built from the config in one place: every pass reaches each of
them in this order, and each is started, stopped and asked its status in it
(output.py's protocol)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgewatt.exporter.config import Config
from edgewatt.exporter.exposition import Exposition
from edgewatt.exporter.output import Output, OutputStatus
from edgewatt.exporter.recent_power import RecentPower


@dataclass(frozen=True)
class Outputs:
    """Every output by name, and the two the daemon also reads from."""

    exposition: Exposition  # bound before anything starts: the daemon's port
    recent_power: RecentPower  # read by GET /v1/top and /v1/host
    by_name: Mapping[str, Output]

    def statuses(self) -> dict[str, OutputStatus]:
        """Each output's status that /healthz shows, by its name."""
        found = {name: output.report() for name, output in self.by_name.items()}
        return {name: status for name, status in found.items() if status is not None}


def build(config: Config, resource: Mapping[str, Any], current: Callable[[], Config]) -> Outputs:
    """The outputs ``config`` turns on; ``current`` gives the running configuration
    (a reload rebuilds the OTLP exporter from it)."""
    exposition, recent = Exposition(resource), RecentPower()
    found: list[Output] = [exposition, recent]
    if config.otlp_endpoint:  # its metrics SDK and resources imported only then (~3 MiB)
        from opentelemetry.sdk.resources import Resource

        from edgewatt.exporter.otlp import build_reader
        from edgewatt.exporter.telemetry import OtelPipeline

        # The OTel SDK runs only to push: /metrics is rendered from the snapshot.
        found.append(
            OtelPipeline(
                Resource(resource),  # the attributes are Resource.create's already
                lambda: [build_reader(current().otlp)],
                series_rotation=config.series_rotation,
                max_targets=config.max_targets,
                on_resource=frozenset({"host.name"}),
            )
        )
    if config.influx_url:  # http.client, and with it ssl and email, only then (~7 MiB)
        from edgewatt.exporter.influx import InfluxPusher

        found.append(InfluxPusher(config.influx))
    return Outputs(exposition, recent, {output.name: output for output in found})
