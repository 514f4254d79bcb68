"""Settings declared once: each is a field of its component's options dataclass, and
its metadata holds the key, the parser, the meaning, whether a SIGHUP applies it, the
standard variables read for it and its ``serve`` flag. The daemon's config (keys,
table, flags, reload) and the client's environment reading are derived from these.
Standard library only: the client imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from edgewatt.core.text import shown

_OPTION = "edgewatt.option"


@dataclass(frozen=True)
class Variable:
    """A standard variable read for a key besides EDGEWATT_<KEY> (which wins over it)."""

    name: str
    convert: Callable[[str], Any] = str  # to what the key's parser takes
    unit: str = ""  # where it differs from the key's, as the docs say it

    def __str__(self) -> str:
        return f"{self.name} (in {self.unit})" if self.unit else self.name


def in_milliseconds(name: str) -> Variable:
    """An OpenTelemetry variable: a duration in ms for a key in seconds."""
    return Variable(name, lambda ms: float(ms) / 1000, "ms")


@dataclass(frozen=True)
class Flag:
    """The key's ``edgewatt serve`` flag: --<key with dashes>."""

    metavar: str
    help: str


@dataclass(frozen=True)
class Option:
    key: str  # the config key, as YAML and EDGEWATT_<KEY> spell it
    parse: Callable[[Any], Any]  # raises ValueError saying what is wrong
    meaning: str
    live: bool = False  # a SIGHUP applies it; else a change waits for a restart
    variables: tuple[Variable, ...] = ()
    flag: Flag | None = None

    @property
    def variable(self) -> str:
        return variable(self.key)

    @property
    def flag_name(self) -> str:
        return "--" + self.key.replace("_", "-")

    def also_set_by(self) -> list[str]:
        """Its flag and standard variables (EDGEWATT_<KEY> goes without saying)."""
        return [self.flag_name] * (self.flag is not None) + [str(v) for v in self.variables]


def variable(key: str) -> str:
    """The environment variable that sets ``key``."""
    return f"EDGEWATT_{key.upper()}"


def option(
    key: str,
    default: Any,
    parse: Callable[[Any], Any],
    meaning: str,
    *,
    live: bool = False,
    variables: tuple[Variable, ...] = (),
    flag: Flag | None = None,
) -> Any:
    """A dataclass field that is a config key (``default`` is its default)."""
    declared = Option(key, parse, meaning, live, variables, flag)
    return dataclasses.field(default=default, metadata={_OPTION: declared})


def declared(cls: type) -> Iterator[tuple[str, Option]]:
    """(field name, its option) for each field of ``cls`` that is a config key."""
    for f in dataclasses.fields(cls):
        if _OPTION in f.metadata:
            yield f.name, f.metadata[_OPTION]


def lookup(cls: type, name: str) -> Option:
    """The option that field ``name`` of ``cls`` declares."""
    [spec] = [spec for field_name, spec in declared(cls) if field_name == name]
    return spec


def from_environment(cls: type, name: str, environ: Mapping[str, str]) -> Any:
    """Field ``name`` of ``cls`` as its EDGEWATT_<KEY> sets it (the default when unset
    or blank), checked by the daemon's own parser: for in-process sampling, where no
    config file is read. ValueError names the variable and the problem."""
    spec = lookup(cls, name)
    value = environ.get(spec.variable, "").strip()
    if not value:
        return getattr(cls(), name)
    try:
        return spec.parse(value)
    except ValueError as exc:
        raise ValueError(f"{spec.variable}={value[:40]!r}: {exc}") from None


# -- parsers: each takes what YAML, a variable or a flag gives and raises ValueError


def ranged(convert: Callable[[Any], Any], lo: float, hi: float, what: str) -> Callable[[Any], Any]:
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


def seconds(lo: float, hi: float) -> Callable[[Any], float]:
    return ranged(float, lo, hi, "a number of seconds")


def count(lo: int, hi: int) -> Callable[[Any], int]:
    return ranged(int, lo, hi, "a whole number")


def optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse``, with None for unset ("", "none", "auto")."""

    def parse_optional(value: Any) -> Any:
        return None if value is None or value in ("", "none", "auto") else parse(value)

    return parse_optional


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {shown(value)}")
    return value


def path(value: Any) -> str:
    checked = text(value)
    if not checked or "\0" in checked:
        raise ValueError("must be a non-empty path")
    return checked


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"must be true or false, got {shown(value)}")


def endpoint(value: Any) -> str:
    url = text(value).strip()
    if url and "://" not in url:
        raise ValueError(f"must be a URL such as http://collector:4318, got {shown(url)}")
    return url


def choice(*allowed: str) -> Callable[[Any], str]:
    """One of ``allowed``, as written."""
    said = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]

    def parse(value: Any) -> str:
        chosen = text(value)
        if chosen not in allowed:
            raise ValueError(f"must be {said}, got {shown(chosen)}")
        return chosen

    return parse


def headers(value: Any) -> tuple[tuple[str, str], ...]:
    """A mapping, or "k=v,k2=v2" as OTEL_EXPORTER_OTLP_HEADERS writes it."""
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
