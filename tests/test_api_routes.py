"""The registration API's route table (exporter/api.py) and its reference
(docs/reference.md, "Registration API") name the same endpoints: a handler added
without its row, or a row left after its handler went, fails here."""

from __future__ import annotations

import re

from edgewatt.exporter.api import ROUTES
from tests.conftest import ROOT


def _documented() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Registration API\n", 1)[1].split("\n## ", 1)[0]
    # `GET /v1/targets/{id}/samples[?since=UNIX_S]`: the path ends at a query or option
    return set(re.findall(r"`(GET|HEAD|POST|PUT|DELETE|PATCH) (/[^`\s?\[]*)", section))


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    routed = set(ROUTES.endpoints())
    documented = _documented()
    assert sorted(routed - documented) == [], "in exporter/api.py, not in docs/reference.md"
    assert sorted(documented - routed) == [], "in docs/reference.md, not in exporter/api.py"
