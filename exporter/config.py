"""Daemon configuration: defaults < YAML file < OTEL_* / INFLUX_* < EDGEWATT_* environment < flags.

The keys are declared in keys.py (one options dataclass per component); here they
are loaded from each source in that order, and rendered for the docs. A bad value
raises :class:`ConfigError` naming the key, where it came from, and the problem.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import yaml

from edgewatt.core import options as opt
from edgewatt.core.text import shown
from edgewatt.core.transport import default_socket
from edgewatt.exporter.keys import KEYS, WHERE, Config, default_state_dir

__all__ = ["KEYS", "WHERE", "Config", "ConfigError", "build", "default_socket", "default_state_dir"]


class ConfigError(ValueError):
    pass


# Keys that no longer exist, with what replaced them: named in the error, never ignored.
REPLACED: Mapping[str, str] = {
    "influx_buffer_lines": "influx_buffer_bytes (a bound in lines did not bound memory: a line "
    "carries the target's labels, up to 64 KiB of them)",
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
    return config.with_values(changes)


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
    names = {key: opt.variable(key) for key in (*KEYS, *REPLACED)}
    return {key: environ[name] for key, name in names.items() if name in environ}


def build(yaml_path: str | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> Config:
    """Layer the sources in precedence order; flags hold only what was given."""
    config = Config()
    if yaml_path:
        config = _apply(config, load_yaml(yaml_path), f"in {yaml_path}")
    # The standard OpenTelemetry and InfluxDB variables a key declares, read like
    # EDGEWATT_* ones (which win over them).
    for key, declared in KEYS.items():
        for variable in declared.variables:
            if environ.get(variable.name):
                try:
                    value = variable.convert(environ[variable.name])
                except ValueError:
                    bad = shown(environ[variable.name])
                    raise ConfigError(f"{key}: bad value {bad} (from {variable.name})") from None
                config = _apply(config, {key: value}, f"from {variable.name}")
    for key, value in from_environment(environ).items():
        config = _apply(config, {key: value}, f"from {opt.variable(key)}")
    for key, value in flags.items():
        config = _apply(config, {key: value}, f"from {KEYS[key].flag_name}")
    if config.influx_url and not config.influx_database:
        missing = [k for k in ("influx_org", "influx_bucket") if not getattr(config, k)]
        if missing:
            raise ConfigError(
                f"influx_url: needs influx_database (InfluxDB 1.x) or influx_org and "
                f"influx_bucket (2.x, 3.x); {' and '.join(missing)} unset"
            )
    return config.resolved()


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` flags: one per key that declares one."""
    for key, declared in KEYS.items():
        if declared.flag is not None:
            parser.add_argument(
                declared.flag_name, dest=key, metavar=declared.flag.metavar, help=declared.flag.help
            )


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The keys the ``serve`` flags set (those given only)."""
    return {
        key: getattr(args, key)
        for key, declared in KEYS.items()
        if declared.flag is not None and getattr(args, key, None) is not None
    }


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
    rows = ["| key | default | on SIGHUP | also set by | meaning |", "|---|---|---|---|---|"]
    for k, key in KEYS.items():
        also = ", ".join(f"`{name}`" for name in key.also_set_by())
        live = "applied" if key.live else "restart"
        rows.append(f"| `{k}` | `{shown_default(k)}` | {live} | {also} | {key.meaning} |")
    return "\n".join(rows) + "\n"
