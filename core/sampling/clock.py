"""Where the sampler reads the time and waits for it: a seam, so that a pass and the
cadence of passes are tested without sleeping."""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """The wall clock (unix seconds: samples, exits, purges), the monotonic one (a
    pass's start, the power reader's edges) and the wait between passes (until the
    event is set or the seconds have passed; whether it was set); function fields,
    replaced in tests."""

    time: Callable[[], float] = _time.time
    monotonic: Callable[[], float] = _time.monotonic
    wait: Callable[[threading.Event, float], bool] = threading.Event.wait
