"""The OpenTelemetry resource the daemon's figures carry: the service, the host, the
board (device tree, Jetson Linux release) and the carbon intensity in use.

Its attributes are what the SDK's ``Resource.create(defaults).merge(
OTELResourceDetector().detect())`` holds, computed here: importing
``opentelemetry.sdk.resources`` costs the daemon 1.5 MiB (psutil, typing_extensions,
semconv, concurrent.futures) for one dict. tests/test_otel_resource.py compares the
two for many environments. Where OTEL_EXPERIMENTAL_RESOURCE_DETECTORS names detectors,
the SDK runs them (imported then). The order is SDK 1.45's; the SDK of Python < 3.10
(1.33) puts ``service.instance.id`` later, which changes /metrics only where an
OTEL_RESOURCE_ATTRIBUTES key becomes the same label (``service_instance_id``)."""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.version import __version__ as SDK_VERSION  # a string, nothing else

from edgewatt.core import __version__
from edgewatt.core.carbon import CarbonIntensity
from edgewatt.exporter.config import Config

log = logging.getLogger(__name__)

# What the SDK puts first on every resource (its _DEFAULT_RESOURCE).
SDK_ATTRIBUTES = {
    "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.version": SDK_VERSION,
}


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


def resource_attributes(
    config: Config, instance_id: str, carbon: CarbonIntensity | None = None
) -> dict[str, Any]:
    """The resource's attributes: /metrics writes them as target_info, the OTLP push
    builds the SDK's Resource from them."""
    return merged(daemon_defaults(config, instance_id, carbon))


def daemon_defaults(
    config: Config, instance_id: str, carbon: CarbonIntensity | None = None
) -> dict[str, Any]:
    """What the daemon says of itself, before the environment has its say."""
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
    return defaults


# Names the SDK's resource detectors to run (entry points), beside its two defaults.
DETECTORS = "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"


def merged(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The SDK's attributes < ``defaults`` < OTEL_RESOURCE_ATTRIBUTES and
    OTEL_SERVICE_NAME, in the SDK's order. ``defaults`` name the service and its
    instance (so the SDK's fallbacks, unknown_service and a random id, never show)."""
    if any(name.strip() for name in os.environ.get(DETECTORS, "").split(",")):
        return _by_the_sdk(defaults)
    environment = from_environment()
    # Resource.create: the SDK's attributes, its instance detector's (always replaced
    # by ours), the environment's, then ours; the merge puts the environment's on top.
    attributes = {
        **SDK_ATTRIBUTES,
        "service.instance.id": defaults["service.instance.id"],
        **environment,
        **defaults,
    }
    attributes.update(environment)
    return attributes


def _by_the_sdk(defaults: Mapping[str, Any]) -> dict[str, Any]:
    # Detectors named by entry point (process, os, host, a package's own) run as the
    # SDK runs them; this costs the 1.5 MiB the default path saves.
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    return dict(Resource.create(defaults).merge(OTELResourceDetector().detect()).attributes)


def from_environment() -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES (``k=v,k2=v2``, values percent-decoded, keys and values
    stripped) and OTEL_SERVICE_NAME, read as the SDK's OTELResourceDetector reads them:
    an entry without ``=`` or with an empty key is left out with a warning; a key given
    twice keeps its first place and its last value."""
    attributes: dict[str, str] = {}
    text = os.environ.get("OTEL_RESOURCE_ATTRIBUTES")
    for item in text.split(",") if text else ():
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key:
            log.warning("OTEL_RESOURCE_ATTRIBUTES: %r is no key=value pair, left out", item)
            continue
        attributes[key] = unquote(value.strip())
    service_name = os.environ.get("OTEL_SERVICE_NAME")
    if service_name:
        attributes["service.name"] = service_name
    return attributes
