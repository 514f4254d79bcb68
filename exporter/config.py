"""Daemon configuration: defaults < YAML file < OTEL_* < EDGEWATT_* environment < flags.

Every key has its default in ``Config`` and its parser and meaning in ``KEYS``; a test
checks that the README's table names every key. A bad value raises
:class:`ConfigError` naming the key, where it came from, and the problem.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from edgewatt.core import carbon
from edgewatt.core.power.source import AUTO_PUSH_HZ, MAX_SAMPLE_HZ, WINDOW_HZ
from edgewatt.core.text import shown
from edgewatt.core.transport import default_socket


class ConfigError(ValueError):
    pass


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/edgewatt"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return os.path.join(base, "edgewatt")


@dataclass(frozen=True)
class Config:
    socket: str = ""  # "" means default_socket()
    listen: tuple[str, int] = ("0.0.0.0", 9464)
    interval: float = 1.0
    min_interval: float = 0.1
    state_dir: str = ""  # "" means default_state_dir()
    max_targets: int = 1000
    max_targets_per_uid: int = 100
    history_samples: int = 300
    exited_retention: float = 600.0
    series_rotation: int = 200
    exact_exits: bool = True
    follow_forks: bool = True
    host_name: str = ""  # "" means the kernel's hostname
    proc_path: str = "/proc"
    log_level: str = "info"
    power_sources: tuple[str, ...] | None = None  # None: discover automatically
    power_sample_hz: float | None = None  # None: chosen on the device (auto)
    power_window_hz: float = WINDOW_HZ  # 0: windows read at power_sample_hz
    tegrastats: str = "/usr/bin/tegrastats"
    sysfs_path: str = "/sys"
    idle_power_w: float | None = None  # None: estimated from the measurements
    baseline_window: float = 3600.0
    carbon_intensity_g_per_kwh: float | None = None  # None: no carbon figures
    carbon_country: str = ""  # "" means none; ISO 3166-1 code of the shipped table
    otlp_endpoint: str = ""  # "" means no OTLP push
    otlp_protocol: str = "http/protobuf"
    otlp_headers: tuple[tuple[str, str], ...] = ()
    otlp_ca_file: str = ""
    otlp_insecure: bool = False
    otlp_interval: float = 60.0
    otlp_timeout: float = 5.0
    influx_url: str = ""  # "" means no InfluxDB push
    influx_database: str = ""
    influx_org: str = ""
    influx_bucket: str = ""
    influx_token: str = ""
    influx_username: str = ""
    influx_password: str = ""
    influx_interval: float = 10.0
    influx_timeout: float = 5.0
    influx_buffer_bytes: int = 64 << 20

    def resolved(self) -> Config:
        return replace(
            self,
            socket=self.socket or default_socket(),
            state_dir=self.state_dir or default_state_dir(),
            host_name=self.host_name or socket.gethostname(),
        )


def _ranged(convert: Callable[[Any], Any], lo: float, hi: float, what: str) -> Callable[[Any], Any]:
    """A parser for numbers of one type within [lo, hi]; booleans are not numbers."""

    def parse(value: Any) -> Any:
        lossy = convert is int and isinstance(value, float) and not value.is_integer()
        if isinstance(value, bool) or lossy:
            raise ValueError(f"must be {what}, got {shown(value)}")
        try:
            number = convert(value)
        except (TypeError, ValueError):
            raise ValueError(f"must be {what}, got {shown(value)}") from None
        if not lo <= number <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, got {number:g}")
        return number

    return parse


def _seconds(lo: float, hi: float) -> Callable[[Any], float]:
    return _ranged(float, lo, hi, "a number of seconds")


def _count(lo: int, hi: int) -> Callable[[Any], int]:
    return _ranged(int, lo, hi, "a whole number")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {shown(value)}")
    return value


def _path(value: Any) -> str:
    text = _text(value)
    if not text or "\0" in text:
        raise ValueError("must be a non-empty path")
    return text


def parse_listen(value: Any) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces)."""
    text = _text(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"must be HOST:PORT, got {shown(text)}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be 0-65535, got {shown(port)}")
    return host or "0.0.0.0", int(port)


