"""Wiring: config -> table -> sampler -> exposition and OTLP push; the API, signals, shutdown."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from resource import RLIM_INFINITY, RLIMIT_NOFILE, getrlimit, setrlimit
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from edgewatt.core import __version__, power
from edgewatt.core.carbon import CarbonIntensity, resolve_carbon
from edgewatt.core.platforms.linux import LinuxPlatform
from edgewatt.core.power.attribution import Attribution
from edgewatt.core.power.meter import PowerMeter
from edgewatt.core.power.recent import RecentPower
from edgewatt.core.sampler import Sampler
from edgewatt.core.sampling import procfs
from edgewatt.core.snapshot import Snapshot
from edgewatt.core.targets import SAMPLE_UNITS, Limits, Resolver, TargetError, TargetTable
from edgewatt.core.text import printable
from edgewatt.exporter import documents
from edgewatt.exporter.api import ApiContext, ApiServer
from edgewatt.exporter.collectors import start_collectors
from edgewatt.exporter.config import KEYS, WHERE, Config, ConfigError
from edgewatt.exporter.exposition import Exposition
from edgewatt.exporter.influx import InfluxPusher
from edgewatt.exporter.notify import Notifier
from edgewatt.exporter.otlp import build_reader
from edgewatt.exporter.registration import InvalidRegistration, parse_saved
from edgewatt.exporter.statefile import StateFile
from edgewatt.exporter.telemetry import OtelPipeline

log = logging.getLogger(__name__)


def machine_id() -> str:
    """The machine's id (stable across restarts and reinstalls), "" where it has none."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


# OTel semconv host.arch values for what the kernel calls the machine.
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm32",
    "ppc64le": "ppc64",
    "s390x": "s390x",
}


