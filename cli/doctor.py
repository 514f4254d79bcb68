"""`edgewatt doctor`: one line per check, each failure with its fix."""

from __future__ import annotations

import socket
import time
import typing  # runtime aliases: Python 3.8's builtins and abc take no [...]
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from edgewatt.core import transport
from edgewatt.core.carbon import resolve_carbon
from edgewatt.core.facts import procfs
from edgewatt.core.text import printable
from edgewatt.exporter.config import Config


@dataclass(frozen=True)
class Context:
    """What every check may read: the config, and the daemon found (looked up once)."""

    config: Config
    found: transport.Found
    health: dict[str, Any] | None  # the daemon's /healthz; None when none answers


Check = typing.Callable[[Context], typing.Tuple[str, str]]  # (ok | warn | FAIL, explanation)


def look_up(config: Config, socket_path: str | None) -> Context:
    found = transport.find_daemon(socket_path)
    health = None
    if found.path is not None:
        try:
            health = transport.call_ok(found.path, "GET", "/healthz", timeout=1.0)
        except (OSError, transport.DaemonError) as exc:
            found = transport.Found(None, f"{found.looked}: {exc}")
    return Context(config, found, health)


def daemon_answers(ctx: Context) -> tuple[str, str]:
    if ctx.health is None:
        return "FAIL", (
            f"no daemon answering; looked at {ctx.found.looked}; start it: "
            "sudo systemctl start edgewatt, or edgewatt serve"
        )
    sources = ", ".join(ctx.health.get("power_sources") or []) or "none"
    return "ok", (
        f"daemon answering at {ctx.found.looked}: {ctx.health['targets']} targets, power: {sources}"
    )


def exact_exits(ctx: Context) -> tuple[str, str]:
    if ctx.health is None:
        return "ok", "exact exit figures: checked once a daemon answers"
    if ctx.health.get("exit_figures") == "exact":
        return "ok", "exact exit figures: a target's summary ends at its exit (CAP_NET_ADMIN)"
    return "warn", (
        "no exact exit figures: the daemon lacks CAP_NET_ADMIN, so what a target does after "
        "the last pass before its exit (CPU, disk, a closing connection's last bytes) is lost "
        "and summaries say exit: last-sample; the systemd unit grants it "
        "(edgewatt install-service), or run the daemon as root"
    )


def lineage(ctx: Context) -> tuple[str, str]:
    if ctx.health is None:
        return "ok", "descendants: checked once a daemon answers"
    if ctx.health.get("membership") == "lineage":
        return "ok", (
            "descendants: every process a target forks is counted until it exits, wherever "
            "it is re-parented (the kernel's process events)"
        )
    return "warn", (
        "descendants are found by the parent links each pass sees: a process whose parent "
        "chain to the target ended between two passes (a double fork) escapes it, and "
        "summaries say membership: parent-links; the systemd unit grants CAP_NET_ADMIN "
        "(edgewatt install-service), or run the daemon as root"
    )


def other_users_visible(ctx: Context) -> tuple[str, str]:
    if ctx.health is not None:
        return "ok", "reading other users' processes: up to the daemon (its uid, its caps)"
    if procfs.sees_other_users(ctx.config.proc_path):
        return "ok", "other users' /proc/PID/io and fds are readable"
    return "warn", (
        "only this user's processes can be fully read; run as root, or use the systemd "
        "unit (it grants CAP_SYS_PTRACE)"
    )


# /dev/vcio is root:video 0660: the video group is all the daemon's user needs.
VIDEO_GROUP_FIX = (
    "/dev/vcio is root:video 0660: add the daemon's user to the video group (sudo "
    "usermod -aG video USER; in a systemd unit, SupplementaryGroups=video and the device "
    "allowed)"
)


