"""The daemon's config keys, each declared once: a field of its component's options
dataclass carrying its key, default, parser, meaning, standard variables, flag and
whether SIGHUP applies it (core/options.py). The daemon's components are here; those
the client reads too are in core, beside the code that uses them (``PowerOptions`` in
core/power/source.py, ``CarbonOptions`` in core/carbon.py). ``Config`` holds one of
each; ``KEYS`` and ``WHERE`` index them by key. Loading and rendering: config.py.
Light to import (no OpenTelemetry): ``doctor`` and ``config example`` load it under
the system's Python.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from edgewatt.core import options as opt
from edgewatt.core.carbon import CarbonOptions
from edgewatt.core.options import Flag, Option, Variable, option
from edgewatt.core.persons import SUBUID
from edgewatt.core.platforms.board import Roots
from edgewatt.core.power.source import PowerOptions
from edgewatt.core.targets.access import Limits
from edgewatt.core.text import shown
from edgewatt.core.transport import default_socket


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/edgewatt"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return os.path.join(base, "edgewatt")


def parse_listen(value: Any) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces)."""
    text = opt.text(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"must be HOST:PORT, got {shown(text)}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be 0-65535, got {shown(port)}")
    return host or "0.0.0.0", int(port)


def _log_level(value: Any) -> str:
    text = opt.text(value).lower()
    if text not in ("debug", "info", "warning", "error"):
        raise ValueError(f"must be debug, info, warning or error, got {shown(value)}")
    return text


@dataclass(frozen=True)
class EndpointOptions:
    """Where the daemon answers: the registration API and /metrics."""

    socket: str = option(
        "socket",
        "",  # default_socket()
        opt.path,
        "Unix socket of the registration API; unset: /run/edgewatt/edgewatt.sock as root, else "
        "$XDG_RUNTIME_DIR/edgewatt.sock, else edgewatt-$UID/edgewatt.sock in the temp directory",
        flag=Flag("PATH", "Unix socket of the registration API"),
    )
    listen: tuple[str, int] = option(
        "listen",
        ("0.0.0.0", 9464),
        parse_listen,
        "HOST:PORT of the Prometheus /metrics endpoint ([::1]:9464 for IPv6, port 0 picks one)",
        flag=Flag("HOST:PORT", "Prometheus endpoint (default 0.0.0.0:9464)"),
    )
    min_interval: float = option(
        "min_interval",
        0.1,
        opt.seconds(0.01, 3600),
        "the shortest interval a monitor may sample its target at: a monitor's read takes a "
        "fresh sample unless the latest is younger than this (0.01 to 3600)",
        live=True,
    )


@dataclass(frozen=True)
class SamplerOptions:
    """The sampling passes, and how the device's power is attributed in them."""

    interval: float = option(
        "interval",
        1.0,
        opt.seconds(0.05, 3600),
        "seconds between samples (0.05 to 3600)",
        live=True,
        flag=Flag("SECONDS", "seconds between samples (default 1)"),
    )
    exact_exits: bool = option(
        "exact_exits",
        True,
        opt.boolean,
        "listen to the kernel's exit records and TCP destroy notifications, so a target's "
        "figures end at its exit (needs CAP_NET_ADMIN; false: at the last pass before it)",
    )
    follow_forks: bool = option(
        "follow_forks",
        True,
        opt.boolean,
        "listen to the kernel's process events, so every process a target forks counts "
        "until it exits, wherever it is re-parented (CAP_NET_ADMIN on kernels before "
        "6.6; false: descendants are found by the parent links each pass sees)",
    )
    idle_power_w: float | None = option(
        "idle_power_w",
        None,  # estimated from the measurements
        opt.optional(opt.ranged(float, 0, 100_000, "a number of watts")),
        "the device's idle power in W for attribution; unset: the lowest pass-average seen in "
        "baseline_window",
        live=True,
    )
    baseline_window: float = option(
        "baseline_window",
        3600.0,
        opt.seconds(1, 30 * 86400),
        "seconds over which idle power is estimated",
        live=True,
    )


@dataclass(frozen=True)
class TargetOptions:
    state_dir: str = option(
        "state_dir",
        "",  # default_state_dir()
        opt.path,
        "where registrations are persisted; unset: /var/lib/edgewatt as root, else "
        "$XDG_STATE_HOME/edgewatt",
        flag=Flag("DIR", "where registrations are persisted"),
    )
    state_write_budget: int = option(
        "state_write_budget",
        16 << 20,
        opt.count(1 << 20, 1 << 40),
        "bytes an hour the daemon may write to state_dir (default 16 MiB; at most 1.5 times "
        "it in any hour, plus one rewrite of the live set): one user (a person) 1/8 of it, "
        "users together 3/4, root any of it but the users' part in use; past her share, "
        "a person's changes are answered and kept in memory, and written as it refills",
    )
    max_targets: int = option(
        "max_targets",
        1000,
        opt.count(1, 100_000),
        "targets that may run at once (more get HTTP 429), a tenth of them root's alone; also "
        "the most exited ones kept",
        live=True,
    )
    max_targets_per_uid: int = option(
        "max_targets_per_uid",
        100,
        opt.count(1, 100_000),
        "targets one user (a person: her subordinate uids are hers, subuid_path) other than "
        "root may have running at once (more get HTTP 429), so one user cannot take every "
        "slot; also the most of hers kept exited",
        live=True,
    )
    history_samples: int = option(
        "history_samples",
        300,
        opt.count(1, 1_000_000),
        "samples kept per target for /samples",
        live=True,
    )
    exited_retention: float = option(
        "exited_retention",
        600.0,
        opt.seconds(0, 7 * 86400),
        "seconds an exited target's summary stays readable",
        live=True,
    )

    def limits(self) -> Limits:
        """The target table's bounds these options set (at start and on each reload)."""
        return Limits(
            max_targets=self.max_targets,
            max_targets_per_uid=self.max_targets_per_uid,
            history_samples=self.history_samples,
            exited_retention_s=self.exited_retention,
        )


