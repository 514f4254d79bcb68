"""The OpenTelemetry resource the daemon's figures carry: the service, the host, the
board (device tree, Jetson Linux release) and the carbon intensity in use."""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from edgewatt.core import __version__
from edgewatt.core.carbon import CarbonIntensity
from edgewatt.exporter.config import Config


def machine_id() -> str:
    """The machine's id (stable across restarts and reinstalls), "" where it has none."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


# OTel semconv host.arch values for what the kernel calls the machine.
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm32",
    "ppc64le": "ppc64",
    "s390x": "s390x",
}


def device_facts(proc: str = "/proc", etc: str = "/etc") -> dict[str, str]:
    """The board's model (device tree) and the Jetson Linux (L4T) release, where present."""
    facts = {}
    try:
        model = Path(f"{proc}/device-tree/model").read_bytes().rstrip(b"\0").decode().strip()
    except (OSError, UnicodeDecodeError):
        model = ""
    if model:
        facts["device.model.name"] = model
    try:
        first = Path(f"{etc}/nv_tegra_release").read_text().splitlines()[0]
    except (OSError, IndexError):
        first = ""
    # "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, ..."
    match = re.match(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", first)
    if match:
        facts["edgewatt.l4t.release"] = f"{match[1]}.{match[2]}"
    return facts


def build_resource(
    config: Config, instance_id: str, carbon: CarbonIntensity | None = None
) -> Resource:
    machine = platform.machine()
    defaults: dict[str, Any] = {
        "service.name": "edgewatt",
        "service.version": __version__,
        "service.instance.id": instance_id,
        "host.name": config.host_name,
        "host.arch": _ARCH.get(machine, machine),
        "os.type": "linux",
        **device_facts(config.proc_path),
    }
    if carbon is not None:
        defaults["edgewatt.carbon.intensity"] = carbon.g_per_kwh  # gCO2e/kWh
        defaults["edgewatt.carbon.intensity.source"] = carbon.source
    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the defaults.
    return Resource.create(defaults).merge(OTELResourceDetector().detect())