def power_sources(ctx: Context) -> tuple[str, str]:
    from edgewatt.core import power
    from edgewatt.core.power import pi5

    pi = pi5.board_model(ctx.config.power.sysfs_path)  # a board whose PMIC pi5 reads
    if ctx.health is not None:  # what the daemon reads, not what this user could
        daemon = ctx.health.get("power_sources") or []
        if pi is not None and "pi5" not in daemon:
            return "warn", (
                f"the daemon does not read this {pi}'s PMIC (it runs vcgencmd pmic_read_adc "
                f"from its PATH, which opens /dev/vcio): {VIDEO_GROUP_FIX}"
            )
        stepped = _aside(ctx.health.get("power_sources_aside") or {})
        if daemon:
            return "ok", f"power sources (the daemon's): {', '.join(daemon)}{stepped}"
        return "warn", (
            "the daemon found no power source: on Jetson check /sys/bus/i2c/drivers/ina3221* "
            "or the tegrastats path in its config; on x86 RAPL needs root; NVIDIA GPUs need "
            f"pip install 'edgewatt[nvidia]' in the daemon's environment{stepped}"
        )
    config = ctx.config
    aside: dict[str, str] = {}
    found = power.discover(config.power, aside)
    for source in found:
        source.close()
    if pi is not None and not any(s.name == "pi5" for s in found):
        why = pi5.vcio_problem() or "vcgencmd pmic_read_adc gave no rails (is it on PATH?)"
        return "warn", f"this {pi}'s PMIC cannot be read as this user: {why}; {VIDEO_GROUP_FIX}"
    if not found:
        return "warn", (
            "no power source: on Jetson check /sys/bus/i2c/drivers/ina3221* or "
            f"{config.tegrastats}; on x86 RAPL needs root; NVIDIA GPUs need "
            f"pip install 'edgewatt[nvidia]'{_aside(aside)}"
        )
    total = next((s.name for s in found if s.board), None) or " + ".join(s.name for s in found)
    return "ok", (
        f"power sources (none running; as this user): {', '.join(s.name for s in found)}; "
        f"device total from {total}{_aside(aside)}"
    )


def _aside(aside: dict[str, str]) -> str:
    """The sources that loaded but cannot measure, and why (the next were used)."""
    return "".join(f"; {name} steps aside: {why}" for name, why in sorted(aside.items()))


# Where each fact of the device's context is read, as doctor names an absent one
# (clocks_pinned is derived from the clocks).
CONTEXT_SOURCES = {
    "model": "device-tree model",
    "l4t_release": "nv_tegra_release",
    "power_mode": "nvpmodel",
    "cpu_clocks": "cpufreq",
    "devfreq_clocks": "devfreq",
    "overcurrent_events": "over-current counters",
    "hottest_zone": "thermal zones",
    "pi_throttled": "vcgencmd get_throttled",
}


def device_context(ctx: Context) -> tuple[str, str]:
    """What the summaries will say of the board's setting, read as this user reads it
    (the configured roots, this PATH's nvpmodel and vcgencmd)."""
    from edgewatt.core.platforms import context

    found = context.read(ctx.config.roots())
    mode, pinned, zone = found.power_mode, found.clocks_pinned, found.hottest_zone
    parts = [
        found.model and f"model {found.model}",
        found.l4t_release and f"L4T {found.l4t_release}",
        mode and f"power mode {mode.name}" + ("" if mode.id is None else f" ({mode.id})"),
        pinned is not None and ("clocks pinned" if pinned else "clocks not pinned"),
        found.cpu_clocks and f"{len(found.cpu_clocks)} CPU clocks",
        found.devfreq_clocks and "devfreq " + ", ".join(c.name for c in found.devfreq_clocks),
        found.overcurrent_events is not None
        and f"over-current events {sum(found.overcurrent_events.values())}",
        zone and f"hottest zone {zone.name} {zone.celsius:g} C",
        found.pi_throttled is not None and f"throttled {hex(found.pi_throttled)}",
    ]
    shown = "; ".join(p for p in parts if p) or "nothing"
    absent = ", ".join(CONTEXT_SOURCES[k] for k in found.absent() if k in CONTEXT_SOURCES)
    return "ok", f"device context: {shown}; absent: {absent or 'none'}"


def metrics_port(ctx: Context) -> tuple[str, str]:
    config = ctx.config
    host, port = config.listen
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # As the daemon's HTTP server binds it: a stopped daemon's connections left in
        # TIME-WAIT keep no one from listening there.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    answer = b""
                    while chunk := c.recv(65536):
                        answer += chunk
                if b'service_name="edgewatt"' in answer:
                    return "ok", f"port {port} serves edgewatt's /metrics"
            except OSError:
                pass
            return (
                "FAIL",
                f"port {port} cannot be bound ({exc.strerror}); choose --listen HOST:PORT",
            )
    return "ok", f"port {port} is free for /metrics"


