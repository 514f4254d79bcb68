"""Each metric of the table read off a snapshot: ``(value, attributes)`` points.

The table itself (names, instruments, units, descriptions, attributes) lives in
``edgewatt.core.metrics``; here each metric gets the function that reads its points off
the latest :class:`Snapshot` (``observers()``). Every output that writes the metrics
reads them through ``METRICS`` or its own ``metric_specs()``, never /proc: /metrics
(``exposition.py``), the OTLP push (``telemetry.py``) and the InfluxDB push
(``influx.py``). It imports only core, so each of them reaches it without reaching into
another output.
"""

from __future__ import annotations

import operator
import typing  # runtime aliases: Python 3.8's builtins and abc take no [...]
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgewatt.core.metrics import HOST_HW_ID, TABLE, Metric
from edgewatt.core.power.provenance import NO_SOURCE, info_labels, unknown
from edgewatt.core.power.source import Gpu
from edgewatt.core.power.values import PowerSnapshot, RailState
from edgewatt.core.snapshot import PhaseFigures, ProcessSample, Snapshot

Points = typing.Iterator[typing.Tuple[float, typing.Mapping[str, Any]]]


@dataclass(frozen=True)
class MetricSpec:
    """A metric of the table (edgewatt.core.metrics) and how to observe it."""

    metric: Metric
    observe: Callable[[Snapshot], Points]

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def kind(self) -> str:  # "counter", "updowncounter" or "gauge" (all observable)
        return self.metric.instrument

    @property
    def unit(self) -> str:
        return self.metric.unit

    @property
    def description(self) -> str:
        return self.metric.description


def _per_process(value: Callable[[ProcessSample], float | None]) -> Callable[[Snapshot], Points]:
    def observe(snapshot: Snapshot) -> Points:
        for p in snapshot.processes:
            v = value(p)
            if v is not None:
                yield v, p.attributes

    return observe


def _per_process_split(
    key: str, values: Mapping[str, Callable[[ProcessSample], float | None]]
) -> Callable[[Snapshot], Points]:
    memo: _Memo = {}

    def observe(snapshot: Snapshot) -> Points:
        nonlocal memo
        seen: _Memo = {}
        for p in snapshot.processes:
            for label, value in values.items():
                v = value(p)
                if v is not None:
                    yield v, _extend(memo, seen, p.attributes, key, label)
        memo = seen

    return observe


def _phases(value: Callable[[PhaseFigures], float | None]) -> Callable[[Snapshot], Points]:
    """Per phase of each target: ``value(its figures)``, where not None."""
    memo: _Memo = {}

    def observe(snapshot: Snapshot) -> Points:
        nonlocal memo
        seen: _Memo = {}
        for p in snapshot.processes:
            for phase in p.phases:
                v = value(phase)
                if v is not None:
                    yield v, _extend(memo, seen, p.attributes, "edgewatt.phase", phase.name)
        memo = seen

    return observe


# (id of a target's attributes, added value) -> (those attributes, extended copy)
_Memo = typing.Dict[
    typing.Tuple[int, str], typing.Tuple[typing.Mapping[str, Any], typing.Mapping[str, Any]]
]


def _extend(
    memo: _Memo, seen: _Memo, base: Mapping[str, Any], key: str, value: str
) -> Mapping[str, Any]:
    """``{**base, key: value}``, the same object from pass to pass while the target
    lives: the exposition caches rendered labels by identity. Entries hold ``base``, so
    its id cannot be reused by another object while remembered; each pass keeps only
    the entries it used."""
    k = (id(base), value)
    hit = memo.get(k)
    if hit is None or hit[0] is not base:
        hit = (base, {**base, key: value})
    seen[k] = hit
    return hit[1]


def _host(observe: Callable[[Snapshot], Points]) -> Callable[[Snapshot], Points]:
    def guarded(snapshot: Snapshot) -> Points:
        if snapshot.host is not None:
            yield from observe(snapshot)

    return guarded


def _host_cpu_time(s: Snapshot) -> Points:
    for mode, seconds in s.host.cpu.seconds_by_mode.items():  # type: ignore[union-attr]
        yield seconds, {"cpu.mode": mode}


