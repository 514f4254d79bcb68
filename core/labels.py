"""Validation of user labels: they become Prometheus labels, so they must be safe ones."""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_LABELS = 64
MAX_NAME_BYTES = 128
MAX_VALUE_BYTES = 1024

# OTel attribute keys may hold dots; the Prometheus exporter turns them into
# underscores. Both forms must be free of collisions.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")

# Set by Prometheus itself, or by edgewatt on every series it exports: a user label
# of that name would shadow or be shadowed.
RESERVED = frozenset(
    {
        "job",
        "instance",
        "le",
        "quantile",
        "host_name",
        "process_pid",
        "process_executable_name",
        "edgewatt_target_id",
        "edgewatt_phase",
        "cpu_mode",
        "disk_io_direction",
        "network_io_direction",
        "network_interface_name",
        "system_memory_state",
        "service_name",
        "service_instance_id",
    }
)


class LabelError(ValueError):
    """A label set that cannot be exported; the message names the label."""


def prometheus_name(key: str) -> str:
    return key.replace(".", "_")


def validate_labels(labels: object) -> dict[str, str]:
    """Return a clean copy of ``labels`` or raise LabelError naming the first problem."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise LabelError(f"labels must be an object of string values, got {type(labels).__name__}")
    if len(labels) > MAX_LABELS:
        raise LabelError(f"too many labels: {len(labels)} (at most {MAX_LABELS})")
    clean: dict[str, str] = {}
    seen: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise LabelError(
                f"invalid label name {key!r}: must start with a letter and hold only "
                "letters, digits, '_' and '.'"
            )
        if len(key.encode()) > MAX_NAME_BYTES:
            raise LabelError(f"label name {key[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
        name = prometheus_name(key)
        if name in RESERVED or name.startswith("__") or name.startswith("otel_"):
            raise LabelError(
                f"label name {key!r} is reserved: edgewatt or Prometheus sets {name!r} "
                "on its series; choose another name"
            )
        if name in seen:
            raise LabelError(f"label names {seen[name]!r} and {key!r} both export as {name!r}")
        if not isinstance(value, str):
            raise LabelError(f"label {key!r} must have a string value, got {type(value).__name__}")
        if len(value.encode()) > MAX_VALUE_BYTES:
            raise LabelError(f"label {key!r} has a value longer than {MAX_VALUE_BYTES} bytes")
        seen[name] = key
        clean[key] = value
    return clean
