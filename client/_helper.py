"""The process variant's helper: ``python -m client._helper``.

Reads the monitor's spec as one JSON line on stdin, answers one JSON line
``{"error", "info"}``, then one JSON line per reading on stdout. End of stdin (the
caller stopped, or died) ends it after a last reading.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading

from edgewatt.client._monitor import sampling_loop


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    stop = threading.Event()
    out_lock = threading.Lock()

    def send(message: dict) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    shared: dict = {}

    def read_input() -> None:
        # Phase marks, one JSON line each, until end of input: then stop.
        for line in sys.stdin:
            mark = json.loads(line)
            sink = shared.get("sink")
            if hasattr(sink, "phase"):
                sink.phase(mark["phase"], mark["at"])
        stop.set()

    threading.Thread(target=read_input, daemon=True).start()
    try:
        sampling_loop(
            spec,
            stop,
            emit=lambda reading: send(dataclasses.asdict(reading)),
            ready=lambda error, info: send({"error": error, "info": info}),
            shared=shared,
        )
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
