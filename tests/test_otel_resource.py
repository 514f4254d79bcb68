"""The resource's attributes, computed without importing opentelemetry.sdk.resources
(1.5 MiB of the daemon's memory), against what the real SDK makes of the same
defaults and environment: keys, values, types and order."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from edgewatt.core.carbon import CarbonIntensity
from edgewatt.exporter import config as configuration
from edgewatt.exporter.otel_resource import daemon_defaults, merged, resource_attributes

OTEL_VARIABLES = (
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS",
)


def by_the_sdk(defaults: Mapping[str, Any]) -> list[tuple[str, Any, type]]:
    """What the SDK builds: Resource.create(defaults) under the environment."""
    resource = Resource.create(dict(defaults)).merge(OTELResourceDetector().detect())
    return typed(resource.attributes)


# SDK 1.45 draws an instance id of its own (replaced by the daemon's) before the
# environment's attributes: its place is the fourth. The SDK that Python < 3.10 gets
# (1.33) draws none, so the daemon's id comes later there; only the order differs.
SDK_DRAWS_AN_INSTANCE_ID = "service.instance.id" in Resource.create().attributes


def typed(attributes: Mapping[str, Any]) -> list[tuple[str, Any, type]]:
    """Keys, values and types (1 == 1.0 == True otherwise), in order where the SDK's
    order is the one otel_resource.py follows."""
    items = [(k, v, type(v)) for k, v in attributes.items()]
    return items if SDK_DRAWS_AN_INSTANCE_ID else sorted(items, key=lambda item: item[0])


@contextmanager
def environment(values: Mapping[str, str | None]) -> Iterator[None]:
    with mock.patch.dict(os.environ):
        for name in OTEL_VARIABLES:
            os.environ.pop(name, None)
        for name, value in values.items():
            if value is not None:
                os.environ[name] = value
        yield


# Text an environment variable can hold (no NUL, no lone surrogate), heavy in what the
# parser cares about: separators, whitespace, percent escapes (valid, truncated,
# invalid UTF-8).
PIECES = st.sampled_from(
    ["=", ",", " ", "\t", "\n", "%", "%20", "%3D", "%2C", "%2", "%zz", "%E2%82%AC", "%ff", "%C3"]
)
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
KEYS = st.sampled_from(
    ["service.name", "service.instance.id", "host.name", "telemetry.sdk.language", "k", " k "]
)
FRAGMENT = st.one_of(PIECES, KEYS, ENV_TEXT, st.sampled_from(["a", "b.c", "é", "0x"]))
ITEM = st.lists(FRAGMENT, max_size=6).map("".join)
RESOURCE_ATTRIBUTES = st.one_of(
    st.none(),
    st.lists(ITEM, max_size=6).map(",".join),  # entries, well formed or not
    ENV_TEXT,
)
SERVICE_NAME = st.one_of(st.none(), st.sampled_from(["", " ", "trainer"]), ENV_TEXT)
DEFAULT_VALUE = st.one_of(ENV_TEXT, st.floats(allow_nan=False), st.integers(), st.booleans())


@st.composite
def defaults(draw: Any) -> dict[str, Any]:
    """The daemon's defaults (its service and instance first) plus other keys, some of
    them ones the environment names too."""
    values = {"service.name": "edgewatt", "service.instance.id": draw(ENV_TEXT.filter(bool))}
    extra = draw(st.dictionaries(st.one_of(KEYS, ENV_TEXT.filter(bool)), DEFAULT_VALUE))
    extra.pop("service.name", None)
    return {**values, **extra, "service.name": draw(st.sampled_from(["edgewatt", "x"]))}


@settings(max_examples=400, deadline=None)
@given(defaults(), RESOURCE_ATTRIBUTES, SERVICE_NAME)
def test_the_attributes_are_the_sdks(
    given_defaults: dict[str, Any], attributes: str | None, service_name: str | None
) -> None:
    with environment({"OTEL_RESOURCE_ATTRIBUTES": attributes, "OTEL_SERVICE_NAME": service_name}):
        assert typed(merged(given_defaults)) == by_the_sdk(given_defaults)


@pytest.mark.parametrize(
    "attributes",
    [
        "",
        ",",
        "deployment.environment=lab",
        " k = v%20w ,x=%3D%2C, =empty,noequals,k=again,y==z,%41=%41",
        "service.name=%E2%82%AC,service.instance.id=mine,telemetry.sdk.language=go",
        "bad=%ff%C3,trunc=%2",
    ],
)
@pytest.mark.parametrize("service_name", [None, "", "trainer"])
def test_the_daemons_own_attributes_are_the_sdks(attributes: str, service_name: str | None) -> None:
    config = configuration.build(None, {}, {})
    carbon = CarbonIntensity(412.5, "country DE")
    with environment({"OTEL_RESOURCE_ATTRIBUTES": attributes, "OTEL_SERVICE_NAME": service_name}):
        ours = resource_attributes(config, "abc123", carbon)
        assert typed(ours) == by_the_sdk(daemon_defaults(config, "abc123", carbon))
    assert ours["edgewatt.carbon.intensity"] == 412.5
    assert ours["telemetry.sdk.version"] == Resource.create().attributes["telemetry.sdk.version"]


def test_environment_values_are_percent_decoded_and_override_the_defaults() -> None:
    given = {"service.name": "edgewatt", "service.instance.id": "abc", "host.name": "vm"}
    with environment(
        {
            "OTEL_RESOURCE_ATTRIBUTES": " host.name = jetson%207 ,team=a%3Db%2Cc,host.name=x=y",
            "OTEL_SERVICE_NAME": "fl-client",
        }
    ):
        ours = merged(given)
    assert ours["host.name"] == "x=y"  # the last one given
    assert ours["team"] == "a=b,c"
    assert ours["service.name"] == "fl-client"  # OTEL_SERVICE_NAME over both
    assert not SDK_DRAWS_AN_INSTANCE_ID or list(ours)[:4] == [
        "telemetry.sdk.language",
        "telemetry.sdk.name",
        "telemetry.sdk.version",
        "service.instance.id",
    ]


def test_a_malformed_entry_is_left_out_and_named_in_the_log(caplog: Any) -> None:
    given = {"service.name": "edgewatt", "service.instance.id": "abc"}
    with environment({"OTEL_RESOURCE_ATTRIBUTES": "a=1,justakey, =2,b=2"}):
        caplog.set_level(logging.WARNING, logger="edgewatt.exporter.otel_resource")
        ours = merged(given)
    assert (ours["a"], ours["b"]) == ("1", "2")
    assert "justakey" not in ours and "" not in ours
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("otel_resource")]
    assert warned == [
        "OTEL_RESOURCE_ATTRIBUTES: 'justakey' is no key=value pair, left out",
        "OTEL_RESOURCE_ATTRIBUTES: ' =2' is no key=value pair, left out",
    ]


@pytest.mark.parametrize("detectors", ["process,os", " otel , service_instance ", "nonesuch"])
def test_named_detectors_run_as_the_sdk_runs_them(detectors: str) -> None:
    given = {"service.name": "edgewatt", "service.instance.id": "abc", "host.name": "vm"}
    with environment(
        {
            "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": detectors,
            "OTEL_RESOURCE_ATTRIBUTES": "team=a",
        }
    ):
        ours = merged(given)
        assert typed(ours) == by_the_sdk(given)
    assert ours["team"] == "a" and ours["host.name"] == "vm"
    if detectors.startswith("process"):
        assert ours["process.pid"] == os.getpid() and ours["os.type"] == "linux"
