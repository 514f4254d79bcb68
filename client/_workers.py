"""Where a monitor's sampling loop (``_loop.py``) runs: a :class:`Worker`.

:class:`ThreadWorker` runs it in a thread of the caller. :class:`HelperProcessWorker`
runs it in a helper, a fresh interpreter (``python -m edgewatt.client._helper``:
nothing of the training process is forked, and unlike multiprocessing's "spawn" the
caller's script is not imported again, so scripts without an ``if __name__ ==
"__main__"`` guard work as with heflwr). The helper samples the caller's pid and sends
each reading back over a pipe, so the caller's recorder sees every reading either way;
it stops when the caller does, even if the caller dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, Protocol

from edgewatt.client._loop import Final, LoopState, Mark, Spec, sampling_loop
from edgewatt.client._samples import Reading

log = logging.getLogger(__name__)

Observe = Callable[[Reading], Any]
# begin(info): the loop is ready, its first reading not yet observed (info: port,
# source, interval as really used).
Begin = Callable[[Dict[str, Any]], None]
START_WAIT_S = 60.0
STOP_WAIT_S = 15.0


class Worker(Protocol):
    """Runs one monitor's sampling loop from start() to stop()."""

    def start(self, spec: Spec, observe: Observe, begin: Begin) -> dict[str, Any]:
        """Start the loop and return its info once its baseline reading is taken;
        raise OSError where it cannot start (a path not writable, a port in use)."""

    def mark(self, mark: Mark) -> None:
        """A phase's start: ``mark.done()`` once the loop's reading at it is in."""

    def stop(self) -> None:
        """Stop after one last reading."""


class ThreadWorker:
    """The loop in a thread of this process (or in the caller's own: :meth:`run_here`)."""

    def __init__(self) -> None:
        self.state = LoopState()  # what the loop opened and wrote, for `edgewatt run`
        self.thread: threading.Thread | None = None

    def start(self, spec: Spec, observe: Observe, begin: Begin) -> dict[str, Any]:
        outcome: list[tuple[str | None, dict[str, Any]]] = []
        started = threading.Event()

        def ready(error: str | None, info: dict[str, Any]) -> None:
            if error is None:
                begin(info)  # before the loop's first reading reaches the recorder
            outcome.append((error, info))
            started.set()

        thread = threading.Thread(
            target=sampling_loop,
            args=(spec, self.state, observe, ready),
            name="edgewatt-monitor",
            daemon=True,
        )
        thread.start()
        if not started.wait(START_WAIT_S):
            raise OSError(f"the monitor did not start within {START_WAIT_S:.0f} s")
        error, info = outcome[0]
        if error is not None:
            thread.join(timeout=5)
            raise OSError(error)
        self.thread = thread
        return info

    def run_here(self, spec: Spec, observe: Observe, begin: Begin) -> None:
        """The loop in the calling thread until stop() (heflwr's update_metrics());
        a loop that cannot start is logged."""
        self.thread = threading.current_thread()

        def ready(error: str | None, info: dict[str, Any]) -> None:
            if error is not None:
                log.warning("edgewatt: %s", error)
            else:
                begin(info)

        sampling_loop(spec, self.state, observe, ready)

    def mark(self, mark: Mark) -> None:
        self.state.mark(mark)

    def stop(self, final: Final | None = None) -> None:
        """Stop after one last reading; ``final(summary, registration)`` gives the
        summary written, kept in ``state.summary`` (`edgewatt run`'s last word)."""
        self.state.end(final)
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=STOP_WAIT_S)


class HelperProcessWorker:
    """The loop in the helper interpreter; its readings come back over its stdout."""

    def __init__(self) -> None:
        self.helper: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._marked: dict[float, Callable[[], None]] = {}  # marks sent, by their time

    def start(self, spec: Spec, observe: Observe, begin: Begin) -> dict[str, Any]:
        # The same interpreter, so the same installed edgewatt; nothing is forked.
        helper = subprocess.Popen(
            [sys.executable, "-m", "edgewatt.client._helper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write(json.dumps(spec.to_json()) + "\n")
        helper.stdin.flush()
        line = helper.stdout.readline()
        if not line:
            helper.wait()
            raise OSError(f"the monitor helper exited with status {helper.returncode}")
        message = json.loads(line)
        if message["error"] is not None:
            helper.wait(timeout=5)
            raise OSError(message["error"])
        begin(message["info"])
        self.helper = helper
        self._reader = threading.Thread(
            target=self._read, args=(helper, observe), name="edgewatt-monitor", daemon=True
        )
        self._reader.start()
        return dict(message["info"])

    def _read(self, helper: subprocess.Popen[str], observe: Observe) -> None:
        assert helper.stdout is not None
        for line in helper.stdout:
            message = json.loads(line)
            if "marked" in message:  # a phase's edge reading is in
                done = self._marked.pop(message["marked"], None)
                if done is not None:
                    done()
                continue
            observe(Reading(**message))

    def mark(self, mark: Mark) -> None:
        assert self.helper is not None and self.helper.stdin is not None
        self._marked[mark.at] = mark.done
        self.helper.stdin.write(json.dumps({"phase": mark.name, "at": mark.at}) + "\n")
        self.helper.stdin.flush()

    def stop(self) -> None:
        assert self.helper is not None and self.helper.stdin is not None
        with contextlib.suppress(OSError):
            self.helper.stdin.close()  # end of input: a last reading, then it exits
        try:
            self.helper.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.helper.kill()
        if self._reader is not None:
            self._reader.join(timeout=5)
