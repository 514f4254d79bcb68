"""Where the sampler reads the time: a seam, so that a pass is tested without sleeping."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """The wall clock (unix seconds: samples, exits, purges) and the monotonic one
    (a pass's start, the power reader's edges); function fields, replaced in tests."""

    time: Callable[[], float] = _time.time
    monotonic: Callable[[], float] = _time.monotonic