@dataclass(frozen=True)
class DaemonOptions:
    """The daemon as a whole: what it calls this host, where it reads procfs, its log."""

    host_name: str = option(
        "host_name",
        "",  # the kernel's hostname
        opt.text,
        "host.name on every series; unset: the kernel's hostname",
    )
    proc_path: str = option(
        "proc_path",
        "/proc",
        opt.path,
        "procfs mount point (a host's /proc mounted in a container)",
    )
    subuid_path: str = option(
        "subuid_path",
        SUBUID,
        opt.path,
        "the users' subordinate uid ranges (useradd's, newuidmap's): a uid in a user's range "
        "counts in her shares (connections, targets), as she may run as any of them in a user "
        "namespace of her own; re-read when it changes; a file that is not there: none",
    )
    etc_path: str = option(
        "etc_path",
        "/etc",
        opt.path,
        "where /etc is read (nv_tegra_release: the Jetson's L4T release), e.g. a host's "
        "/etc mounted in a container",
    )
    context_interval: float = option(
        "context_interval",
        10.0,
        opt.seconds(1, 3600),
        "seconds between reads of the device's context (power mode, clocks and their "
        "limits, throttling, temperature; a read runs nvpmodel or vcgencmd where they "
        "are on the daemon's PATH): a change is an event in the summaries of the targets "
        "running then, dated to within this",
    )
    log_level: str = option(
        "log_level",
        "info",
        _log_level,
        "debug, info, warning or error",
        live=True,
        flag=Flag("LEVEL", "debug, info, warning or error"),
    )


@dataclass(frozen=True)
class OtlpOptions:
    """The OTLP push's keys (the standard OTEL_* variables read for them too)."""

    endpoint: str = option(
        "otlp_endpoint",
        "",  # no OTLP push
        opt.endpoint,
        "collector URL to push OTLP to; unset: no push",
        variables=(Variable("OTEL_EXPORTER_OTLP_ENDPOINT"),),
        flag=Flag("URL", "push metrics over OTLP to URL"),
    )
    protocol: str = option(
        "otlp_protocol",
        "http/protobuf",
        opt.choice("http/protobuf", "grpc"),
        "http/protobuf or grpc",
        live=True,
        variables=(Variable("OTEL_EXPORTER_OTLP_PROTOCOL"),),
        flag=Flag("P", "http/protobuf (default) or grpc"),
    )
    # Pairs as the config holds them (a mapping is taken too)
    headers: tuple[tuple[str, str], ...] | Mapping[str, str] = option(
        "otlp_headers",
        (),
        opt.headers,
        "headers for each export, e.g. auth tokens: a mapping, or k=v,k2=v2",
        live=True,
        variables=(Variable("OTEL_EXPORTER_OTLP_HEADERS"),),
    )
    ca_file: str = option(
        "otlp_ca_file",
        "",
        opt.text,
        "CA file for TLS to the collector",
        live=True,
        variables=(Variable("OTEL_EXPORTER_OTLP_CERTIFICATE"),),
    )
    insecure: bool = option(  # gRPC: plaintext. HTTP: use an http:// endpoint instead
        "otlp_insecure",
        False,
        opt.boolean,
        "gRPC without TLS; for HTTP use an http:// URL",
        live=True,
        variables=(Variable("OTEL_EXPORTER_OTLP_INSECURE"),),
    )
    interval_s: float = option(
        "otlp_interval",
        60.0,
        opt.seconds(0.1, 86400),
        "seconds between exports",
        live=True,
        variables=(opt.in_milliseconds("OTEL_METRIC_EXPORT_INTERVAL"),),
    )
    timeout_s: float = option(
        "otlp_timeout",
        5.0,
        opt.seconds(0.1, 60),
        "seconds an export may take before it is dropped; a collector's 3xx is never "
        "followed: that export fails, and its headers go to the configured endpoint alone",
        live=True,
        variables=(opt.in_milliseconds("OTEL_EXPORTER_OTLP_TIMEOUT"),),
    )
    series_rotation: int = option(  # telemetry.py's, not the exporter's
        "series_rotation",
        200,
        opt.count(1, 1_000_000),
        "with OTLP push: exited targets after which the OTel pipeline is rebuilt (bounded memory)",
        live=True,
    )


