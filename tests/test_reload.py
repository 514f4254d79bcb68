"""SIGHUP is driven by the key table: every changed key is applied live, or named in
one warning as needing a restart."""

from __future__ import annotations

import signal
import types
from pathlib import Path
from typing import Any

from edgewatt.exporter.config import KEYS, WHERE
from edgewatt.exporter.reload import appliers
from tests.conftest import wait_for
from tests.test_otlp import Received, http_receiver  # noqa: F401 - the receiver fixture


def test_every_live_key_has_an_action_and_no_other_key_has_one() -> None:
    actions = appliers(types.SimpleNamespace())  # type: ignore[arg-type]
    assert set(actions) == {WHERE[k][0] for k, key in KEYS.items() if key.live}
    assert all(actions.values())


def _headers_seen(received: Received, since: int) -> list[str]:
    return [h.get("authorization", "") for h in received.headers[since:]]


def test_a_rotated_otlp_token_is_used_from_the_next_export(
    daemon_factory: Any,
    http_receiver: tuple[str, Received],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    url, received = http_receiver
    config = tmp_path / "edgewatt.yaml"
    settings = f"otlp_endpoint: {url}\notlp_interval: 0.2\nhost_name: before\n"
    config.write_text(settings + "otlp_headers: {authorization: token-1}\n")
    daemon = daemon_factory(extra_args=["--config", str(config)])
    assert wait_for(lambda: "token-1" in _headers_seen(received, 0))
    config.write_text(settings + "otlp_headers: {authorization: token-2}\n")
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "token-2" in _headers_seen(received, 0))
    # Once the new pipeline pushes, every export carries the new token: from its first.
    since = _headers_seen(received, 0).index("token-2")
    assert wait_for(lambda: len(received.headers) >= since + 3)
    assert set(_headers_seen(received, since)) == {"token-2"}
    log = daemon.log()
    assert "configuration reloaded: applied otlp_headers" in log
    assert "restart" not in log


def test_a_restart_only_key_is_named_and_keeps_its_running_value(
    daemon_factory: Any, tmp_path: Path
) -> None:
    config = tmp_path / "edgewatt.yaml"
    config.write_text("host_name: before\nhistory_samples: 300\n")
    daemon = daemon_factory(extra_args=["--config", str(config)])
    assert wait_for(lambda: daemon.value("edgewatt_targets") is not None)
    config.write_text("host_name: after\nhistory_samples: 5\ncarbon_country: DE\n")
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "configuration reloaded" in daemon.log())
    log = daemon.log()
    assert "reload: host_name, carbon_country changed but take effect only after a restart" in log
    assert "applied history_samples" in log
    # The running daemon still answers where it did, under its old name.
    assert daemon.call("GET", "/healthz")[0] == 200
    assert 'host_name="before"' in daemon.metrics_text()
    assert 'host_name="after"' not in daemon.metrics_text()