def _log_level(value: Any) -> str:
    text = _text(value).lower()
    if text not in ("debug", "info", "warning", "error"):
        raise ValueError(f"must be debug, info, warning or error, got {shown(value)}")
    return text


def _power_sources(value: Any) -> tuple[str, ...] | None:
    from edgewatt.core.power import SOURCES

    if value == "auto":
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError("must be 'auto' or a list of source names")
    clean = tuple(str(n).strip() for n in names)
    for name in clean:
        if name not in SOURCES:
            raise ValueError(f"unknown power source {shown(name)}; known: {', '.join(SOURCES)}")
    return clean


def _protocol(value: Any) -> str:
    text = _text(value)
    if text not in ("http/protobuf", "grpc"):
        raise ValueError(f"must be http/protobuf or grpc, got {shown(text)}")
    return text


def _headers(value: Any) -> tuple[tuple[str, str], ...]:
    """A mapping, or "k=v,k2=v2" as OTEL_EXPORTER_OTLP_HEADERS writes it."""
    from urllib.parse import unquote

    if isinstance(value, dict):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, str):
        pairs = []
        for item in filter(None, (p.strip() for p in value.split(","))):
            key, sep, val = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"must be KEY=VALUE pairs separated by commas, got {shown(item)}")
            pairs.append((unquote(key.strip()), unquote(val.strip())))
    else:
        raise ValueError("must be a mapping or KEY=VALUE,KEY=VALUE")
    return tuple(pairs)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"must be true or false, got {shown(value)}")


def _endpoint(value: Any) -> str:
    text = _text(value).strip()
    if text and "://" not in text:
        raise ValueError(f"must be a URL such as http://collector:4318, got {shown(text)}")
    return text


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        return None if value is None or value in ("", "none", "auto") else parse(value)

    return optional


@dataclass(frozen=True)
class Key:
    parse: Callable[[Any], Any]  # raises ValueError saying what is wrong
    meaning: str
    live: bool = False  # a SIGHUP applies it; else a change waits for a restart


