"""Which in-process sampler runs when no daemon answers: procfs (Linux, the daemon's
own reader) or psutil (wherever /proc is absent: macOS, Windows, BSD).

``EDGEWATT_CLIENT_BACKEND=procfs|psutil`` forces one (the test suite runs the client
tests under both). Standard library only: imported by client/_local.py when needed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

ENV = "EDGEWATT_CLIENT_BACKEND"
BACKENDS = ("procfs", "psutil")


def choose(environ: Mapping[str, str] = os.environ) -> str:
    """The forced backend if valid, else procfs where /proc shows this process."""
    forced = environ.get(ENV, "").strip().lower()
    if forced in BACKENDS:
        return forced
    if forced:
        log.warning("edgewatt: %s=%r is not one of %s; choosing by platform", ENV, forced, BACKENDS)
    proc = environ.get("EDGEWATT_PROC_PATH") or "/proc"
    linux = sys.platform.startswith("linux")
    return "procfs" if linux and os.path.exists(os.path.join(proc, "self", "stat")) else "psutil"
