"""`edgewatt run [--label k=v]... [--output FILE.jsonl] -- CMD ARGS...`

Runs a command, monitored without touching its code: registered with the daemon when
one answers, else sampled by this process. edgewatt run is the parent of everything
the command starts: it is a child subreaper, so every orphan is re-parented to it and
reaped by it, and it waits for the last of them. The command is registered before it
runs its first instruction (fork, register the child, then exec). Signals are
forwarded to the command (and, once it has exited, to the orphans still running), the
exit status is the command's (128+N when a signal N ended it), and a summary table is
printed on stderr so that the command's own output stays clean.

The table and the ``--output`` file's summary show the larger of two counts of the
same processes, and say which: the daemon's final summary of the target (where its
exit figures came from the kernel) and the kernel's count for everything this
process reaped (wait4, every teardown included). Before reaping the command, it is
held as a zombie while the daemon reads it: its counters of reaped children are then
final, so the daemon's figure has its children's teardowns too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import shlex
import shutil
import signal
import sys
import time
from typing import Any, Callable

from edgewatt.cli import emissions as emissions_csv
from edgewatt.cli import run_cgroup, spreads
from edgewatt.cli.exit_peaks import ExitPeak, ExitPeaks
from edgewatt.cli.report import TOTAL_KEYS, amount, summary_table
from edgewatt.client import NO_DAEMON_SAID
from edgewatt.client._loop import LoopState, Spec
from edgewatt.client._samples import Recorder
from edgewatt.client._sinks import measured_phases
from edgewatt.client._workers import ThreadWorker
from edgewatt.core import compat, transport
from edgewatt.core.channels import CHANNELS, NAMES
from edgewatt.core.facts import procfs
from edgewatt.core.labels import validate_labels

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
PR_SET_CHILD_SUBREAPER = 36
# sysexits.h: an --output file that could not be written whole, the command's status 0.
EX_IOERR = 74
# How long the table waits for the daemon to find the target's end after the last
# process was reaped (it samples at once on the monitor's last reading).
FINAL_WAIT_S = 3.0
# How long it then waits for the energy to be final: the power readings after the
# target's last edges (a push source's next line: tegrastats at 1 Hz, powermetrics).
POWER_FINAL_WAIT_S = 3.0
# How long the command is held a zombie for the daemon's pass that reads it (its exit
# status waits that long at most when the daemon is slow).
ZOMBIE_PASS_S = 2.0
MEMORY_KEYS = ("memory_pss_peak_bytes", "memory_rss_largest_peak_bytes", "memory_rss_peak_bytes")
LARGEST = "memory_rss_largest_peak_bytes"
LARGEST_SOURCE = "memory_rss_largest_source"  # sampled, or at exit from which record
AT_EXIT = "memory_rss_largest_at_exit"  # the sampler's largest is an exit record's
METRICS = {"cpu": True, "memory": True, "network": True, "power": True}


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """--label KEY=VALUE pairs, checked by the daemon's own rule before the command
    starts: a label the daemon would refuse is an error here, not a silent fallback."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label must be KEY=VALUE, got {pair!r}")
        labels[key] = value
    return validate_labels(labels)