# The default is the Config field's; the README's table and `edgewatt config example` are
# both rendered from these (a test keeps the README in step), and SIGHUP reads `live`.
KEYS: Mapping[str, Key] = {
    "socket": Key(
        _path,
        "Unix socket of the registration API; unset: /run/edgewatt/edgewatt.sock as root, else "
        "$XDG_RUNTIME_DIR/edgewatt.sock, else edgewatt-$UID/edgewatt.sock in the temp directory",
    ),
    "listen": Key(
        parse_listen,
        "HOST:PORT of the Prometheus /metrics endpoint ([::1]:9464 for IPv6, port 0 picks one)",
    ),
    "interval": Key(
        _seconds(0.05, 3600),
        "seconds between samples (0.05 to 3600)",
        live=True,
    ),
    "min_interval": Key(
        _seconds(0.01, 3600),
        "the shortest interval a monitor may sample its target at: a monitor's read takes a "
        "fresh sample unless the latest is younger than this (0.01 to 3600)",
        live=True,
    ),
    "state_dir": Key(
        _path,
        "where registrations are persisted; unset: /var/lib/edgewatt as root, else "
        "$XDG_STATE_HOME/edgewatt",
    ),
    "max_targets": Key(
        _count(1, 100_000),
        "targets that may run at once (more get HTTP 429); also the most exited ones kept",
        live=True,
    ),
    "max_targets_per_uid": Key(
        _count(1, 100_000),
        "targets one user other than root may have running at once (more get HTTP 429), so "
        "one user cannot take every slot",
        live=True,
    ),
    "history_samples": Key(
        _count(1, 1_000_000),
        "samples kept per target for /samples",
        live=True,
    ),
    "exited_retention": Key(
        _seconds(0, 7 * 86400),
        "seconds an exited target's summary stays readable",
        live=True,
    ),
    "series_rotation": Key(
        _count(1, 1_000_000),
        "with OTLP push: exited targets after which the OTel pipeline is rebuilt (bounded memory)",
        live=True,
    ),
    "exact_exits": Key(
        _boolean,
        "listen to the kernel's exit records and TCP destroy notifications, so a target's "
        "figures end at its exit (needs CAP_NET_ADMIN; false: at the last pass before it)",
    ),
    "follow_forks": Key(
        _boolean,
        "listen to the kernel's process events, so every process a target forks counts "
        "until it exits, wherever it is re-parented (CAP_NET_ADMIN on kernels before "
        "6.6; false: descendants are found by the parent links each pass sees)",
    ),
    "host_name": Key(
        _text,
        "host.name on every series; unset: the kernel's hostname",
    ),
    "proc_path": Key(
        _path,
        "procfs mount point (a host's /proc mounted in a container)",
    ),
    "log_level": Key(
        _log_level,
        "debug, info, warning or error",
        live=True,
    ),
    "power_sources": Key(
        _power_sources,
        "auto, or the sources to use: a YAML list or comma-separated names of ina3221, "
        "tegrastats, tegra_gpu, rapl, nvml, powermetrics (macOS)",
    ),
    "power_sample_hz": Key(
        _optional(_ranged(float, 1, MAX_SAMPLE_HZ, "auto or a rate in Hz")),
        "readings of the power monitors per second, apart from the sampling passes (1 to "
        "1000): INA3221/INA238 sysfs read at it, tegrastats and powermetrics run with the "
        "matching interval; energy counters (RAPL, NVML) are read at every edge instead. "
        "Unset or auto: the highest of 5, 10, 20, 50, 100, 200 Hz whose cost, as the "
        "reader measures it on this device, stays within 0.5 % of one core less what "
        "windows spent at power_window_hz in the last 10 s (down to half of it), chosen "
        f"again every 10 s; tegrastats and powermetrics then at {AUTO_PUSH_HZ:g} Hz",
    ),
    "power_window_hz": Key(
        _ranged(float, 0, MAX_SAMPLE_HZ, "0 or a rate in Hz"),
        "readings of the INA3221/INA238 monitors per second while a window is young (a "
        "phase, a track call or an FL round, for its first 2 s), where above "
        "power_sample_hz; 0: none. Within the same budget as the automatic rate: the "
        "windows spend what the steady rate leaves of it (at most 10 s of it at once); a "
        "window opened with that spent is read at power_sample_hz",
    ),
    "tegrastats": Key(
        _path,
        "the tegrastats executable (flag --tegrastats), run once for the daemon's lifetime",
    ),
    "sysfs_path": Key(
        _path,
        "sysfs mount point (INA3221/INA238 monitors, RAPL)",
    ),
    "idle_power_w": Key(
        _optional(_ranged(float, 0, 100_000, "a number of watts")),
        "the device's idle power in W for attribution; unset: the lowest pass-average seen in "
        "baseline_window",
        live=True,
    ),
    "baseline_window": Key(
        _seconds(1, 30 * 86400),
        "seconds over which idle power is estimated",
        live=True,
    ),
    "carbon_intensity_g_per_kwh": Key(
        carbon.parse_intensity,
        "grid carbon intensity in gCO2e/kWh (flag --carbon-intensity-g-per-kwh); unset: no carbon "
        "figure anywhere, unless carbon_country is set",
    ),
    "carbon_country": Key(
        carbon.parse_country,
        "ISO 3166-1 code (DE, USA, ...) whose yearly average from the shipped table "
        "(core/data/carbon_intensity.json) is used when no intensity is set",
    ),
    "otlp_endpoint": Key(
        _endpoint,
        "collector URL to push OTLP to (flag --otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT); "
        "unset: no push",
    ),
    "otlp_protocol": Key(
        _protocol,
        "http/protobuf or grpc (flag --otlp-protocol, OTEL_EXPORTER_OTLP_PROTOCOL)",
        live=True,
    ),
    "otlp_headers": Key(
        _headers,
        "headers for each export, e.g. auth tokens: a mapping, or k=v,k2=v2 "
        "(OTEL_EXPORTER_OTLP_HEADERS)",
        live=True,
    ),
    "otlp_ca_file": Key(
        _text,
        "CA file for TLS to the collector (OTEL_EXPORTER_OTLP_CERTIFICATE)",
        live=True,
    ),
    "otlp_insecure": Key(
        _boolean,
        "gRPC without TLS (OTEL_EXPORTER_OTLP_INSECURE); for HTTP use an http:// URL",
        live=True,
    ),
    "otlp_interval": Key(
        _seconds(0.1, 86400),
        "seconds between exports (OTEL_METRIC_EXPORT_INTERVAL, in ms there)",
        live=True,
    ),
    "otlp_timeout": Key(
        _seconds(0.1, 60),
        "seconds an export may take before it is dropped (OTEL_EXPORTER_OTLP_TIMEOUT, in ms "
        "there); a collector's 3xx is never followed: that export fails, and its headers go "
        "to the configured endpoint alone",
        live=True,
    ),
    "influx_url": Key(
        _endpoint,
        "InfluxDB to write the figures to over the line protocol, e.g. http://influx:8086 "
        "(INFLUX_HOST); unset: no push",
    ),
    "influx_database": Key(
        _text,
        "1.x database (or 3.x's, through its v1 API): writes go to /write?db= (INFLUX_DATABASE); "
        "unset: the v2 API with influx_org and influx_bucket",
    ),
    "influx_org": Key(_text, "2.x/3.x organization for /api/v2/write (INFLUX_ORG)"),
    "influx_bucket": Key(_text, "2.x/3.x bucket for /api/v2/write (INFLUX_BUCKET)"),
    "influx_token": Key(_text, "2.x/3.x API token, sent as Authorization: Token (INFLUX_TOKEN)"),
    "influx_username": Key(_text, "1.x user, by Basic auth (INFLUX_USERNAME)"),
    "influx_password": Key(_text, "1.x password (INFLUX_PASSWORD)"),
    "influx_interval": Key(
        _seconds(0.1, 86400),
        "seconds between two writes: each carries the latest pass's points and the final "
        "sample of every target that exited since",
    ),
    "influx_timeout": Key(_seconds(0.1, 60), "seconds a write may take before it is retried"),
    "influx_buffer_bytes": Key(
        _count(1 << 20, 1 << 32),
        "bytes of line protocol kept while InfluxDB is unreachable (default 64 MiB; a target's "
        "labels are in each of its lines), each line counted with 48 bytes more for its "
        "keeping; the oldest lines dropped beyond. The old influx_buffer_lines is refused, "
        "naming this key",
    ),
}

