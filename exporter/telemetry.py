"""The OTLP push: the metrics of ``points.py`` as OTel observable instruments, and the
SDK pipeline that pushes them (the exporter classes are ``otlp.py``'s).

Bounded memory under process churn: the SDK keeps one aggregation per attribute set
it has ever seen (field notes: +65 MiB per 50,000 pids), and series of exited targets
would also eat the cardinality limit. So after ``series_rotation`` targets have left,
the whole pipeline (provider, readers) is rebuilt and swapped in one assignment, and
the old one is retired on its own thread (last export, then its state freed). No
value goes back at a rebuild, only the points' start time moves: the counters are
observed absolute values, not sums kept by the SDK.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from edgewatt.core.snapshot import Snapshot
from edgewatt.exporter.output import OutputStatus
from edgewatt.exporter.points import METRICS, MetricSpec

if TYPE_CHECKING:  # the SDK is imported where OTLP push builds a pipeline (~1.5 MiB)
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.metrics.view import View
    from opentelemetry.sdk.resources import Resource

log = logging.getLogger(__name__)


def _view(cardinality_limit: int) -> View:
    """The edgewatt meter's view, its series limit lifted to ``cardinality_limit``."""
    from opentelemetry.sdk.metrics.view import View

    try:
        return View(meter_name="edgewatt", aggregation_cardinality_limit=cardinality_limit)
    except TypeError:  # the SDK before 1.34 (Python 3.8's): it has no limit to lift
        return View(meter_name="edgewatt")


class OtelPipeline:
    """METRICS as OTel observable instruments over the latest snapshot, for OTLP push.

    ``readers`` builds the pipeline's metric readers (the OTLP one in the daemon); a
    rebuilt pipeline gets fresh ones. An ``Output`` (output.py): its SDK reader pushes
    from construction on.
    """

    name = "otlp"

    def __init__(
        self,
        resource: Resource,
        readers: Callable[[], list[MetricReader]],
        *,
        series_rotation: int,
        max_targets: int = 1000,
        metrics: tuple[MetricSpec, ...] = METRICS,
        on_resource: frozenset[str] = frozenset(),
    ) -> None:
        self._resource = resource
        # Attributes the resource carries, left off the points: a store that turns
        # resource attributes into labels (vmagent, the collector) would otherwise get
        # host_name twice, which Prometheus refuses ("label name is not unique").
        self._on_resource = on_resource
        self._metrics = metrics
        self._readers = readers
        self._rotation = series_rotation
        # Per instrument: live and not-yet-rotated targets, two sets each at most
        # (cpu.mode, disk.io.direction), plus host series. The SDK's default of 2000
        # would fold new targets into otel_metric_overflow="true" instead.
        self.cardinality_limit = 2 * (max_targets + series_rotation) + 1000
        self._snapshot: Snapshot | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._provider = self._build()
        self._retiring: list[threading.Thread] = []
        self.rotations = 0

    def _build(self) -> MeterProvider:
        from opentelemetry.sdk.metrics import MeterProvider

        provider = MeterProvider(
            resource=self._resource,
            metric_readers=self._readers(),
            views=[_view(self.cardinality_limit)],
        )
        meter = provider.get_meter("edgewatt")
        create = {
            "counter": meter.create_observable_counter,
            "updowncounter": meter.create_observable_up_down_counter,
            "gauge": meter.create_observable_gauge,
        }
        for spec in self._metrics:
            create[spec.kind](
                spec.name,
                callbacks=[self._callback(spec)],
                unit=spec.unit,
                description=spec.description,
            )
        return provider

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            snapshot = self._snapshot
            if snapshot is None:
                return []
            drop = self._on_resource
            if not drop:
                return [Observation(v, a) for v, a in spec.observe(snapshot)]
            return [
                Observation(v, {k: x for k, x in a.items() if k not in drop})
                for v, a in spec.observe(snapshot)
            ]

        return callback

    def start(self) -> None:
        """The SDK's periodic reader pushes already."""

    def update(self, snapshot: Snapshot) -> None:
        """Publish a new snapshot; rebuild the pipeline once enough targets have left."""
        self._snapshot = snapshot
        live = {p.target_id for p in snapshot.processes}
        with self._lock:
            self._seen |= live
            if len(self._seen) - len(live) < self._rotation:
                return
            self._swap()
            self._seen = set(live)
            self.rotations += 1
        log.info("rebuilt the OTel pipeline to release series of exited targets")

    def reconfigure(self, *, series_rotation: int, max_targets: int) -> None:
        """A reload changed the exporter's settings (``readers`` reads them) or the
        limits: rebuild now, so the next export uses them."""
        with self._lock:
            self._rotation = series_rotation
            self.cardinality_limit = 2 * (max_targets + series_rotation) + 1000
            self._swap()
        log.info("rebuilt the OTel pipeline with the reloaded settings")

    def _swap(self) -> None:
        """A new pipeline in one assignment; the old one retires on its own thread: its
        last export waits on the collector (up to the exporter's timeout when it is
        down), never on the sampling thread. Called with the lock held."""
        old = [self._provider]  # handed over, not held here: see _retire
        self._provider = self._build()
        self._retiring = [t for t in self._retiring if t.is_alive()]
        retire = threading.Thread(target=_retire, args=(old,), name="otel-retire", daemon=True)
        self._retiring.append(retire)
        retire.start()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Last exports: pipelines still retiring share ``timeout_s``, then the current
        one gets as much."""
        with self._lock:
            retiring, self._retiring = self._retiring, []
        deadline = time.monotonic() + timeout_s
        for thread in retiring:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._provider.shutdown(timeout_millis=timeout_s * 1000)

    def stop(self, deadline: float) -> None:
        """``shutdown``, at most a second of it, ending by ``deadline``."""
        self.shutdown(min(1.0, max(0.0, deadline - time.monotonic())))

    def report(self) -> OutputStatus | None:
        """A failing collector is logged (otlp.py), not shown in /healthz."""
        return None


def _retire(box: list[MeterProvider]) -> None:
    """Shut the provider in ``box`` down, then free its series state.

    The SDK's periodic reader sits in a reference cycle that keeps the old pipeline's
    every aggregation alive until the next full collection, which under churn comes
    late. The provider travels in a list so that no frame still holds it then.
    """
    box.pop().shutdown()
    gc.collect()