def _host_memory(s: Snapshot) -> Points:
    for state, value in s.host.memory.bytes_by_state.items():  # type: ignore[union-attr]
        yield value, {"system.memory.state": state}


def _host_network(s: Snapshot) -> Points:
    for name, io in s.host.network.items():  # type: ignore[union-attr]
        yield io.transmit, {"network.interface.name": name, "network.io.direction": "transmit"}
        yield io.receive, {"network.interface.name": name, "network.io.direction": "receive"}


def _one(value: Callable[[Any], float | None]) -> Callable[[Any], Points]:
    """One unlabelled point from a snapshot (or, under _power, a power snapshot)."""

    def observe(s: Any) -> Points:
        v = value(s)
        if v is not None:
            yield v, {}

    return observe


def _device(value: Callable[[PowerSnapshot], float | None]) -> Callable[[PowerSnapshot], Points]:
    """The whole device's point, as the one hardware component ``HOST_HW_ID``."""

    def observe(power: PowerSnapshot) -> Points:
        v = value(power)
        if v is not None:
            yield v, {"hw.id": HOST_HW_ID}

    return observe


def _power(observe: Callable[[PowerSnapshot], Points]) -> Callable[[Snapshot], Points]:
    def guarded(snapshot: Snapshot) -> Points:
        if snapshot.power is not None:
            yield from observe(snapshot.power)

    return guarded


def _process_carbon(snapshot: Snapshot) -> Points:
    carbon = snapshot.carbon
    if carbon is not None:
        for p in snapshot.processes:
            if p.energy_j is not None:
                yield carbon.grams(p.energy_j), p.attributes


def _host_carbon(snapshot: Snapshot) -> Points:
    carbon, power = snapshot.carbon, snapshot.power
    if carbon is not None and power is not None and power.host_energy_j is not None:
        yield carbon.grams(power.host_energy_j), {}


def _energy_parts(snapshot: Snapshot) -> Points:
    for part, joules in snapshot.energy_parts_j.items():
        yield joules, {"edgewatt.energy.part": part}


def _overflows(snapshot: Snapshot) -> Points:
    for listener, count in snapshot.stats.overflows.items():
        yield count, {"edgewatt.listener": listener}


def _rails(value: Callable[[RailState], float | None]) -> Callable[[PowerSnapshot], Points]:
    def observe(power: PowerSnapshot) -> Points:
        for rail in power.rails:
            v = value(rail)
            if v is not None:
                yield v, {"hw.id": rail.id, "hw.name": rail.name, "hw.type": rail.type}

    return observe


def _gpu_value(value: Callable[[Gpu], float | None]) -> Callable[[PowerSnapshot], Points]:
    def observe(power: PowerSnapshot) -> Points:
        for gpu in power.gpus:
            v = value(gpu)
            if v is not None:
                yield v, {"hw.id": gpu.id, "hw.name": gpu.name, "hw.type": "gpu"}

    return observe


def _temperatures(power: PowerSnapshot) -> Points:
    for (source, name), celsius in power.temperatures_c.items():
        yield celsius, {"hw.id": f"{source}:{name}", "hw.name": name, "hw.type": "temperature"}


def _device_info(snapshot: Snapshot) -> Points:
    if snapshot.context is not None:
        yield 1, snapshot.context.labels()


def _energy_source_info(snapshot: Snapshot) -> Points:
    power = snapshot.power
    found = power.provenance if power is not None else None
    for labels in info_labels(found or unknown(NO_SOURCE)):
        yield 1, labels


