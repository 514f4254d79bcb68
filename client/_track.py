"""``client.track``: energy, carbon and duration per call of a function or block.

Built on the phase API (each call is one phase of this process's registration, run
inside whatever phase runs: it never ends that one), as CodeCarbon's
``track_emissions`` and Zeus's measurement windows are used:

    @client.track("train_step")
    def train_step(batch): ...

    with client.track("evaluate") as t:
        evaluate()
    print(t.last)  # Measurement(name='evaluate', duration_s=..., energy_j=..., carbon_g=...)

The energy is what the daemon attributes to this process during the call (J above
the device's idle power, docs/attribution.md), and ``device_energy_j`` what the
device's sensors measured over it, read at the sensor's rate and interpolated to each
edge; carbon is present only when a grid intensity is configured. Entering and
leaving a call each take one sample (a pass the daemon runs at once, under a ms), so a
call shorter than the sampling interval still gets its CPU time exactly; nothing waits
for the next regular pass, nor for a power reading: where the reading after the call's
end has not come yet (tegrastats prints once a period), the measurement says
``final=False`` and the registration's ``summary(final_wait_s=...)`` gives the final
figures.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import typing
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from edgewatt.client import Registration

log = logging.getLogger(__name__)

F = TypeVar("F", bound=typing.Callable[..., Any])  # 3.8: abc.Callable takes no [...]

# One registration for every track() of the process that is given none, created on
# first use: a process is one target, and its phases follow each other.
_shared: dict[str, Registration] = {}
_shared_lock = threading.Lock()


def _shared_registration() -> Registration:
    with _shared_lock:
        if "registration" not in _shared:
            from edgewatt.client import register

            _shared["registration"] = register(labels={})
        return _shared["registration"]


class Measurement(NamedTuple):  # a NamedTuple: dataclasses would cost the import ~6 ms
    name: str
    duration_s: float  # wall time of the call
    energy_j: float | None  # energy attributed to the process during the call
    carbon_g: float | None  # gCO2e of that energy; None without a configured intensity
    cpu_s: float | None = None  # CPU seconds (user + system) of the process in the call
    # What the device's sensors measured over the call (the whole device, J), and
    # whether the call was shorter than their period (then it is interpolated).
    device_energy_j: float | None = None
    shorter_than_sensor_period: bool | None = None
    # The device's highest power during the call (W), from every reading of its sensor.
    power_max_w: float | None = None
    # False: device_energy_j holds the last power past the sensor's last reading (the
    # reading after the call has not come); the summary's phase item becomes final.
    final: bool | None = None


class track:  # lower case: it reads as a decorator, like functools.wraps
    """Measure each call of a function (decorator) or each run of a block (``with``)."""

    def __init__(self, name: str, registration: Registration | None = None) -> None:
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ValueError("track name must be a string of 1 to 128 characters")
        self.name = name
        self.registration = registration
        self.measurements: deque[Measurement] = deque(maxlen=1000)
        self._started = 0.0
        self._depth: int | None = None  # the running call's phase's

    @property
    def last(self) -> Measurement | None:
        return self.measurements[-1] if self.measurements else None

    def __enter__(self) -> track:
        if self.registration is None:
            self.registration = _shared_registration()
        self._depth = self.registration.window(self.name)
        if self._depth is not None:  # what starts inside the call runs inside it
            self.registration._enter(self._depth)
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        duration = time.monotonic() - self._started
        registration, depth = self.registration, self._depth
        phase: dict[str, Any] = {}
        if depth is not None:  # its figures, from the closing sample
            registration._leave(depth)
            phase = registration.end_phase(depth) or {}
        user, system = phase.get("cpu_user_s"), phase.get("cpu_system_s")
        measurement = Measurement(
            name=self.name,
            duration_s=round(duration, 6),
            energy_j=phase.get("energy_j"),
            carbon_g=phase.get("carbon_g"),
            cpu_s=None if user is None or system is None else round(user + system, 6),
            device_energy_j=phase.get("device_energy_j"),
            shorter_than_sensor_period=phase.get("shorter_than_sensor_period"),
            power_max_w=phase.get("power_max_w"),
            final=phase.get("final"),
        )
        self.measurements.append(measurement)
        log.info(
            "edgewatt: %s took %.3f s, %s s CPU, %s J, %s gCO2e",
            self.name,
            duration,
            measurement.cpu_s,
            measurement.energy_j,
            measurement.carbon_g,
        )

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        wrapper.track = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