def otlp_endpoint(ctx: Context) -> tuple[str, str]:
    config = ctx.config
    if not config.otlp_endpoint:
        return "ok", "OTLP push not configured (optional: --otlp-endpoint URL)"
    parts = urlsplit(config.otlp_endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 4318)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=2).close()
    except OSError as exc:
        return (
            "FAIL",
            f"cannot reach {config.otlp_endpoint} ({exc}); check the collector and firewall",
        )
    return "ok", f"OTLP endpoint {config.otlp_endpoint} reachable"


def carbon_intensity(ctx: Context) -> tuple[str, str]:
    config = ctx.config
    chosen = resolve_carbon(config.carbon_intensity_g_per_kwh, config.carbon_country)
    if chosen is None:
        return "ok", (
            "no carbon intensity configured: no gCO2e figures (optional: "
            "carbon_intensity_g_per_kwh: 350, or carbon_country: DE)"
        )
    return "ok", f"carbon intensity {chosen.g_per_kwh:g} gCO2e/kWh, {chosen.source}"


def clock(ctx: Context) -> tuple[str, str]:
    config = ctx.config
    now = time.time()
    boot = procfs.boot_time(config.proc_path)
    if time.gmtime(now).tm_year < 2025 or boot > now:
        return "FAIL", (
            f"the clock reads {time.strftime('%Y-%m-%d %H:%M', time.gmtime(now))} UTC: timestamps "
            "will be wrong; enable NTP (timedatectl set-ntp true) or set the RTC"
        )
    return "ok", f"clock {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(now))} UTC, up since boot"


def cgroup_targets(ctx: Context) -> tuple[str, str]:
    if ctx.health is None:
        return "ok", "cgroup targets: checked once a daemon answers"
    problem = ctx.health.get("cgroup_traffic")
    if problem is not None:
        return "warn", (
            f"cgroup targets (containers, units, edgewatt run --cgroup) have CPU, memory and "
            f"storage but no network figures: {problem}; the daemon needs CAP_NET_ADMIN, "
            "libnftables (apt-get install nftables) and cgroup v2"
        )
    if not ctx.health.get("cgroup_other_namespaces"):
        return "ok", (
            "cgroup targets: every byte counted in the host's network namespace; a container "
            "with a namespace of its own by the frames of its interfaces (entering it "
            "needs CAP_SYS_ADMIN; docs/reference.md, Cgroup targets)"
        )
    return "ok", "cgroup targets: every byte of their traffic, containers' namespaces included"


def run_placement(ctx: Context) -> tuple[str, str]:
    from edgewatt.cli import run_cgroup  # cgroups are Linux's

    why = run_cgroup.process_target_reason()
    fix = "run it as root, or with a systemd user manager (loginctl enable-linger USER)"
    if why is None and ctx.health is not None and ctx.health.get("cgroup_traffic"):
        why = "the daemon cannot count a cgroup's traffic, as the line above says"
        fix = "the daemon's fix is in that line"
    if why is None:
        return "ok", (
            "edgewatt run: its command gets a cgroup of its own, every connection counted"
        )
    return "warn", f"edgewatt run makes process targets here ({why}): {run_cgroup.COST}; {fix}"


CHECKS: tuple[Check, ...] = (
    daemon_answers,
    exact_exits,
    lineage,
    cgroup_targets,
    run_placement,
    other_users_visible,
    power_sources,
    device_context,
    metrics_port,
    otlp_endpoint,
    carbon_intensity,
    clock,
)


def run(config: Config, socket_path: str | None = None) -> tuple[str, int]:
    """Every check, one line each; exit status 1 when any failed. ``socket_path``: the
    daemon to check (default: looked for as the client looks)."""
    ctx = look_up(config, socket_path)
    lines, failed = [], 0
    for check in CHECKS:
        try:
            verdict, text = check(ctx)
        except Exception as exc:  # a check that breaks is itself a finding
            verdict, text = "FAIL", f"{check.__name__} could not run: {exc}"
        failed += verdict == "FAIL"
        lines.append(f"{verdict:<4}  {printable(text)}")  # quotes what the daemon said
    return "\n".join(lines), (1 if failed else 0)