def device_facts(proc: str = "/proc", etc: str = "/etc") -> dict[str, str]:
    """The board's model (device tree) and the Jetson Linux (L4T) release, where present."""
    facts = {}
    try:
        model = Path(f"{proc}/device-tree/model").read_bytes().rstrip(b"\0").decode().strip()
    except (OSError, UnicodeDecodeError):
        model = ""
    if model:
        facts["device.model.name"] = model
    try:
        first = Path(f"{etc}/nv_tegra_release").read_text().splitlines()[0]
    except (OSError, IndexError):
        first = ""
    # "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, ..."
    match = re.match(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", first)
    if match:
        facts["edgewatt.l4t.release"] = f"{match[1]}.{match[2]}"
    return facts


def build_resource(
    config: Config, instance_id: str, carbon: CarbonIntensity | None = None
) -> Resource:
    machine = platform.machine()
    defaults: dict[str, Any] = {
        "service.name": "edgewatt",
        "service.version": __version__,
        "service.instance.id": instance_id,
        "host.name": config.host_name,
        "host.arch": _ARCH.get(machine, machine),
        "os.type": "linux",
        **device_facts(config.proc_path),
    }
    if carbon is not None:
        defaults["edgewatt.carbon.intensity"] = carbon.g_per_kwh  # gCO2e/kWh
        defaults["edgewatt.carbon.intensity.source"] = carbon.source
    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the defaults.
    return Resource.create(defaults).merge(OTELResourceDetector().detect())


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stop_event = threading.Event()
        proc = config.proc_path
        self.carbon = resolve_carbon(config.carbon_intensity_g_per_kwh, config.carbon_country)
        self.statefile = StateFile(Path(config.state_dir), procfs.boot_id(proc))
        self.state_error: str | None = None  # why the last save failed; None: it worked
        self.table = TargetTable(
            Limits(
                max_targets=config.max_targets,
                max_targets_per_uid=config.max_targets_per_uid,
                history_samples=config.history_samples,
                exited_retention_s=config.exited_retention,
            ),
            Resolver(procfs.boot_time(proc), procfs.CLOCK_TICKS, proc),
            on_change=self._persist,
            carbon=self.carbon,
        )
        resource = build_resource(config, machine_id() or self.statefile.instance_id(), self.carbon)
        self.exposition = Exposition(resource)
        # The OTel SDK runs only to push: /metrics is rendered from the snapshot.
        self.pipeline = (
            OtelPipeline(
                resource,
                lambda: [self._otlp_reader()],
                series_rotation=config.series_rotation,
                max_targets=config.max_targets,
                on_resource=frozenset({"host.name"}),
            )
            if config.otlp_endpoint
            else None
        )
        self.influx = InfluxPusher(config.influx) if config.influx_url else None
        self.platform = LinuxPlatform(proc)
        # Built in start(), with its collaborators, once both endpoints are bound.
        self.sampler: Sampler
        self.notifier = Notifier()
        self.recent_power = RecentPower()
        self.api: ApiServer | None = None
        self.metrics_port = 0
        self._threads: list[threading.Thread] = []
        self._started = time.time()
        self._cgroup_traffic_problem: str | None = "not started"
        self._exact_exits = False
        self._may_join_namespaces = procfs.may_join_namespaces()  # a container's own

    def _on_pass(self, snapshot: Any) -> None:
        self.exposition.update(snapshot)
        self.recent_power.add(snapshot)
        if self.pipeline is not None:
            self.pipeline.update(snapshot)
        if self.influx is not None:
            self.influx.add(snapshot)
        # Pinged from the sampling loop itself: a stalled sampler stops the pings.
        self.notifier.watchdog()
        self.notifier.status(self._status(snapshot))

    @staticmethod
    def _status(snapshot: Any) -> str:
        n = len(snapshot.processes)
        power = snapshot.power.host_power_w if snapshot.power else None
        return f"{n} target{'s' if n != 1 else ''}" + (
            f", device {power:.2f} W" if power is not None else ""
        )

    def reload(self, config: Config) -> None:
        """SIGHUP: apply every changed key the key table marks live; name the others,
        which keep their running values until a restart, in one warning."""
        self.notifier.reloading()
        changed = [k for k in KEYS if getattr(config, k) != getattr(self.config, k)]
        live = [k for k in changed if KEYS[k].live]
        later = [k for k in changed if not KEYS[k].live]
        self.config = self.config.with_values({k: getattr(config, k) for k in live})
        components = dict.fromkeys(WHERE[k][0] for k in live)
        if "max_targets" in live:  # the OTel pipeline's cardinality limit follows it
            components["otlp"] = None
        appliers = self._appliers()
        for component in components:  # each once
            appliers[component]()
        if later:
            log.warning(
                "reload: %s changed but take%s effect only after a restart",
                ", ".join(later),
                "s" if len(later) == 1 else "",
            )
        self.notifier.ready(self._status(self.sampler.snapshot))
        log.info("configuration reloaded%s", f": applied {', '.join(live)}" if live else "")

    def _appliers(self) -> dict[str, Callable[[], None]]:
        """For each component with a live key, what brings its options (read from
        self.config) into the running daemon."""

        def daemon() -> None:
            logging.getLogger().setLevel(self.config.daemon.log_level.upper())

        def endpoints() -> None:
            if self.api is not None:
                self.api.min_interval = self.config.endpoints.min_interval

        def sampler() -> None:
            c = self.config.sampler
            self.sampler.interval = c.interval
            self.sampler.attribution.set_idle(c.idle_power_w)
            self.sampler.attribution.set_window(c.baseline_window)

        def targets() -> None:
            c = self.config.targets
            self.table.set_limits(
                max_targets=c.max_targets,
                max_targets_per_uid=c.max_targets_per_uid,
                history_samples=c.history_samples,
                exited_retention_s=c.exited_retention,
            )

        def otlp() -> None:
            if self.pipeline is not None:  # push off: kept for when a restart turns it on
                self.pipeline.reconfigure(
                    series_rotation=self.config.otlp.series_rotation,
                    max_targets=self.config.targets.max_targets,
                )

        return {
            "daemon": daemon,
            "endpoints": endpoints,
            "sampler": sampler,
            "targets": targets,
            "otlp": otlp,
        }

    def _otlp_reader(self) -> MetricReader:
        return build_reader(self.config.otlp)

    def _persist(self, state: list[dict[str, Any]]) -> None:
        """Save the registrations; a failure keeps the old file (statefile.py), is
        logged once until a save works again, and shown by /healthz meanwhile: the
        registration itself holds, only a restart would lose it."""
        try:
            self.statefile.save(state)
        except OSError as exc:
            if self.state_error is None:
                log.error(
                    "cannot persist registrations to %s (%s): the file keeps the last "
                    "state saved; registrations since are lost at a restart",
                    self.statefile.path,
                    exc,
                )
            self.state_error = f"{self.statefile.path}: {exc}"
            return
        if self.state_error is not None:
            log.info("registrations persisted to %s again", self.statefile.path)
        self.state_error = None

    def restore(self) -> int:
        """Register the saved entries again, each checked as a new registration is
        (fields, labels, and who may watch the live process); one log line per entry
        skipped."""
        restored = 0
        pid_max = procfs.pid_max(self.config.proc_path)
        for n, entry in enumerate(self.statefile.load()):
            try:
                saved = parse_saved(entry, pid_max)
                request = saved.registration
                kept = {
                    "target_id": saved.target_id,
                    "registered_at": saved.registered_at,
                    "holders": saved.holders,
                }
                if request.cgroup is not None:  # resolved anew: it may have restarted
                    self.table.register_cgroup(
                        request.cgroup, request.labels, saved.uid, limited=False, **kept
                    )
                else:
                    self.table.register(
                        request.pid,
                        request.labels,
                        request.children,
                        saved.uid,
                        expect_start=saved.start_ticks,
                        **kept,
                    )
                restored += 1
            except (InvalidRegistration, TargetError) as exc:
                name = entry.get("id") if isinstance(entry, dict) else None
                name = printable(name[:64]) if isinstance(name, str) else f"#{n + 1}"
                log.info("not restoring registration %s: %s", name, exc)
        self.table.persist()
        return restored

    def health(self) -> dict[str, Any]:
        snapshot = self.sampler.snapshot
        speaking = list(snapshot.power.sources) if snapshot.power else []
        power = self.sampler.power.status() if self.sampler.power else None
        # A source found at startup that no longer speaks (a tegrastats restarting,
        # a sensor gone): its hw_* series are absent meanwhile, so health says so.
        silent = [name for name in power.sources if name not in speaking] if power else []
        return {
            "status": "degraded" if silent or self.state_error else "ok",
            "version": __version__,
            "uptime_s": round(time.time() - self._started, 3),
            "targets": len(snapshot.processes),
            "last_sample_age_s": round(time.time() - snapshot.time, 3),
            "interval_s": self.config.interval,
            "min_interval_s": self.config.min_interval,
            # How long a finished target stays readable (`edgewatt status` says so).
            "exited_retention_s": self.config.exited_retention,
            "logical_cpus": self.sampler.logical_cpus,
            "power_sources": speaking,
            "power_sources_silent": silent,
            # The power reader's rate now (chosen on the device unless configured), and
            # what a reading costs its thread in CPU, wake included (None: not yet known).
            "power_sample_hz": power.sample_hz if power else None,
            # What reads the stream: "native" (built at install), "python" or "none".
            "power_reader": power.reader if power else None,
            "power_reading_cpu_us": round(power.reading_cpu_s * 1e6, 1)
            if power and power.reading_cpu_s
            else None,
            # Young windows' rate (0: none), the readings taken at it since start, and
            # the windows opened when its allowance was spent (read at the steady rate).
            "power_window_hz": power.window_hz if power else None,
            "power_window_readings": power.window_readings if power else None,
            "power_windows_refused": power.windows_refused if power else None,
            # Whether a target's figures end at its exit (the kernel's exit records and
            # TCP destroy notifications, CAP_NET_ADMIN) or at the last pass before it.
            "exit_figures": "exact" if self._exact_exits else "last-sample",
            # How a target's descendants are learnt (sampling/membership.py).
            "membership": self.table.membership,
            # Cgroup targets' network figures: None where counted, else why not.
            "cgroup_traffic": self._cgroup_traffic_problem,
            "cgroup_other_namespaces": self._may_join_namespaces,
            # Why the registrations could not be saved (null: the last save worked).
            "state_error": self.state_error,
            # The InfluxDB push (null where none is configured): lines waiting in the
            # buffer, written, dropped from a full buffer, refused by the server.
            "influx": self.influx.status() if self.influx is not None else None,
        }

    def _start_power(self) -> PowerMeter | None:
        options = self.config.power
        sources = power.discover(options)
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

    def start(self) -> None:
        # Both endpoints first: a port or socket in use fails here, before a power
        # reader or a netlink listener was started (and would be left behind).
        host, port = self.config.listen
        try:
            self.metrics_port = self.exposition.bind(host, port)
        except OSError as exc:
            raise StartError(
                f"cannot listen for /metrics on {host}:{port}: {os.strerror(exc.errno or 0)}; "
                "another edgewatt or exporter has it? choose another with --listen HOST:PORT"
            ) from exc
        try:
            context = ApiContext(
                self.table,
                logical_cpus=self.platform.logical_cpus(),
                health=self.health,
                host=lambda: documents.host(self.sampler.snapshot, self.recent_power.average_w()),
                sample_units=SAMPLE_UNITS,
                proc=self.config.proc_path,
                sample_now=self._sample_now,
                min_interval=self.config.min_interval,
            )
            self.api = ApiServer(self.config.socket, context)
        except OSError as exc:
            self.exposition.shutdown()
            raise StartError(f"cannot serve the API at {self.config.socket}: {exc}") from exc
        restored = self.restore()
        power_meter = self._start_power()
        collectors = start_collectors(self.config, self.platform, self.table)
        self._exact_exits = collectors.exact_exits
        self._cgroup_traffic_problem = collectors.cgroup_traffic_problem
        self.sampler = Sampler(
            self.table,
            interval=self.config.interval,
            host_name=self.config.host_name,
            on_pass=self._on_pass,
            power=power_meter,
            attribution=Attribution(self.config.idle_power_w, self.config.baseline_window),
            carbon=self.carbon,
            parts=collectors.parts,
        )
        self.sampler.sample_once()  # the first scrape already has data
        self.exposition.serve()
        if self.influx is not None:
            self.influx.start()
        self._spawn("api", self.api.serve_forever, 0.2)
        self._spawn("sampler", self.sampler.run, self.stop_event)
        self.notifier.ready(self._status(self.sampler.snapshot))
        log.info(
            "edgewatt %s serving: api unix:%s, metrics http://%s:%d/metrics, interval %gs, "
            "%d registration(s) restored",
            __version__,
            self.config.socket,
            host,
            self.metrics_port,
            self.config.interval,
            restored,
        )

    def _sample_now(self, target_id: str | None = None) -> Snapshot:
        """A pass on demand (the API's edges): the sampler is built once the API is."""
        return self.sampler.sample_now(target_id)

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        began = time.monotonic()
        self.notifier.stopping()
        self.stop_event.set()
        self.sampler.wake()
        if self.api is not None:
            self.api.close()
        self.exposition.shutdown()
        if self.pipeline is not None:
            self.pipeline.shutdown()
        for thread in self._threads:
            thread.join(timeout=1.0)
        if self.influx is not None:
            # A last write of what is queued, the final samples with it: all of the stop
            # within STOP_WRITE_S, whatever the server does.
            self.influx.close(timeout_s=max(0.0, began + STOP_WRITE_S - time.monotonic()))
        self.table.persist()
        self.statefile.close()
        log.info("edgewatt stopped")


# Seconds a stop may spend, its last write to InfluxDB included: the daemon exits
# within 5 s whatever the server does (docs/reference.md).
STOP_WRITE_S = 4.5
# The most descriptors asked for when the hard limit is unlimited (the kernel's
# default nr_open).
MAX_OPEN_FILES = 1 << 20
# /proc files a lone target keeps open: stat, io, schedstat and its fd directory.
FILES_PER_TARGET = 4


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
        select.select([wake_r], [], [], 5.0)  # the timeout only as a backstop
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
                    daemon.notifier.ready(daemon._status(daemon.sampler.snapshot))
    signal.set_wakeup_fd(-1)
    os.close(wake_r)
    os.close(wake_w)
    daemon.stop()
    return 0