def _computed() -> Mapping[str, Callable[[Snapshot], Points]]:
    """Observers of the rows that name no sample field (core/metrics.py): the device's
    figures, and what is computed from more than one target's field."""
    return {
        "edgewatt.process.carbon": _process_carbon,
        "hw.gpu.memory.usage": _power(_gpu_value(lambda g: g.memory_used_bytes)),
        "hw.gpu.memory.limit": _power(_gpu_value(lambda g: g.memory_total_bytes)),
        "hw.host.power": _power(_device(lambda p: p.host_power_w)),
        "hw.host.energy": _power(_device(lambda p: p.host_energy_j)),
        "edgewatt.host.carbon": _host_carbon,
        "hw.power": _power(_rails(lambda r: r.power_w)),
        "hw.energy": _power(_rails(lambda r: r.energy_j)),
        "hw.gpu.utilization": _power(_gpu_value(lambda g: g.utilization)),
        "hw.temperature": _power(_temperatures),
        "edgewatt.host.idle_power": _one(lambda s: s.idle_power_w),
        "edgewatt.host.energy.accounted": _energy_parts,
        "edgewatt.device.info": _device_info,
        "edgewatt.energy.source.info": _energy_source_info,
        "system.cpu.time": _host(_host_cpu_time),
        "system.cpu.utilization": _host(_one(lambda s: s.host.cpu_utilization)),  # type: ignore[union-attr],
        "edgewatt.host.logical_cpus": _host(_one(lambda s: s.host.cpu.logical_cpus)),  # type: ignore[union-attr],
        "system.memory.usage": _host(_host_memory),
        "system.memory.limit": _host(_one(lambda s: s.host.memory.total_bytes)),  # type: ignore[union-attr],
        "system.network.io": _host(_host_network),
        "edgewatt.targets": _one(lambda s: len(s.processes)),
        "edgewatt.sampler.duration": _one(lambda s: s.stats.duration_s),
        "edgewatt.sampler.overruns": _one(lambda s: s.stats.overruns),
        "edgewatt.target.exits": _one(lambda s: s.stats.exits),
        "edgewatt.exit.overflows": _overflows,
        "edgewatt.sampler.errors": _one(lambda s: s.stats.errors),
    }


def _reader(record: type, name: str, metric: Metric) -> Callable[[Any], float | None]:
    """What reads ``name`` off a sample (``record``: ProcessSample or PhaseFigures)."""
    # A typo in the table fails at import, not at a scrape. A dataclass field without a
    # default is no class attribute where dataclasses have no slots (Python 3.8, 3.9).
    if not hasattr(record, name) and name not in getattr(record, "__dataclass_fields__", {}):
        raise ValueError(f"metric {metric.name}: {record.__name__} has no field {name!r}")
    return operator.attrgetter(name)


def _derived(metric: Metric) -> Callable[[Snapshot], Points]:
    """The observer a per-target row declares by the sample field(s) it reads."""
    if metric.per_phase:
        return _phases(_reader(PhaseFigures, metric.field, metric))
    if metric.split:
        (key,) = metric.attributes
        values = {label: _reader(ProcessSample, name, metric) for label, name in metric.split}
        return _per_process_split(key, values)
    return _per_process(_reader(ProcessSample, metric.field, metric))


def observers() -> Mapping[str, Callable[[Snapshot], Points]]:
    """How each metric of the table is read off a snapshot: (value, attributes) points,
    derived from the sample field a row names, else its function in ``_computed``.
    A new set per call: some keep a per-pass memo, so each reader (the exposition and
    the OTLP pipeline, the InfluxDB push) has its own."""
    computed = _computed()
    found = {}
    for metric in TABLE:
        declared = bool(metric.field or metric.split)
        if declared == (metric.name in computed):  # neither, or both: which is meant?
            raise ValueError(f"metric {metric.name}: name a sample field or compute it, not both")
        found[metric.name] = _derived(metric) if declared else computed[metric.name]
    if set(computed) - set(found):
        raise ValueError(f"observers of no metric: {sorted(set(computed) - set(found))}")
    return found


def _on_device(observe: Callable[[Snapshot], Points]) -> Callable[[Snapshot], Points]:
    """The device's host.name on a host-level point, as on every per-process one: a
    device is its host name on every path (a push has no scrape's ``instance``)."""

    def named(snapshot: Snapshot) -> Points:
        name = snapshot.host_name
        for value, attributes in observe(snapshot):
            yield value, ({"host.name": name, **attributes} if name else attributes)

    return named


def metric_specs() -> tuple[MetricSpec, ...]:
    """Every metric of the table, in its order, with observers of its own (a metric
    without an observer fails at import, through METRICS)."""
    found = observers()

    def observer(metric: Metric) -> Callable[[Snapshot], Points]:
        per_target = metric.subject == "process"  # its points carry the host name already
        return found[metric.name] if per_target else _on_device(found[metric.name])

    return tuple(MetricSpec(m, observer(m)) for m in TABLE)


METRICS: tuple[MetricSpec, ...] = metric_specs()
