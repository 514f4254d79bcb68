"""What OpenTelemetry's semantic conventions v1.44.0 say of the metrics edgewatt exports
under their names: instrument, unit and the attributes each point must carry
(requirement level "required"), read from open-telemetry/semantic-conventions at tag
v1.44.0 (e10a930), model/process/metrics.yaml, model/hardware/*-metrics.yaml with
hardware.attributes.common (hw.id required) and model/system/metrics.yaml.
The table below is that text, not edgewatt's: a metric whose points lack one of these
is not the convention's metric, whatever its name."""

from __future__ import annotations

# name: (instrument, unit, required attributes)
REQUIRED_1_44 = {
    "process.cpu.time": ("counter", "s", ("cpu.mode",)),
    "process.cpu.utilization": ("gauge", "1", ("cpu.mode",)),
    "process.memory.usage": ("updowncounter", "By", ()),
    "process.memory.virtual": ("updowncounter", "By", ()),
    "process.disk.io": ("counter", "By", ("disk.io.direction",)),
    "process.network.io": ("counter", "By", ("network.io.direction",)),
    "process.context_switches": ("counter", "{context_switch}", ("process.context_switch.type",)),
    "process.paging.faults": ("counter", "{fault}", ("process.paging.fault_type",)),
    "hw.host.power": ("gauge", "W", ("hw.id",)),
    "hw.host.energy": ("counter", "J", ("hw.id",)),
    "hw.power": ("gauge", "W", ("hw.id", "hw.type")),
    "hw.energy": ("counter", "J", ("hw.id", "hw.type")),
    "hw.gpu.utilization": ("gauge", "1", ("hw.id",)),
    "hw.gpu.memory.usage": ("updowncounter", "By", ("hw.id",)),
    "hw.gpu.memory.limit": ("updowncounter", "By", ("hw.id",)),
    "hw.temperature": ("gauge", "Cel", ("hw.id",)),
    "system.cpu.time": ("counter", "s", ()),
    "system.cpu.utilization": ("gauge", "1", ()),
    "system.memory.usage": ("updowncounter", "By", ()),
    "system.memory.limit": ("updowncounter", "By", ()),
    "system.network.io": ("counter", "By", ()),
}
# The attribute a container's series carry for its runtime (model/container/registry.yaml;
# ``container.runtime`` is deprecated there, "renamed_to: container.runtime.name").
CONTAINER_RUNTIME = "container.runtime.name"
