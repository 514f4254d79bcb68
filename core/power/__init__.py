"""Power sources, registered in one place: adding a sensor means adding one module
with a ``discover(options)`` that returns a source or raises NoData, and its name in
``source.SOURCE_NAMES`` (the module's name, in discovery order).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, MutableMapping

from edgewatt.core.power.source import (
    SOURCE_NAMES,
    CannotMeasure,
    NoData,
    PowerOptions,
    PowerSource,
)

log = logging.getLogger(__name__)

# In discovery order (SOURCE_NAMES). A Jetson's INA3221 monitors are preferred to
# tegrastats (no child process, no root): with the default selection tegrastats runs
# only where no board source was found, and the GPU's load file is read where the
# INA3221s are (tegrastats prints the same load, GR3D). pi5 needs vcgencmd on PATH;
# powermetrics is macOS's only source.
SOURCES: dict[str, Callable[[PowerOptions], PowerSource]] = {
    name: importlib.import_module(f"{__name__}.{name}").discover for name in SOURCE_NAMES
}


def discover(
    options: PowerOptions, aside: MutableMapping[str, str] | None = None
) -> list[PowerSource]:
    """The sources present here; absent hardware is normal and only logged at info. A
    source that loads but cannot measure steps aside with a warning, and its reason
    goes into ``aside`` (for /healthz and doctor)."""
    automatic = options.sources is None
    found: list[PowerSource] = []
    for name in options.sources or tuple(SOURCES):
        if automatic and name == "tegrastats" and any(s.board for s in found):
            continue
        if automatic and name == "tegra_gpu" and not any(s.name == "ina3221" for s in found):
            continue
        try:
            source = SOURCES[name](options)
        except CannotMeasure as exc:
            log.warning("power source %s: loads but cannot measure, stepping aside: %s", name, exc)
            if aside is not None:
                aside[name] = str(exc)
            continue
        except NoData as exc:
            log.info("power source %s: not used (%s)", name, exc)
            continue
        log.info("power source %s: found", name)
        found.append(source)
    if not found:
        log.info("no power source found: power and energy metrics are absent")
    return found