def _influx_text(name: str, meaning: str) -> Any:
    """The text key influx_<name>, unset by default, also set by INFLUX_<NAME> (as
    InfluxDB's CLI and client libraries read it)."""
    return option(
        f"influx_{name}", "", opt.text, meaning, variables=(Variable(f"INFLUX_{name.upper()}"),)
    )


@dataclass(frozen=True)
class InfluxOptions:
    """The InfluxDB push's keys (InfluxDB's usual INFLUX_* variables read for them too)."""

    url: str = option(
        "influx_url",
        "",  # no InfluxDB push; else http(s)://host:8086
        opt.endpoint,
        "InfluxDB to write the figures to over the line protocol, e.g. http://influx:8086; "
        "unset: no push",
        variables=(Variable("INFLUX_HOST"),),
    )
    database: str = _influx_text(  # 1.x: /write?db=; else the v2 API with org and bucket
        "database",
        "1.x database (or 3.x's, through its v1 API): writes go to /write?db=; "
        "unset: the v2 API with influx_org and influx_bucket",
    )
    org: str = _influx_text("org", "2.x/3.x organization for /api/v2/write")
    bucket: str = _influx_text("bucket", "2.x/3.x bucket for /api/v2/write")
    token: str = _influx_text("token", "2.x/3.x API token, sent as Authorization: Token")
    username: str = _influx_text("username", "1.x user, by Basic auth")
    password: str = _influx_text("password", "1.x password")
    interval_s: float = option(
        "influx_interval",
        10.0,
        opt.seconds(0.1, 86400),
        "seconds between two writes: each carries the latest pass's points and the final "
        "sample of every target that exited since",
    )
    timeout_s: float = option(
        "influx_timeout",
        5.0,
        opt.seconds(0.1, 60),
        "seconds a write may take before it is retried",
    )
    buffer_bytes: int = option(
        "influx_buffer_bytes",
        64 << 20,
        opt.count(1 << 20, 1 << 32),
        "bytes of line protocol kept while InfluxDB is unreachable (default 64 MiB; a target's "
        "labels are in each of its lines), each line counted with 48 bytes more for its "
        "keeping; the oldest lines dropped beyond. The old influx_buffer_lines is refused, "
        "naming this key",
    )


@dataclass(frozen=True)
class Config:
    """One options dataclass per component; ``config.<key>`` reads a key where it lives."""

    endpoints: EndpointOptions = field(default_factory=EndpointOptions)
    sampler: SamplerOptions = field(default_factory=SamplerOptions)
    targets: TargetOptions = field(default_factory=TargetOptions)
    daemon: DaemonOptions = field(default_factory=DaemonOptions)
    power: PowerOptions = field(default_factory=PowerOptions)
    carbon: CarbonOptions = field(default_factory=CarbonOptions)
    otlp: OtlpOptions = field(default_factory=OtlpOptions)
    influx: InfluxOptions = field(default_factory=InfluxOptions)

    def __getattr__(self, key: str) -> Any:
        # Only called for names that are not attributes: the keys.
        where = WHERE.get(key)
        if where is None:
            raise AttributeError(f"{type(self).__name__} has no key {key!r}")
        return getattr(getattr(self, where[0]), where[1])

    def with_values(self, values: Mapping[str, Any]) -> Config:
        """A copy with these keys set to these (parsed) values."""
        changes: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            component, name = WHERE[key]
            changes.setdefault(component, {})[name] = value
        return replace(self, **{c: replace(getattr(self, c), **kw) for c, kw in changes.items()})

    def roots(self) -> Roots:
        """Where the device's context is read (core/platforms/context.py): the configured trees,
        the executables on this process's PATH."""
        return Roots(sysfs=self.sysfs_path, proc=self.proc_path, etc=self.etc_path)

    def resolved(self) -> Config:
        return self.with_values(
            {
                "socket": self.socket or default_socket(),
                "state_dir": self.state_dir or default_state_dir(),
                "host_name": self.host_name or socket.gethostname(),
            }
        )


def _declarations() -> dict[str, tuple[str, str, Option]]:
    found: dict[str, tuple[str, str, Option]] = {}
    for component in fields(Config):
        for name, declared in opt.declared(component.default_factory):  # type: ignore[arg-type]
            assert declared.key not in found, f"{declared.key} declared twice"
            found[declared.key] = (component.name, name, declared)
    return found


_DECLARED = _declarations()
# key -> (the Config field of its component, its field there)
WHERE: Mapping[str, tuple[str, str]] = {k: (c, n) for k, (c, n, _) in _DECLARED.items()}
# key -> its declaration: parser, meaning, live, variables, flag. The README's table
# and `edgewatt config example` are rendered from these (a test keeps the README in
# step), SIGHUP reads `live`, `serve` adds each `flag`.
KEYS: Mapping[str, Option] = {k: declared for k, (_, _, declared) in _DECLARED.items()}
