"""Validation of user labels: they become Prometheus labels, so they must be safe ones."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

MAX_LABELS = 64
MAX_NAME_BYTES = 128
MAX_VALUE_BYTES = 1024
# Label bytes (names and values, UTF-8) users make the daemon hold: every series of a
# target repeats its labels (up to 66 a target on /metrics: 26, and 4 for each of its
# last 10 phases; escaping at most doubles them), so these bound /metrics, the
# daemon's memory and every answer that lists labels (docs/reference.md, "Shares per
# person": at 256 KiB of users' labels and 8,000 phases, /metrics was 15 MB and the
# RSS 612 MiB with answers unread). A person's, over her running and kept exited targets (one
# target at the bounds above, 64 x (128 + 1024) bytes, is more: it is refused); all
# users' together. Root's are the administrator's: bounded by max_targets alone.
MAX_PERSON_LABEL_BYTES = 16 * 1024
MAX_USERS_LABEL_BYTES = 64 * 1024

# OTel attribute keys may hold dots; the Prometheus exporter turns them into
# underscores. Both forms must be free of collisions.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]*")

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
        # A container target's identity (semantic conventions v1.44): a user label of
        # that name would replace the runtime's own on its series.
        "container_name",
        "container_runtime_name",
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


class Room(NamedTuple):
    """Label bytes a person may still add, and the bound that sets it (its words)."""

    left: int
    bound: str


def label_bytes(labels: Mapping[str, str]) -> int:
    """What ``labels`` count against the label bounds: names and values in UTF-8."""
    return sum(len(key) + len(value.encode()) for key, value in labels.items())


def utf8_length(text: str, what: str) -> int:
    """Bytes of ``text`` in UTF-8; a lone surrogate (valid in JSON's \\uXXXX escapes,
    not in UTF-8) is refused here, since /metrics could not encode it."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise LabelError(f"{what} is not valid Unicode (a lone surrogate)") from None


def validate_value(value: object, what: str, max_bytes: int = MAX_VALUE_BYTES) -> str:
    """A label value or phase name: a non-empty string of at most ``max_bytes`` in UTF-8."""
    if not isinstance(value, str):
        raise LabelError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise LabelError(f"{what} must not be empty")
    if utf8_length(value, what) > max_bytes:
        raise LabelError(f"{what} is longer than {max_bytes} bytes")
    return value


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
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise LabelError(
                f"invalid label name {key!r}: must start with a letter and hold only "
                "letters, digits, '_' and '.'"
            )
        if len(key) > MAX_NAME_BYTES:  # ASCII, as _NAME matched
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
        if utf8_length(value, f"the value of label {key!r}") > MAX_VALUE_BYTES:
            raise LabelError(f"label {key!r} has a value longer than {MAX_VALUE_BYTES} bytes")
        seen[name] = key
        clean[key] = value
    return clean