# Keys that no longer exist, with what replaced them: named in the error, never ignored.
REPLACED: Mapping[str, str] = {
    "influx_buffer_lines": "influx_buffer_bytes (a bound in lines did not bound memory: a line "
    "carries the target's labels, up to 64 KiB of them)",
}

# The standard OpenTelemetry variables, read like EDGEWATT_* ones (which win over
# them). Intervals and timeouts are milliseconds there, as the spec says.
OTEL_ENVIRONMENT: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": ("otlp_endpoint", str),
    "OTEL_EXPORTER_OTLP_PROTOCOL": ("otlp_protocol", str),
    "OTEL_EXPORTER_OTLP_HEADERS": ("otlp_headers", str),
    "OTEL_EXPORTER_OTLP_CERTIFICATE": ("otlp_ca_file", str),
    "OTEL_EXPORTER_OTLP_INSECURE": ("otlp_insecure", str),
    "OTEL_METRIC_EXPORT_INTERVAL": ("otlp_interval", lambda ms: float(ms) / 1000),
    "OTEL_EXPORTER_OTLP_TIMEOUT": ("otlp_timeout", lambda ms: float(ms) / 1000),
}
# InfluxDB's usual variables (its CLI's and client libraries'), read the same way.
INFLUX_ENVIRONMENT: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "INFLUX_HOST": ("influx_url", str),
    "INFLUX_DATABASE": ("influx_database", str),
    "INFLUX_ORG": ("influx_org", str),
    "INFLUX_BUCKET": ("influx_bucket", str),
    "INFLUX_TOKEN": ("influx_token", str),
    "INFLUX_USERNAME": ("influx_username", str),
    "INFLUX_PASSWORD": ("influx_password", str),
}


