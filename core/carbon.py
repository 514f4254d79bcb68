"""Carbon beside energy: emissions = grid carbon intensity x energy (CodeCarbon's rule).

An intensity is only ever one the user chose: a value (``carbon_intensity_g_per_kwh``)
or a country whose yearly average the shipped table holds (``carbon_country``, ISO
3166-1 alpha-2 or alpha-3). Without either there is no carbon figure anywhere, never
a default one. Standard library only: the client uses it too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgewatt.core import options
from edgewatt.core.options import Flag, option
from edgewatt.core.text import shown

log = logging.getLogger(__name__)

J_PER_KWH = 3.6e6
TABLE = Path(__file__).with_name("data") / "carbon_intensity.json"


@dataclass(frozen=True)
class CarbonIntensity:
    g_per_kwh: float  # gCO2e per kWh
    source: str  # where the figure comes from, shown next to it

    def grams(self, energy_j: float) -> float:
        """gCO2e of ``energy_j`` joules."""
        return energy_j / J_PER_KWH * self.g_per_kwh


@lru_cache(maxsize=None)  # functools.cache is 3.9+
def countries() -> dict[str, dict[str, Any]]:
    """The shipped table, by alpha-3 code: name, alpha2, g_per_kwh, year, source."""
    return json.loads(TABLE.read_text())["countries"]


def country(code: str) -> CarbonIntensity:
    """The table's figure for an ISO 3166-1 alpha-2 or alpha-3 code; ValueError names
    the codes it knows when it has none for this one."""
    wanted = code.strip().upper()
    for alpha3, entry in countries().items():
        if wanted in (alpha3, entry["alpha2"]):
            return CarbonIntensity(
                entry["g_per_kwh"],
                f"{entry['name']} {entry['year']} average, {entry['source']}",
            )
    known = ", ".join(sorted(e["alpha2"] for e in countries().values()))
    raise ValueError(f"no carbon intensity for country {shown(code)} (the table has {known})")


def resolve_carbon(g_per_kwh: float | None, country_code: str | None) -> CarbonIntensity | None:
    """The configured value wins over the country's; None when neither is set."""
    if g_per_kwh is not None:
        return CarbonIntensity(g_per_kwh, "configured (carbon_intensity_g_per_kwh)")
    if country_code:
        return country(country_code)
    return None


MAX_G_PER_KWH = 5000.0  # above any grid's yearly average


def parse_intensity(value: Any) -> float | None:
    """The ``carbon_intensity_g_per_kwh`` setting: gCO2e/kWh in [0, 5000], or None when
    unset ("", "none", "auto"). ValueError says what is wrong."""
    if value is None or value in ("", "none", "auto"):
        return None
    if isinstance(value, bool):
        raise ValueError(f"must be gCO2e per kWh, got {shown(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be gCO2e per kWh, got {shown(value)}") from None
    if not 0 <= number <= MAX_G_PER_KWH:
        raise ValueError(f"must be between 0 and {MAX_G_PER_KWH:g}, got {number:g}")
    return number


def parse_country(value: Any) -> str:
    """The ``carbon_country`` setting: "" (none) or a code the shipped table has."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {shown(value)}")
    text = value.strip()
    if text:
        country(text)  # ValueError naming the codes the table has
    return text


@dataclass(frozen=True)
class CarbonOptions:
    """The daemon's carbon keys; the client reads them from the same variables."""

    g_per_kwh: float | None = option(
        "carbon_intensity_g_per_kwh",
        None,  # no carbon figures
        parse_intensity,
        "grid carbon intensity in gCO2e/kWh; unset: no carbon figure anywhere, unless "
        "carbon_country is set",
        flag=Flag("G", "grid carbon intensity in gCO2e/kWh (default: none, no carbon figures)"),
    )
    country: str = option(
        "carbon_country",
        "",  # none; an ISO 3166-1 code of the shipped table
        parse_country,
        "ISO 3166-1 code (DE, USA, ...) whose yearly average from the shipped table "
        "(core/data/carbon_intensity.json) is used when no intensity is set",
    )

    def resolve(self) -> CarbonIntensity | None:
        return resolve_carbon(self.g_per_kwh, self.country)


def from_environment(environ: Mapping[str, str] = os.environ) -> CarbonIntensity | None:
    """The intensity the daemon's variables set (EDGEWATT_CARBON_INTENSITY_G_PER_KWH,
    EDGEWATT_CARBON_COUNTRY), checked by the daemon's own parsers, for the client's
    in-process sampling. A bad value is logged and ignored: monitoring never raises
    into the caller."""
    try:
        names = [name for name, _ in options.declared(CarbonOptions)]
        read = {name: options.from_environment(CarbonOptions, name, environ) for name in names}
        return CarbonOptions(**read).resolve()
    except ValueError as exc:
        log.warning("edgewatt: no carbon figures: %s", exc)
        return None
