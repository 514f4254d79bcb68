"""Wiring: config -> table -> sampler -> the outputs (outputs.py); the API, signals,
shutdown. Reload is reload.py, /healthz health.py, the registrations kept across a
restart saved_state.py."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from resource import RLIM_INFINITY, RLIMIT_NOFILE, getrlimit, setrlimit
from typing import Any

from edgewatt.core import __version__, power
from edgewatt.core.carbon import resolve_carbon
from edgewatt.core.compat import name_thread
from edgewatt.core.facts import procfs
from edgewatt.core.lookups import Lookups
from edgewatt.core.persons import Persons
from edgewatt.core.platforms.context import ContextLog
from edgewatt.core.platforms.context import read as read_context
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.power.values import PowerStatus
from edgewatt.core.sampling.sampler import Sampler
from edgewatt.core.snapshot import Snapshot
from edgewatt.core.targets import SAMPLE_UNITS, Resolver, TargetTable
from edgewatt.exporter import documents, health, outputs
from edgewatt.exporter import reload as reloading
from edgewatt.exporter.api import ApiContext, ApiServer
from edgewatt.exporter.collectors import start_collectors
from edgewatt.exporter.config import Config, ConfigError
from edgewatt.exporter.heap import limit_arenas
from edgewatt.exporter.log_limit import KindLimit, limit_handlers
from edgewatt.exporter.notify import Notifier
from edgewatt.exporter.otel_resource import machine_id, resource_attributes
from edgewatt.exporter.saved_state import SavedState
from edgewatt.exporter.statefile import StateFile
from edgewatt.exporter.write_budget import WriteBudget

log = logging.getLogger(__name__)


class Daemon:
    """Built whole, nothing assigned later: both endpoints bound, the saved registrations
    restored, the power reader and collectors started, the sampler given them; start()
    then serves, stop() ends it all."""

    def __init__(self, config: Config) -> None:
        limit_arenas()  # before its threads start: what they free is reused, not kept apart
        self.config = config
        self.stop_event = threading.Event()
        proc = config.proc_path
        self.carbon = resolve_carbon(config.carbon_intensity_g_per_kwh, config.carbon_country)
        # Every per-user share (targets, API and /metrics connections, state writes)
        # is a person's.
        self.persons = Persons(config.subuid_path)
        budget = WriteBudget(config.state_write_budget, person=self.persons.of)
        statefile = StateFile(Path(config.state_dir), procfs.boot_id(proc), budget)
        roots = config.roots()
        self.context = ContextLog(lambda: read_context(roots), config.context_interval)
        self.saved = SavedState(statefile)
        self.table = TargetTable(
            config.targets.limits(),
            Resolver(
                procfs.boot_time(proc),
                procfs.CLOCK_TICKS,
                proc,
                lookups=Lookups(person=self.persons.of),
            ),
            on_change=self.saved.save,
            carbon=self.carbon,
            person=self.persons.of,
            context=self.context,
        )
        self.persons.in_use = self.table.uids  # a uid learned as a person's, kept while held
        resource = resource_attributes(config, machine_id() or statefile.instance_id(), self.carbon)
        self.outputs = outputs.build(config, resource, lambda: self.config)
        self.exposition = self.outputs.exposition
        self.platform = LinuxPlatform(proc)
        self.notifier = Notifier()
        # Power sources that loaded but cannot measure here, and why (/healthz, doctor).
        self.power_aside: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self._started = time.time()
        self._may_join_namespaces = procfs.may_join_namespaces()  # a container's own
        # Both endpoints first: a port or socket in use fails here, before a power
        # reader or a netlink listener was started (and would be left behind).
        self.metrics_port = self._bind_metrics()
        self.api = self._bind_api()
        self._restored = self.saved.restore(self.table, procfs.pid_max(proc))
        power_meter = self._start_power()
        self.collectors = start_collectors(config, self.platform, self.table, self.persons.of)
        self.sampler = Sampler(
            self.table,
            interval=config.interval,
            host_name=config.host_name,
            on_pass=self._on_pass,
            power=power_meter,
            attribution=Attribution(config.idle_power_w, config.baseline_window),
            carbon=self.carbon,
            parts=self.collectors.parts,
            context=lambda: self.context.latest,
        )

    def _on_pass(self, snapshot: Any) -> None:
        for output in self.outputs.by_name.values():
            output.update(snapshot)
        # Pinged from the sampling loop itself: a stalled sampler stops the pings.
        self.notifier.watchdog()
        self.notifier.status(_status(snapshot))

    def ready(self) -> None:
        """Tell systemd the daemon serves (again), with its status line."""
        self.notifier.ready(_status(self.sampler.snapshot))

    def reload(self, config: Config) -> None:
        """SIGHUP (reload.py): the changed live keys applied, the others named."""
        self.notifier.reloading()
        change = reloading.change(self.config, config)
        self.config = change.config  # first: the OTLP exporter is rebuilt from it
        reloading.apply(self, change)
        self.ready()
        log.info(
            "configuration reloaded%s",
            f": applied {', '.join(change.live)}" if change.live else "",
        )

    def health(self) -> dict[str, Any]:
        sampler = self.sampler
        facts = health.Facts(
            started=self._started,
            interval_s=self.config.interval,
            min_interval_s=self.config.min_interval,
            exited_retention_s=self.config.exited_retention,
            logical_cpus=sampler.logical_cpus,
            collectors=self.collectors,
            membership=self.table.membership,
            other_namespaces=self._may_join_namespaces,
            state_error=self.saved.error,
            state_deferred=self.saved.statefile.deferred,
            power_aside=self.power_aside,
        )
        power = sampler.power.status() if sampler.power else PowerStatus()
        return health.document(
            sampler.snapshot, power, self.outputs.statuses(), facts, now=time.time()
        )

    def _start_power(self) -> PowerMeter | None:
        options = self.config.power
        sources = power.discover(options, self.power_aside)
        if sources:
            # A sensor silent for five intervals (at least 5 s) is no longer trusted.
            gap = max(5 * self.config.interval, 5.0)
            return PowerMeter(
                sources,
                max_gap_s=gap,
                sample_hz=options.sample_hz,
                window_hz=options.window_hz,
            ).start()
        return None

    def _bind_metrics(self) -> int:
        host, port = self.config.listen
        try:
            return self.exposition.bind(host, port, self.persons.of)
        except OSError as exc:
            raise StartError(
                f"cannot listen for /metrics on {host}:{port}: {os.strerror(exc.errno or 0)}; "
                "another edgewatt or exporter has it? choose another with --listen HOST:PORT"
            ) from exc

    def _bind_api(self) -> ApiServer:
        try:
            context = ApiContext(
                self.table,
                logical_cpus=self.platform.logical_cpus(),
                health=self.health,
                host=lambda: documents.host(
                    self.sampler.snapshot, self.outputs.recent_power.average_w()
                ),
                sample_units=SAMPLE_UNITS,
                proc=self.config.proc_path,
                sample_now=self._sample_now,
                sample_edge=lambda target_id, until: self.sampler.sample_edge(target_id, until),
                wait_settled=self._wait_settled,
                min_interval=self.config.min_interval,
                person=self.persons.of,
                pass_key=lambda: self.sampler.snapshot.sequence,
            )
            return ApiServer(self.config.socket, context, self.persons.of_peer)
        except OSError as exc:
            self.exposition.shutdown()
            raise StartError(f"cannot serve the API at {self.config.socket}: {exc}") from exc

    def start(self) -> None:
        """Serve: the endpoints were bound and the parts built by the constructor."""
        self.context.start()
        self.sampler.sample_once()  # the first scrape already has data
        for output in self.outputs.by_name.values():
            output.start()
        self._spawn("api", self.api.serve_forever)
        self._spawn("sampler", self.sampler.run, self.stop_event)
        self._spawn("state", self.saved.run, self.stop_event)
        self.ready()
        log.info(
            "edgewatt %s serving: api unix:%s, metrics http://%s:%d/metrics, interval %gs, "
            "%d registration(s) restored",
            __version__,
            self.config.socket,
            self.config.listen[0],
            self.metrics_port,
            self.config.interval,
            self._restored,
        )

    def _sample_now(self, target_id: str | None = None) -> Snapshot:
        """A pass on demand (the API's edges): the sampler is built after the API."""
        return self.sampler.sample_now(target_id)

    def _wait_settled(self, timeout_s: float) -> None:
        """Until the power readings after now have come (at most ``timeout_s``): a
        caller asking for final figures (?final=S), as no edge waits."""
        if self.sampler.power is not None:
            self.sampler.power.wait_settled(time.monotonic(), timeout_s)

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        name_thread(thread)
        self._threads.append(thread)

    def stop(self) -> None:
        began = time.monotonic()
        self.notifier.stopping()
        self.stop_event.set()
        self.sampler.wake()
        self.saved.wake()
        self.context.close()
        self.api.close()
        for thread in self._threads:
            thread.join(timeout=1.0)
        # Last writes once the sampler has ended, the final samples with them: all of
        # the stop within STOP_WRITE_S, whatever a server does.
        for output in self.outputs.by_name.values():
            output.stop(began + STOP_WRITE_S)
        self.table.persist()
        self.saved.close()
        log.info("edgewatt stopped")


# Seconds a stop may spend, its last write to InfluxDB included: the daemon exits
# within 5 s whatever the server does (docs/reference.md).
STOP_WRITE_S = 4.5
# The most descriptors asked for when the hard limit is unlimited (the kernel's
# default nr_open).
MAX_OPEN_FILES = 1 << 20
# /proc files a lone target keeps open: stat, io, schedstat, status (its context
# switches) and its fd directory.
FILES_PER_TARGET = 5


def _status(snapshot: Snapshot) -> str:
    """systemd's status line: the targets and the device's power."""
    n = len(snapshot.processes)
    power = snapshot.power.host_power_w if snapshot.power else None
    return f"{n} target{'s' if n != 1 else ''}" + (
        f", device {power:.2f} W" if power is not None else ""
    )


class StartError(Exception):
    """The daemon cannot start; the message says what is in the way and the fix."""


def raise_open_files_limit() -> int:
    """Lift the soft limit on open files to the hard one; returns the soft limit now.

    Each target keeps FILES_PER_TARGET /proc files open, plus some for its
    descendants: max_targets (1000) of them need more than the 1024
    that systemd and most shells give by default, while the hard limit is far higher.
    """
    soft, hard = getrlimit(RLIMIT_NOFILE)
    wanted = MAX_OPEN_FILES if hard == RLIM_INFINITY else hard
    if soft != RLIM_INFINITY and soft < wanted:
        try:
            setrlimit(RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d: %s", soft, exc)
    return soft


def serve(config: Config, reload: Callable[[], Config] | None = None) -> int:
    """Run until SIGTERM/SIGINT; on SIGHUP, ``reload()`` gives the new configuration."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # A client decides how often a line is logged: bounded per kind (log_limit.py).
    limit_handlers(logging.getLogger(), KindLimit())
    open_files = raise_open_files_limit()
    if open_files < FILES_PER_TARGET * config.max_targets:
        log.warning(
            "open files limit %d is below %d per target for max_targets %d: "
            "raise LimitNOFILE (systemd) or ulimit -n",
            open_files,
            FILES_PER_TARGET,
            config.max_targets,
        )
    # The handlers only note the signal: a handler runs between two bytecodes of the
    # main thread and must take no lock (it may hold the very one). The wakeup fd
    # wakes the main thread's select, so nothing polls while nothing happens. They are
    # in place before the daemon starts: a SIGTERM while it starts (a client may
    # already be answered) is handled as a clean stop right after, not a kill.
    received: list[int] = []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: received.append(signum))
    try:
        daemon = Daemon(config)
        daemon.start()
    except (StartError, OSError) as exc:
        log.error("cannot start: %s", exc)
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
        return 2
    while not daemon.stop_event.is_set():
        select.select([wake_r], [], [])  # only a signal sets stop_event, and wakes this
        with contextlib.suppress(BlockingIOError):
            os.read(wake_r, 512)
        while received:
            signum = received.pop(0)
            if signum != signal.SIGHUP:
                log.info("received %s, stopping", signal.Signals(signum).name)
                daemon.stop_event.set()
            elif reload is not None:
                try:
                    daemon.reload(reload())
                except ConfigError as exc:
                    log.error("reload refused, keeping the running configuration: %s", exc)
                    daemon.ready()
    signal.set_wakeup_fd(-1)
    os.close(wake_r)
    os.close(wake_w)
    daemon.stop()
    return 0