def run(
    command: list[str],
    labels: dict[str, str],
    output: str | None,
    interval: float,
    socket: str | None,
    cgroup: str = run_cgroup.AUTO,
    emissions: str | None = None,
) -> int:
    """``cgroup``: AUTO puts the command in a cgroup of its own where the machine allows
    it (cli/run_cgroup.py), else says what its process target costs; INSIST refuses to
    run the command without one (exit status 2); NO makes a process target."""
    if not command:
        raise ValueError("no command given: edgewatt run [options] -- CMD ARGS...")
    try:
        # Checked before anything starts: a run whose file cannot be written is not run.
        kept = _OutputFile(output) if output else None
    except OSError as exc:
        print(f"edgewatt run: --output {output}: cannot write: {exc.strerror}; "
              "the command was not run", file=sys.stderr)  # fmt: skip
        return 2
    try:
        path = _executable(command[0])
    except OSError as exc:
        print(f"edgewatt run: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        if kept is not None:
            kept.restore()
        return _exec_status(exc.errno)
    arguments = _arguments(command, labels, output, interval, socket, cgroup)
    if cgroup == run_cgroup.AUTO:
        answers, problem = run_cgroup.daemon_counts(socket)
        if problem is not None:
            print(f"edgewatt run: a process target, not a cgroup of its own (the daemon "
                  f"cannot count a cgroup's traffic: {problem}): {run_cgroup.COST}; "
                  "--no-cgroup says you know", file=sys.stderr)  # fmt: skip
        if not answers or problem is not None:
            cgroup = run_cgroup.NO  # its process tree is sampled, as a cgroup would not help
    try:
        # A new --output file is removed before the run in a scope makes it again.
        own = run_cgroup.own_cgroup(cgroup, arguments, kept.restore if kept else lambda: None)
    except run_cgroup.NoCgroup as exc:
        if cgroup == run_cgroup.INSIST:
            print(f"edgewatt run: --cgroup: no cgroup of its own: {exc}; the command "
                  "was not run (without --cgroup it runs as a process target)",
                  file=sys.stderr)  # fmt: skip
            if kept is not None:
                kept.restore()
            return 2
        print(f"edgewatt run: a process target, not a cgroup of its own ({exc}): "
              f"{run_cgroup.COST}; --no-cgroup says you know", file=sys.stderr)  # fmt: skip
        own = None
    sampling = ThreadWorker()  # the monitors' loop, in a thread of this process
    state = sampling.state  # its registration and file, once it runs
    subreaper = become_subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    child = _Held(path, command, socket)
    if own is not None:
        try:
            own.add(child.pid)  # before its exec: every process it starts is a member
        except OSError as exc:
            print(f"edgewatt run: cannot move the command into {own.path}: {exc}: a process "
                  f"target, so {run_cgroup.COST}", file=sys.stderr)  # fmt: skip
            own.remove()
            own = None
    previous: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        # Once the command is gone: the orphans it left, adopted by this process.
        pids = [child.pid] if child.returncode is None else _orphans(state.helper_pids())
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    spec = Spec(
        pid=child.pid,
        labels=labels,
        interval=float(interval),
        metrics=dict(METRICS),
        socket=socket,
        sink="file" if output else "none",
        sink_options={"path": os.path.abspath(output), "network": "command"} if output else {},
        network="command",  # rows: the command's own bytes; the host's apart (host_ keys)
        cgroup=own.path if own is not None else None,
        command=shlex.join(command),
        argv=command,  # the daemon's name for the held fork (the launcher's until its exec)
    )
    recorder = Recorder(dict(METRICS), interval, "command")
    source = _start(sampling, spec, recorder)  # registered, its first reading taken
    try:
        # The command's own clients (a training script's register(), a Flower mod) find
        # the daemon that measures it.
        said = getattr(state.registration, "no_daemon_at", None)
        # Listening before the command runs, unless a daemon hears every exit already
        # and keeps each member's (a process target's; for a cgroup it keeps its first
        # process's alone: the exit record does not name the cgroup).
        daemon = getattr(state.registration, "mode", None) == "daemon"
        peaks = ExitPeaks(child.pid, listen=not daemon or own is not None)
        failure = child.release(state.daemon_socket, said)
        if child.fork_peak is not None:
            peaks.fork_peak = peaks.bytes(child.fork_peak)
        last_pass = _last_pass(state)
        code = _wait_all(child, subreaper, state.helper_pids, last_pass, peaks)
        # Whether the device has a power source, asked before the target is closed.
        power = _power_state(state.registration)
        if own is not None:
            last_pass()  # its cgroup empty: the counters of every process that was in it
            if own.remove() is None:
                last_pass()  # gone: its target ends exactly, as a process's at its exit
        wall_s = time.monotonic() - started
        usage = _difference(resource.getrusage(resource.RUSAGE_CHILDREN), before)
        # The last rows' and the summary's energy are waited for together, at most this.
        settled_by = time.monotonic() + POWER_FINAL_WAIT_S
        final = _final(usage if subreaper else None, wall_s, power, peaks.result(), settled_by)
        if source is not None:
            sampling.stop(final)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        problem = own.remove() if own is not None else None
        if problem is not None:
            print(f"edgewatt run: {problem}", file=sys.stderr)
    if failure is not None:  # it never ran: no table, no figures in the file
        print(f"edgewatt run: cannot start {command[0]}: {os.strerror(failure)}", file=sys.stderr)
        if kept is not None:
            kept.restore()
        return _exec_status(failure)
    status = 128 - code if code < 0 else code
    shown = " ".join(shlex.join(command).split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    where = f", cgroup {own.path}" if own is not None else ""
    via = _monitored_via(source, getattr(state.registration, "lost", None))
    title = f"edgewatt run: {shown} (exit status {status}, monitored via {via}){where}"
    summary = (state.summary or recorder.summary()) if source else final(recorder.summary(), None)
    table = summary_table(summary, title, summary.get("power_source"), measured_phases(summary))
    print(table, file=sys.stderr)
    if output and state.write_failure:
        # A file without its summary must not pass for a whole run: a script that
        # checks the status learns of it (EX_IOERR where the command itself succeeded).
        print(f"edgewatt run: --output incomplete: {state.write_failure}", file=sys.stderr)
        return status or EX_IOERR
    if output and source:
        print(f"  samples written to {output}", file=sys.stderr)
    if emissions:  # codecarbon's emissions.csv, a row appended (cli/emissions.py)
        return _emissions(emissions, summary, labels, status)
    return status


def _start(sampling: ThreadWorker, spec: Spec, recorder: Recorder) -> str | None:
    """Start sampling the command, before its exec: what samples it (the daemon, or
    in-process), or None where monitoring is unavailable (said on stderr)."""

    def begin(info: dict[str, Any]) -> None:  # before its first reading is recorded
        recorder.begin(info["interval"], spec.metrics)

    try:
        info = sampling.start(spec, recorder.observe, begin)
    except OSError as exc:
        print(f"edgewatt run: monitoring unavailable: {exc}", file=sys.stderr)
        return None
    return info.get("source")


def _emissions(path: str, summary: dict[str, Any], labels: dict[str, str], status: int) -> int:
    """The run's row appended to codecarbon's emissions.csv at ``path``, and its phases'
    rows in codecarbon's tasks file beside it; the run's exit status (EX_IOERR where
    the command's was 0 and a file could not be written)."""
    row = emissions_csv.row(summary, labels, time.time())
    problem = emissions_csv.append(path, row)
    if problem is not None:
        print(f"edgewatt run: --emissions: {problem}", file=sys.stderr)
        return status or EX_IOERR
    print(f"  a row appended to {path} (codecarbon's columns; energy_consumed: the "
          "device's measured energy)", file=sys.stderr)  # fmt: skip
    phases = measured_phases(summary)
    if phases:
        tasks = emissions_csv.task_path(path, labels.get("experiment", ""), row["run_id"])
        rows = emissions_csv.task_rows(row, phases, summary.get("carbon_intensity_g_per_kwh"))
        problem = emissions_csv.write_tasks(tasks, rows)
        if problem is not None:
            print(f"edgewatt run: --emissions: {problem}", file=sys.stderr)
            return status or EX_IOERR
        print(f"  {len(rows)} phases in {tasks} (codecarbon's task rows)", file=sys.stderr)
    return status


def _arguments(
    command: list[str],
    labels: dict[str, str],
    output: str | None,
    interval: float,
    socket: str | None,
    cgroup: str,
) -> list[str]:
    """The options of this run, as `edgewatt run` takes them (to run it again in a
    scope: run_cgroup.exec_in_scope)."""
    arguments = ["--interval", repr(interval)]
    for key, value in labels.items():
        arguments += ["--label", f"{key}={value}"]
    if output is not None:
        arguments += ["--output", output]
    if socket is not None:
        arguments += ["--socket", socket]
    if cgroup == run_cgroup.INSIST:
        arguments.append("--cgroup")
    return [*arguments, "--", *command]


def become_subreaper() -> bool:
    """Make this process the reaper of every orphan its descendants leave (Linux 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# What a release sends the held fork first: an end of file without it is the run's death
# (killed before it let the command run), and the command never runs.
_GO = b"go:"


class _Held:
    """The command, forked but held before its exec until :meth:`release`: so it is
    registered before it runs its first instruction (a Popen cannot wait there: it
    waits for the exec itself)."""

    def __init__(self, path: str, command: list[str], given: str | None = None) -> None:
        """``given``: the socket `edgewatt run --socket` was told, where the command's
        own clients look too, whether a daemon answers there or not."""
        hold, self._release = os.pipe()
        self._errors, report = os.pipe2(os.O_CLOEXEC)
        self.pid = os.fork()
        if self.pid == 0:  # the child: wait, then become the command
            try:
                os.close(self._release)
                os.close(self._errors)
                told = b""
                while chunk := os.read(hold, 4096):  # until the parent closes its end
                    told += chunk
                os.close(hold)
                if not told.startswith(_GO):  # the run was killed before it let it run
                    return
                told = told[len(_GO) :]
                if told.startswith(b"\0"):  # no daemon answered there: said already
                    os.environ[NO_DAEMON_SAID] = os.fsdecode(told[1:])
                    if given:
                        os.environ["EDGEWATT_SOCKET"] = given
                elif told:
                    os.environ["EDGEWATT_SOCKET"] = os.fsdecode(told)
                # The kernel keeps this fork's peak RSS across the exec, in wait4's
                # ru_maxrss: read last, so that a larger figure is the command's. A run
                # killed since its release reads it no more: the command runs on.
                with contextlib.suppress(BrokenPipeError):  # SIGPIPE ignored until below
                    os.write(report, _own_peak())
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as Popen restores them
                    signal.signal(sig, signal.SIG_DFL)
                os.execv(path, command)  # with os.environ as now
            except OSError as exc:
                os.write(report, b"\n" + str(exc.errno or errno.ENOEXEC).encode())
            finally:
                os._exit(127)
        os.close(hold)
        os.close(report)
        self.returncode: int | None = None
        self.fork_peak: int | None = None  # its ru_maxrss just before its exec

    def release(self, socket: str | None = None, no_daemon_at: str | None = None) -> int | None:
        """Let the command run, with ``EDGEWATT_SOCKET`` set to ``socket`` where given,
        else NO_DAEMON_SAID to ``no_daemon_at`` (where none answered, as this process
        said); the errno its exec failed with, or None once it runs."""
        if socket:
            os.write(self._release, _GO + os.fsencode(socket))
        elif no_daemon_at:
            os.write(self._release, _GO + b"\0" + os.fsencode(no_daemon_at))
        else:
            os.write(self._release, _GO)
        os.close(self._release)
        with os.fdopen(self._errors, "rb") as errors:
            told = errors.read()  # end of file at the exec (close-on-exec)
        peak, _, failure = told.partition(b"\n")
        self.fork_peak = int(peak) if peak else None  # ru_maxrss's unit
        return int(failure) if failure else None


def _own_peak() -> bytes:
    """This process's peak RSS as wait4 will count it (ru_maxrss: the kernel's per-CPU
    counters, not /proc's sums, which differ by pages) and a newline: read last, with
    as little allocated after it as can be."""
    return str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).encode() + b"\n"


def _executable(name: str) -> str:
    """The file ``name`` runs, found as a shell finds it; OSError with the errno a shell
    would meet (ENOENT: not found; EACCES, EISDIR: found, not executable)."""
    if os.sep not in name:
        path = shutil.which(name)
        if path is None:
            raise FileNotFoundError(errno.ENOENT, "command not found", name)
        return path
    if os.path.isdir(name):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    if not os.path.exists(name):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    if not os.access(name, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
    return name


def _exec_status(error: int | None) -> int:
    """A shell's exit status for a command it could not run: 127 not found, else 126."""
    return 127 if error in (errno.ENOENT, errno.ENOTDIR) else 126


class _OutputFile:
    """The ``--output`` file, opened for appending before the command starts (an
    unwritable path raises OSError here); :meth:`restore` takes back what a run that
    never started left (the file removed where this created it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.existed = os.path.exists(path)
        with open(path, "a", encoding="utf-8") as f:
            self.size = f.tell()

    def restore(self) -> None:
        with contextlib.suppress(OSError):
            if self.existed:
                os.truncate(self.path, self.size)
            else:
                os.unlink(self.path)


def _power_state(registration: Any) -> str | None:
    """ "present" where the monitoring has a power source (its target's samples then
    carry an energy figure, 0 before the first reading), "none" where it has none, None
    where no registration answers."""
    if registration is None or not registration.active:
        return None
    latest = registration.stats()
    if "energy_j" not in latest:
        return None
    return "none" if latest["energy_j"] is None else "present"


def _orphans(helpers: set[int]) -> list[int]:
    """This process's children but the monitoring's own helpers: the orphans the
    command left (from every /proc/PID/stat where the kernel lacks the children file)."""
    own = os.getpid()
    if os.path.exists(f"/proc/{own}/task/{own}/children"):
        children = procfs.child_pids(own)
    else:
        children = procfs.ParentIndex().children(fresh=True).get(own, [])
    return [pid for pid in children if pid not in helpers]


def _monitored_via(source: str | None, lost: tuple[float, str, str] | None) -> str:
    """What sampled the command: the daemon, in-process, or the daemon until it was lost
    (when, why, and what sampled after)."""
    if source is None:
        return "nothing (monitoring unavailable)"
    if lost is None:
        return str(source)
    at, why, then = lost
    when = time.strftime("%H:%M:%S", time.gmtime(at))
    return f"daemon until {when} UTC (it {why}), then {then}"


def _last_pass(state: LoopState) -> Callable[[], None]:
    """A pass now, the command a zombie: its counters final, and its comm the command's
    (in-process too: then the memory read before its exec is known as the fork's)."""

    def sample() -> None:
        registration = state.registration
        if registration is not None and registration.mode == "local":
            registration.summary()  # a pass while the target runs
            return
        if registration is None or registration.mode != "daemon" or state.daemon_socket is None:
            return
        path = f"/v1/targets/{registration.id}/summary?fresh=1"
        with contextlib.suppress(OSError, transport.DaemonError):
            transport.call_ok(state.daemon_socket, "GET", path, timeout=ZOMBIE_PASS_S)

    return sample


def _wait_all(
    child: _Held,
    subreaper: bool,
    helpers: Callable[[], set[int]],
    last_pass: Callable[[], None],
    peaks: ExitPeaks,
) -> int:
    """The command's exit code, once it and every process re-parented to this one have
    exited and been reaped (PEP 475: waits are retried across signals). The command is
    read by ``last_pass`` as a zombie before it is reaped. The children in-process
    monitoring runs for itself (a power source's tegrastats or powermetrics) are not
    waited for; without the subreaper (macOS) orphans go elsewhere."""
    if hasattr(os, "waitid"):  # not on macOS before Python 3.13: reaped unread there
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        last_pass()
    _, status, usage = os.wait4(child.pid, 0)
    peaks.reaped_one(child.pid, usage.ru_maxrss)
    child.returncode = compat.exit_code(status)
    # A zombie's children are re-parented at its exit, before it is reaped: each round
    # lists those the last reaped ones left.
    while subreaper and (orphans := _orphans(helpers())):
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                peaks.reaped_one(pid, os.wait4(pid, 0)[2].ru_maxrss)
    return child.returncode


def _difference(after: resource.struct_rusage, before: resource.struct_rusage) -> dict:
    # Not ru_maxrss: it counts this process's fork before the command's exec. The block
    # counts are /proc/PID/io's read_bytes and write_bytes (less cancelled writes) of
    # every reaped process, in 512-byte units: exact however short the run.
    return {
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "disk_read_bytes": (after.ru_inblock - before.ru_inblock) * 512,
        "disk_write_bytes": (after.ru_oublock - before.ru_oublock) * 512,
        **{c.name: getattr(after, c.rusage) - getattr(before, c.rusage) for c in CHANNELS},
    }


def _final(
    usage: dict | None,
    wall_s: float,
    power: str | None,
    exit_peak: ExitPeak | None,
    settled_by: float,
) -> Any:
    """The summary the table and the file show: the larger of the daemon's CPU time of
    the target (where its exit figures came from the kernel) and the kernel's count of
    the reaped tree (``usage``: None where this process could not be the subreaper,
    and the orphans' CPU went elsewhere), both kept, and which was shown; ``power``
    (_power_state) kept as ``power_source`` for the report's word on missing energy;
    ``exit_peak``: the largest peak RSS the kernel recorded at the processes' exits;
    ``settled_by``: the monotonic instant until which an in-process sampler's energy is
    waited for (the daemon's: POWER_FINAL_WAIT_S)."""

    def final(recorded: dict[str, Any], registration: Any) -> dict[str, Any]:
        summary = {**recorded, "duration_s": wall_s}
        for total in TOTAL_KEYS:  # the samples' own bytes: the daemon's count is the run's
            summary.pop(total, None)
        if power is not None:
            summary["power_source"] = power
        api = _daemon_summary(registration)
        daemon = kernel = None
        if api is not None:
            daemon = summary["cpu_daemon_s"] = api["cpu_user_s"] + api["cpu_system_s"]
            for key in ("network_transmit_bytes", "network_receive_bytes"):
                if api.get(key) is not None:  # what crossed the target's boundary
                    summary[key] = api[key]
                    summary["network_counts"] = api.get("network_counts")
                    summary["network_lower_bound"] = api.get("network_lower_bound")
            if api.get("network_unknown"):  # absent, never 0: and why
                summary["network_unknown"] = api["network_unknown"]
        last = _daemon_last(registration, api)
        # Memory as the sampler measured it after the exec (never this process's fork
        # before it, which wait4's ru_maxrss would count): PSS, the largest process's
        # RSS, and the RSS summed, each under its name.
        sampled = last or _sampler_summary(registration, settled_by)
        for key in MEMORY_KEYS:
            if key in sampled:
                summary[key] = sampled[key]
        summary.update(_largest(summary.get(LARGEST), exit_peak, sampled.get(AT_EXIT, False)))
        cgroup = (api or {}).get("cgroup") or {}
        if cgroup.get("memory_peak_bytes") is not None:  # the kernel's, however short
            summary["memory_cgroup_peak_bytes"] = cgroup["memory_peak_bytes"]
        if any(key in summary and summary[key] is None for key in MEMORY_KEYS):
            summary["memory_unmeasured"] = _memory_unmeasured(
                api or last, wall_s, "memory_cgroup_peak_bytes" in summary, summary, exit_peak
            )
        # The run's lowest, mean and highest power, CPU use and memory, as the daemon
        # measured them.
        summary.update({k: last[k] for k in spreads.KEYS if k in last and k not in summary})
        own = _own_settled(registration, sampled)
        windows = own if own is not None else last
        if "final" in windows:  # every window's energy settled (it was waited for)
            summary["final"] = windows["final"]
        for key in ("energy_provenance", "device_energy_provenance"):
            if key in sampled:  # where the energy comes from, or why it is unknown
                summary[key] = sampled[key]
        if last.get("context") is not None:  # the device's setting over the run
            summary["context"] = last["context"]
        if last.get("phases"):  # whoever opened them: this process, the command's own
            summary["phases"] = last["phases"]
            summary["phases_dropped"] = last.get("phases_dropped") or 0
        summary.update(_disk(api, usage))
        # The channels (context switches, ...): wait4's, every process the command
        # started, all threads (a cgroup target has none of the daemon's); else the
        # sampler's.
        for key in NAMES:
            counted = (usage or sampled).get(key)
            if counted is not None:
                summary[key] = counted
        if api is not None:
            summary.update(_device_energy(api, summary, "daemon"))
        elif own is not None:
            summary.update(_device_energy(own, summary, "in-process"))
        if usage is not None:
            kernel = summary["cpu_wait4_s"] = usage["cpu_s"]
        if daemon is not None and (kernel is None or daemon >= kernel):
            cpu_s = daemon
            summary["cpu_source"] = (
                "daemon (the cgroup's own accounts)"
                if api is not None and api.get("kind") == "cgroup"
                else "daemon (exit records and reapers' counters, lineage)"
            )
            if kernel is not None:
                summary["cpu_source"] += f"; wait4 counted {amount(kernel, 2)} s"
        elif kernel is not None:
            cpu_s = kernel
            summary["cpu_source"] = "kernel (wait4 of every process the command started)"
            if daemon is not None:
                summary["cpu_source"] += f"; the daemon counted {amount(daemon, 2)} s"
        else:
            return summary
        summary["cpu_time_s"] = cpu_s
        summary["avg_cpu_usage"] = cpu_s / wall_s * 100 if wall_s > 0 else 0.0
        if wall_s > 0 and "cpu_avg_utilization" in summary:
            # The daemon's mean is over its target's span (from the registration to the
            # exit it saw: tens of ms off the run's for a short command); the run's is
            # this CPU time over the run, the CPU time row's own figure.
            summary["cpu_avg_utilization"] = cpu_s / wall_s / (os.cpu_count() or 1)
        return summary

    return final


def _device_energy(api: dict[str, Any], summary: dict[str, Any], by: str) -> dict[str, Any]:
    """The device's energy over the command and the command's attributed share, as the
    sampler ``by`` (the daemon, or in-process) settled them at the target's edges (its
    final summary ``api``), in place of the monitor's sums over its readings: those
    hold each pass's energy as known then (up to the sensor's latest reading), and a
    run of a few readings summed them to -0.3 J, or 44 W where the readings were 5 and
    12 W, its share above the device's. {} where the summary gave none final."""
    if api.get("final") is False or api.get("device_energy_j") is None:
        return {}
    energy = api["device_energy_j"] + 0.0  # never -0.0
    found = {"energy_j": energy, "energy_source": f"{by} (settled at the command's edges)"}
    if "energy_vdd_in_j" in summary:  # the board input is the device: one energy
        found.update(energy_vdd_in_j=energy, total_power_vdd_in=energy * 1000)
    found["avg_power_w"] = api.get("device_power_avg_w")
    if api.get("energy_j") is not None:  # its share over the same span, never above it
        found["process_energy_j"] = api["energy_j"] + 0.0
    intensity = summary.get("carbon_intensity_g_per_kwh")
    if intensity is not None:  # CodeCarbon's rule, on this energy
        found["total_carbon_g"] = energy / 3_600_000 * intensity
    return found


def _disk(api: dict[str, Any] | None, usage: dict | None) -> dict[str, Any]:
    """The larger of the daemon's disk bytes of the target and wait4's of the reaped
    tree (a cgroup v1 target's has none: no io.stat), and which counted them."""
    daemon = None if api is None else (api.get("disk_read_bytes"), api.get("disk_write_bytes"))
    kernel = None if usage is None else (usage["disk_read_bytes"], usage["disk_write_bytes"])
    if daemon is None or None in daemon or (kernel is not None and sum(kernel) > sum(daemon)):
        if kernel is None:
            return {}
        read, written = kernel
        source = "kernel (wait4 of every process the command started)"
    else:
        read, written = daemon
        source = "daemon"
    return {"disk_read_bytes": read, "disk_write_bytes": written, "disk_source": source}


def _largest(sampled: int | None, exit_peak: ExitPeak | None, at_exit: bool) -> dict[str, Any]:
    """The largest process's peak RSS: the larger of the sampler's (``at_exit``: from
    the daemon's exit records, kept where as large) and this process's exit records
    (a pass reads below a peak between passes; an exit record is that process's
    peak), and which it is."""
    counted = exit_peak if exit_peak is not None and not exit_peak.bound else None
    if sampled is not None and at_exit and (counted is None or sampled >= counted.bytes):
        return {LARGEST_SOURCE: "at exit: the daemon's exit records (taskstats)"}
    if counted is not None and (sampled is None or counted.bytes >= sampled):
        return {LARGEST: counted.bytes, LARGEST_SOURCE: f"at exit: {counted.source}"}
    if sampled is None:
        return {}
    return {LARGEST_SOURCE: "sampled by the passes"}


def _memory_unmeasured(
    api: dict[str, Any],
    wall_s: float,
    cgroup_peak: bool,
    summary: dict[str, Any],
    exit_peak: ExitPeak | None,
) -> str:
    """Why a memory figure is absent: memory is read by the passes (smaps for PSS), and
    none saw a process of the command alive. The kernel keeps no PSS and no sum over
    processes at once; at each exit, a process's peak RSS (the largest is shown where
    its record was read: exit_peaks.py), and a cgroup's peak where it keeps one
    (memory.peak on cgroup v2, memory.max_usage_in_bytes where v1's memory controller
    holds the cgroup)."""
    why = f"no pass saw a process of it alive (it ran {wall_s:.2f} s)"
    if cgroup_peak:
        why += "; the kernel's peak of its cgroup is below"
    elif api.get("kind") == "cgroup":
        why += "; its cgroup has no memory.peak (the memory controller is v1's elsewhere)"
    if summary.get(LARGEST) is not None:
        return f"{why}; at an exit the kernel records no PSS or sum, only a process's peak RSS"
    if exit_peak is not None:  # a bound only
        return (
            f"{why}; each process's peak RSS at its exit is at most "
            f"{exit_peak.bytes / 2**20:.1f} MiB ({exit_peak.source})"
        )
    return f"{why}; the kernel keeps no PSS, and no exit record of peak RSS was read"


def _daemon_last(registration: Any, api: dict[str, Any] | None) -> dict[str, Any]:
    """The daemon's last summary of the target (the final one, else its answer now),
    for its phases with their figures; {} where the daemon does not sample it."""
    if api is not None:
        return api
    if registration is None or registration.mode != "daemon":
        return {}
    return registration.summary(final_wait_s=POWER_FINAL_WAIT_S)


def _sampler_summary(registration: Any, settled_by: float) -> dict[str, Any]:
    """The summary of whatever sampler measured the target (the daemon, or this
    process's own), for its memory figures, its energy waited for until ``settled_by``
    (monotonic) at most; {} where none did."""
    if registration is None or not registration.active:
        return {}
    return registration.summary(final_wait_s=max(0.0, settled_by - time.monotonic()))


def _own_settled(registration: Any, sampled: dict[str, Any]) -> dict[str, Any] | None:
    """This process's own sampler's summary ``sampled`` where it measured the whole run
    (no daemon answered at its start), for its settled energy and ``final``; else None
    (the daemon's, or in-process only since the daemon was lost: its target began
    then)."""
    if registration is None or registration.mode != "local":
        return None
    return sampled if sampled.get("covers", {}).get("whole") else None


def _daemon_summary(registration: Any) -> dict[str, Any] | None:
    """The daemon's final summary of the target, where its exit figures came from the
    kernel (lineage, or a cgroup), or None."""
    if registration is None or registration.mode != "daemon":
        return None
    if registration.info.get("kind") == "cgroup":
        # Every member has been reaped: the cgroup's counters are final now.
        api = registration.summary(final_wait_s=POWER_FINAL_WAIT_S)
        return api if api.get("cpu_user_s") is not None else None
    deadline = time.monotonic() + FINAL_WAIT_S
    while True:
        api = registration.summary()
        if api.get("state") == "exited":
            if api.get("final") is False:  # its energy: once the readings after come
                api = registration.summary(final_wait_s=POWER_FINAL_WAIT_S)
            # From the kernel (with every teardown, or the exit records without some).
            kernel = api.get("exit") in ("exact", "exit-records")
            lineage = api.get("membership") == "lineage"
            return api if kernel and lineage and api.get("cpu_user_s") is not None else None
        if time.monotonic() > deadline:
            return None
        registration.reading()  # a pass now: it finds the end
        time.sleep(0.05)
