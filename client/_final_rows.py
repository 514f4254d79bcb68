"""A JSON Lines file's sample rows with their device energy final.

A reading's device energy is the sampler's as known at its pass: past a push source's
last line (tegrastats, powermetrics) its last power held. A row is therefore held back
until the energy at both of its readings is settled (the power reading after its end
has come: a lag of one power reading, plus the interval it is noticed in), then
written with the trace's integral over it; the phase marks after it keep their place
behind it. The newest row waits for the next reading in any case: a reading a quarter
of an interval after it (stop() just after a sample) is merged into it, and the file
holds the rows the monitor's summary counts. At the end, the rows still held are
waited for at most FINAL_WAIT_S, and a row whose reading never came is written as it
was, marked ``"final": false``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

from edgewatt.client._samples import Reading
from edgewatt.core import transport

log = logging.getLogger(__name__)

# How long the last rows wait for the power reading after them: `edgewatt run`'s wait
# for its final summary (POWER_FINAL_WAIT_S), a reading a second at tegrastats' own rate.
FINAL_WAIT_S = 3.0

# The device's energy at each reading once final (None: not yet), waiting at most the
# seconds given for them. typing's aliases: evaluated at run time, on Python 3.8 too.
Settle = Callable[[List[Reading], float], List[Optional[float]]]


class FinalRows:
    """The rows and phase marks for ``sink``, in order, each sample row written once its
    energy is final (``settle``); passed straight on where the sink keeps no energy
    (``sink.final_rows`` false: heflwr's text, the live sinks) or a row has none."""

    def __init__(self, sink: Any, settle: Settle) -> None:
        self._sink = sink
        self._settle = settle
        self._holds = bool(getattr(sink, "final_rows", False))
        # ["sample", sample, start, end] or ["phase", name, at], oldest first.
        self._held: list[list[Any]] = []

    def sample(self, sample: dict[str, Any], start: Reading, end: Reading) -> None:
        """A row over the interval from ``start`` to ``end``."""
        if not self._held and not self._holds:
            self._sink.sample(sample, end)
        else:
            self._held.append(["sample", sample, start, end])

    def extend(self, sample: dict[str, Any], end: Reading) -> None:
        """The last row now ends at ``end`` (a short reading merged into it): still held
        where the sink holds rows; one already written (heflwr's text, the live sinks)
        stays as it was."""
        if self._held and self._held[-1][0] == "sample":
            self._held[-1][1], self._held[-1][3] = sample, end

    def phase(self, name: str, at: float) -> None:
        if not self._held:
            self._sink.phase(name, at)
        else:
            self._held.append(["phase", name, at])

    def flush(self, wait_s: float = 0.0, last: bool = False) -> None:
        """Write the rows whose energy is final now (waiting at most ``wait_s`` for
        them); ``last``: every row, one not final marked so."""
        held = self._held
        if not held:
            return
        readings = [r for entry in held if entry[0] == "sample" for r in entry[2:]]
        try:
            energies = self._settle(readings, wait_s)
        except (OSError, transport.DaemonError) as exc:  # the daemon lost: said at the end
            log.debug("settling the rows' energy: %s", exc)
            energies = [None] * len(readings)
        found = iter(energies)
        settled = [
            (next(found), next(found)) if entry[0] == "sample" else (None, None) for entry in held
        ]
        # Rows settle oldest first: one held behind a settled row (or one with no
        # energy: the source silent beyond its gap) never will (its readings another
        # sampler's, the daemon lost mid-run; the source's first line never came), nor
        # will any at the end.
        done = [
            i
            for i, (entry, (a, b)) in enumerate(zip(held, settled))
            if entry[0] == "sample" and ("energy_j" not in entry[1] or None not in (a, b))
        ]
        given_up = len(held) if last else (done[-1] if done else 0)
        # The newest row, where no phase mark follows it, may yet be extended.
        newest = len(held) - 1 if self._holds and not last and held[-1][0] == "sample" else None
        written = 0
        for i, entry in enumerate(held):
            if i == newest:
                break
            if entry[0] == "phase":
                self._sink.phase(entry[1], entry[2])
            else:
                sample, end = entry[1], entry[3]
                begin_j, end_j = settled[i]
                if "energy_j" not in sample:
                    pass  # nothing to settle
                elif begin_j is not None and end_j is not None:
                    sample["energy_j"] = end_j - begin_j  # in place: the monitor's too
                elif i < given_up:
                    sample["final"] = False
                else:
                    break
                self._sink.sample(sample, end)
            written += 1
        del held[:written]


def settled_energies(registration: Any, readings: list[Reading], wait_s: float) -> list[Any]:
    """Each reading's device energy once final, by whatever sampled it: the in-process
    sampler's power trace, or the daemon's rows (GET samples: each says whether it is
    final); None for a reading another sampler took (the daemon lost mid-run) or not
    final yet."""
    backend = registration.backend if registration is not None else None
    if backend is None or not readings:
        return [None] * len(readings)
    if registration.mode == "local":
        return backend.settled_energies(readings, wait_s)
    ours = [r.source == "daemon" for r in readings]
    if not any(ours):
        return [None] * len(readings)
    base = f"/v1/targets/{backend.id}"
    if wait_s > 0:  # the power readings after the last rows, at most that long
        timeout = wait_s + transport.REQUEST_TIMEOUT_S
        transport.call_ok(backend.socket, "GET", f"{base}/summary?final={wait_s:g}", None, timeout)
    since = min(r.time for r in readings) - 0.001
    rows = transport.call_ok(backend.socket, "GET", f"{base}/samples?since={since!r}")["samples"]
    energy = {row["time"]: row["device_energy_j"] for row in rows if row.get("final")}
    return [energy.get(r.time) if mine else None for r, mine in zip(readings, ours)]
