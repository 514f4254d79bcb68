"""Config precedence and errors: defaults < YAML < EDGEWATT_* < flags."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from edgewatt.exporter import config as cfg
from tests.conftest import ROOT


def test_defaults_need_no_file() -> None:
    c = cfg.build(None, {}, {})
    assert c.listen == ("0.0.0.0", 9464)
    assert c.interval == 1.0
    assert c.socket == cfg.default_socket()
    assert c.state_dir and c.host_name


def test_precedence_yaml_then_environment_then_flags(tmp_path: Path) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text("interval: 5\nlisten: '127.0.0.1:1000'\nmax_targets: 7\nsocket: /a.sock\n")
    env = {"EDGEWATT_INTERVAL": "3", "EDGEWATT_LISTEN": "[::1]:2000"}
    c = cfg.build(str(yml), env, {"interval": "2"})
    assert c.interval == 2.0  # flag beats environment and YAML
    assert c.listen == ("::1", 2000)  # environment beats YAML
    assert c.max_targets == 7  # YAML beats the default
    assert c.socket == "/a.sock"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("interval: abc\n", "interval: must be a number of seconds, got 'abc' (in "),
        ("interval: 0\n", "interval: must be between 0.05 and 3600, got 0 (in "),
        ("listen: 9464\n", "listen: must be a string, got 9464"),
        ("listen: 'host'\n", "listen: must be HOST:PORT, got 'host'"),
        ("listen: 'h:70000'\n", "listen: port must be 0-65535, got '70000'"),
        ("max_targets: 2.5\n", "max_targets: must be a whole number, got 2.5"),
        ("max_targets: true\n", "max_targets: must be a whole number, got True"),
        ("intervall: 1\n", "intervall: unknown key"),
        ("log_level: loud\n", "log_level: must be debug, info, warning or error"),
        ("- a\n- b\n", "must be a mapping of keys to values"),
        ("interval: [1\n", "not valid YAML"),
    ],
)
def test_bad_yaml_values_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text(yaml_text)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.build(str(yml), {}, {})
    assert message in str(err.value)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(cfg.ConfigError, match=r"interval: .* \(from EDGEWATT_INTERVAL\)"):
        cfg.build(None, {"EDGEWATT_INTERVAL": "soon"}, {})


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match=r"config file .*nope\.yaml: No such file"):
        cfg.build(str(tmp_path / "nope.yaml"), {}, {})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "-1"], "edgewatt: config error: interval: must be between 0.05 and 3600"),
        (["--listen", "nowhere"], "config error: listen: must be HOST:PORT, got 'nowhere'"),
        (["--interval", "x"], "(from --interval)"),
    ],
)
def test_cli_rejects_bad_flags_with_nonzero_exit(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "serve", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert out.returncode == 2
    assert message in out.stderr


def test_cli_rejects_unknown_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "serve", "--bogus"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert out.returncode == 2 and "edgewatt serve: error: unknown flag --bogus" in out.stderr


def test_second_daemon_on_a_live_socket_refuses(daemon_factory, tmp_path: Path) -> None:
    first = daemon_factory()
    out = subprocess.run(
        [
            sys.executable, "-m", "edgewatt.cli", "serve", "--socket", first.socket,
            "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "other"),
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2  # cannot start: one line, status 2
    assert f"socket {first.socket} is in use by a running daemon" in out.stderr
    assert first.call("GET", "/healthz")[0] == 200


def test_every_key_is_documented_and_the_readme_table_is_rendered_from_them() -> None:
    # Config holds one options dataclass per component: each of their fields is a key
    # (but PowerOptions.powermetrics_path, the client's macOS variable alone).
    config = cfg.Config()
    settings = {(c.name, f.name) for c in fields(config) for f in fields(getattr(config, c.name))}
    assert set(cfg.WHERE.values()) == settings - {("power", "powermetrics_path")}
    assert set(cfg.KEYS) == set(cfg.WHERE)
    assert all(key.meaning for key in cfg.KEYS.values())
    readme = (ROOT / "docs" / "reference.md").read_text()
    start = readme.index("<!-- config-table")
    block = readme[readme.index("\n", start) + 1 : readme.index("<!-- /config-table -->")]
    assert block == cfg.markdown_table()


def test_power_keys(tmp_path: Path) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text("power_sources: [ina3221, rapl]\nidle_power_w: 4.5\n")
    c = cfg.build(str(yml), {"EDGEWATT_BASELINE_WINDOW": "600"}, {"tegrastats": "/opt/t"})
    assert c.power_sources == ("ina3221", "rapl")
    assert (c.idle_power_w, c.baseline_window, c.tegrastats) == (4.5, 600.0, "/opt/t")
    assert cfg.build(None, {"EDGEWATT_POWER_SOURCES": "nvml,tegrastats"}, {}).power_sources == (
        "nvml",
        "tegrastats",
    )
    defaults = cfg.build(None, {}, {})
    assert defaults.power_sources is None and defaults.idle_power_w is None
    with pytest.raises(cfg.ConfigError, match="power_sources: unknown power source 'ina'"):
        cfg.build(None, {"EDGEWATT_POWER_SOURCES": "ina"}, {})
    with pytest.raises(cfg.ConfigError, match="idle_power_w: must be a number of watts"):
        cfg.build(None, {"EDGEWATT_IDLE_POWER_W": "lots"}, {})


def test_otlp_keys_from_standard_variables_and_precedence() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20x,tenant=a",
        "OTEL_METRIC_EXPORT_INTERVAL": "15000",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "EDGEWATT_OTLP_PROTOCOL": "http/protobuf",  # edgewatt's own variable wins
    }
    c = cfg.build(None, env, {})
    assert c.otlp_endpoint == "http://collector:4318"
    assert c.otlp_protocol == "http/protobuf"
    assert dict(c.otlp_headers) == {"authorization": "Bearer x", "tenant": "a"}
    assert (c.otlp_interval, c.otlp_timeout) == (15.0, 2.5)
    flagged = cfg.build(None, env, {"otlp_endpoint": "https://other:4318"})
    assert flagged.otlp_endpoint == "https://other:4318"
    with pytest.raises(cfg.ConfigError, match="otlp_protocol: must be http/protobuf or grpc"):
        cfg.build(None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, {})
    with pytest.raises(cfg.ConfigError, match="otlp_endpoint: must be a URL"):
        cfg.build(None, {}, {"otlp_endpoint": "collector:4318"})
    with pytest.raises(cfg.ConfigError, match="from OTEL_METRIC_EXPORT_INTERVAL"):
        cfg.build(None, {"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, {})


def test_the_serve_flags_are_the_keys_that_declare_one() -> None:
    from edgewatt.cli.main import _parser

    declared = {k for k, key in cfg.KEYS.items() if key.flag is not None}
    assert declared == {
        "socket", "listen", "interval", "state_dir", "log_level", "tegrastats",
        "otlp_endpoint", "otlp_protocol", "carbon_intensity_g_per_kwh",
    }  # fmt: skip
    parser, _ = _parser()
    args = parser.parse_args(["serve", "--state-dir", "/s", "--carbon-intensity-g-per-kwh", "9"])
    assert cfg.given_flags(args) == {"state_dir": "/s", "carbon_intensity_g_per_kwh": "9"}


def test_other_commands_do_not_load_the_daemons_config() -> None:
    # The serve flags come from the config's declarations, which import the daemon's
    # exporters: `edgewatt status` and the others must not pay for that.
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys\nfrom edgewatt.cli.main import main\n"
         "code = main(['status', '--socket', '/nonexistent/edgewatt.sock'])\n"
         "print(code, 'edgewatt.exporter.config' in sys.modules)"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert out.stdout == "1 False\n", out.stderr


def test_the_clients_variables_are_the_daemons() -> None:
    from edgewatt.core import transport

    # Written out in transport.py, which the client imports at once (no declarations).
    assert transport.SOCKET_VARIABLE == cfg.KEYS["socket"].variable == "EDGEWATT_SOCKET"


def test_a_keys_flag_and_variables_are_named_by_the_table_not_its_meaning() -> None:
    # Declared once (the option's flag and variables), shown in the table's column.
    for key, declared in cfg.KEYS.items():
        for name in [declared.flag_name, *(v.name for v in declared.variables)]:
            assert name not in declared.meaning, (key, name)
    row = next(r for r in cfg.markdown_table().splitlines() if r.startswith("| `otlp_interval`"))
    assert "| `OTEL_METRIC_EXPORT_INTERVAL (in ms)` |" in row


def test_each_component_gets_its_own_options_as_declared() -> None:
    from edgewatt.core.power.source import PowerOptions
    from edgewatt.exporter.keys import InfluxOptions, OtlpOptions

    env = {
        "INFLUX_HOST": "http://influx:8086",
        "INFLUX_DATABASE": "edge",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "EDGEWATT_POWER_SAMPLE_HZ": "20",
    }
    c = cfg.build(None, env, {"tegrastats": "/opt/t"})
    assert c.influx == InfluxOptions("http://influx:8086", database="edge")
    assert c.otlp == OtlpOptions("http://collector:4318", timeout_s=2.5)
    assert c.power == PowerOptions(sample_hz=20.0, tegrastats_path="/opt/t")
    # Flat reads stay: config.<key> is the key's value wherever it is declared.
    assert (c.influx_database, c.otlp_timeout, c.power_sample_hz) == ("edge", 2.5, 20.0)
    with pytest.raises(AttributeError, match="no key 'influx_databse'"):
        c.influx_databse  # noqa: B018 - the read is the test


def test_the_config_loads_without_the_exporters() -> None:
    # `edgewatt doctor` and `config example` load it, under the system's Python too.
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys\nimport edgewatt.exporter.config\n"
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry', 'grpc'}))"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert out.stdout == "[]\n", out.stderr