def _apply(config: Config, values: Mapping[str, Any], source: str) -> Config:
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key in REPLACED:
            raise ConfigError(f"{key}: no longer a key ({source}); use {REPLACED[key]}")
        if key not in KEYS:
            known = ", ".join(KEYS)
            name = key[:80] if isinstance(key, str) else shown(key)
            raise ConfigError(f"{name}: unknown key ({source}); known keys: {known}")
        try:
            changes[key] = KEYS[key].parse(value)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc} ({source})") from None
    return replace(config, **changes)


# Values a config file may expand to, aliases counted at every use: a few hundred
# bytes of nested aliases ("billion laughs") expand to billions otherwise.
MAX_YAML_VALUES = 10_000


class _Expansion(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _count_values(node, {}, set())
        return node


def _count_values(node: yaml.Node, counted: dict[int, int], open_: set[int]) -> int:
    """Values under ``node`` with every alias expanded, computed once per node (the
    composed graph is small even when its expansion is not)."""
    key = id(node)
    if key in counted:
        return counted[key]
    if key in open_:
        raise _Expansion("a recursive alias (a value that contains itself)")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_count_values(child, counted, open_) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(
            _count_values(k, counted, open_) + _count_values(v, counted, open_)
            for k, v in node.value
        )
    open_.discard(key)
    if total > MAX_YAML_VALUES:
        raise _Expansion(f"aliases expand to more than {MAX_YAML_VALUES} values")
    counted[key] = total
    return total


def load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_BoundedLoader)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except _Expansion as exc:
        raise ConfigError(f"config file {path}: refused: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: refused: values nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {shown(str(exc))}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of keys to values")
    return data


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    names = {key: f"EDGEWATT_{key.upper()}" for key in (*KEYS, *REPLACED)}
    return {key: environ[name] for key, name in names.items() if name in environ}


def build(yaml_path: str | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> Config:
    """Layer the sources in precedence order; flags hold only what was given."""
    config = Config()
    if yaml_path:
        config = _apply(config, load_yaml(yaml_path), f"in {yaml_path}")
    for name, (key, convert) in {**OTEL_ENVIRONMENT, **INFLUX_ENVIRONMENT}.items():
        if environ.get(name):
            try:
                value = convert(environ[name])
            except ValueError:
                bad = shown(environ[name])
                raise ConfigError(f"{key}: bad value {bad} (from {name})") from None
            config = _apply(config, {key: value}, f"from {name}")
    for key, value in from_environment(environ).items():
        config = _apply(config, {key: value}, f"from EDGEWATT_{key.upper()}")
    for key, value in flags.items():
        config = _apply(config, {key: value}, f"from --{key.replace('_', '-')}")
    if config.influx_url and not config.influx_database:
        missing = [k for k in ("influx_org", "influx_bucket") if not getattr(config, k)]
        if missing:
            raise ConfigError(
                f"influx_url: needs influx_database (InfluxDB 1.x) or influx_org and "
                f"influx_bucket (2.x, 3.x); {' and '.join(missing)} unset"
            )
    return config.resolved()


def shown_default(key: str) -> str:
    """A key's default as the docs show it."""
    value = getattr(Config(), key)
    if key == "listen":
        return f"{value[0]}:{value[1]}"
    if value is None or value == "":
        return "unset"
    if value == ():
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown_table() -> str:
    rows = ["| key | default | on SIGHUP | meaning |", "|---|---|---|---|"]
    rows += [
        f"| `{k}` | `{shown_default(k)}` | {'applied' if key.live else 'restart'} | {key.meaning} |"
        for k, key in KEYS.items()
    ]
    return "\n".join(rows) + "\n"
