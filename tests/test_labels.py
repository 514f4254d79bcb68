from __future__ import annotations

import pytest

from edgewatt.core.labels import LabelError, validate_labels


def test_valid_labels_pass_through() -> None:
    labels = {"run": "r1", "team.name": "edge", "Model_v2": ""}
    assert validate_labels(labels) == labels
    assert validate_labels(None) == {}


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"job": "x"}, "label name 'job' is reserved: edgewatt or Prometheus sets 'job'"),
        ({"__meta": "x"}, "invalid label name '__meta'"),
        (
            {"host.name": "x"},
            "'host.name' is reserved: edgewatt or Prometheus sets 'host_name'",
        ),
        ({"otel_scope": "x"}, "reserved"),
        (
            {"container.runtime.name": "docker"},
            "'container.runtime.name' is reserved: edgewatt or Prometheus sets "
            "'container_runtime_name'",
        ),
        ({"container_name": "x"}, "reserved"),
        ({"run.id": "a", "run_id": "b"}, "'run.id' and 'run_id' both export as 'run_id'"),
        ({"x" * 129: "v"}, "longer than 128 bytes"),
        ({"run": "é" * 513}, "label 'run' has a value longer than 1024 bytes"),
        ({"run": None}, "label 'run' must have a string value, got NoneType"),
        ({f"k{i}": "v" for i in range(65)}, "too many labels: 65 (at most 64)"),
        ("run=x", "labels must be an object"),
    ],
)
def test_bad_labels_are_named(labels: object, message: str) -> None:
    with pytest.raises(LabelError) as err:
        validate_labels(labels)
    assert message in str(err.value)
