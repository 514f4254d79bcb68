"""`edgewatt doctor`: one line per check, each failure with its fix."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from edgewatt.core import transport
from edgewatt.core.carbon import resolve_carbon
from edgewatt.core.sampling import procfs
from edgewatt.exporter.config import Config

Check = Callable[[Config], tuple[str, str]]  # (ok | warn | FAIL, explanation)


def daemon_answers(config: Config) -> tuple[str, str]:
    try:
        health = transport.call_ok(config.socket, "GET", "/healthz", timeout=1.0)
    except (OSError, transport.DaemonError) as exc:
        return "FAIL", (
            f"no daemon at {config.socket} ({exc}); start it: sudo systemctl start edgewatt, "
            "or edgewatt serve"
        )
    sources = ", ".join(health.get("power_sources") or []) or "none"
    return (
        "ok",
        f"daemon answering at {config.socket}: {health['targets']} targets, power: {sources}",
    )


def exact_exits(config: Config) -> tuple[str, str]:
    try:
        health = transport.call_ok(config.socket, "GET", "/healthz", timeout=1.0)
    except (OSError, transport.DaemonError):
        return "ok", "exact exit figures: checked once a daemon answers"
    if health.get("exit_figures") == "exact":
        return "ok", "exact exit figures: a target's summary ends at its exit (CAP_NET_ADMIN)"
    return "warn", (
        "no exact exit figures: the daemon lacks CAP_NET_ADMIN, so what a target does after "
        "the last pass before its exit (CPU, disk, a closing connection's last bytes) is lost "
        "and summaries say exit: last-sample; the systemd unit grants it "
        "(edgewatt install-service), or run the daemon as root"
    )


def other_users_visible(config: Config) -> tuple[str, str]:
    if procfs.sees_other_users(config.proc_path):
        return "ok", "other users' /proc/PID/io and fds are readable"
    return "warn", (
        "only this user's processes can be fully read; run as root, or use the systemd "
        "unit (it grants CAP_SYS_PTRACE)"
    )


def power_sources(config: Config) -> tuple[str, str]:
    from edgewatt.core import power
    from edgewatt.core.power.source import PowerOptions

    found = power.discover(
        PowerOptions(
            interval_s=config.interval,
            sysfs_path=config.sysfs_path,
            tegrastats_path=config.tegrastats,
            sources=config.power_sources,
        )
    )
    for source in found:
        source.close()
    if not found:
        return "warn", (
            "no power source: on Jetson check /sys/bus/i2c/drivers/ina3221* or "
            f"{config.tegrastats}; on x86 RAPL needs root; NVIDIA GPUs need "
            "pip install 'edgewatt[nvidia]'"
        )
    total = next((s.name for s in found if s.board), None) or " + ".join(s.name for s in found)
    return "ok", f"power sources: {', '.join(s.name for s in found)}; device total from {total}"


def metrics_port(config: Config) -> tuple[str, str]:
    host, port = config.listen
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
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


def otlp_endpoint(config: Config) -> tuple[str, str]:
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


def carbon_intensity(config: Config) -> tuple[str, str]:
    chosen = resolve_carbon(config.carbon_intensity_g_per_kwh, config.carbon_country)
    if chosen is None:
        return "ok", (
            "no carbon intensity configured: no gCO2e figures (optional: "
            "carbon_intensity_g_per_kwh: 350, or carbon_country: DE)"
        )
    return "ok", f"carbon intensity {chosen.g_per_kwh:g} gCO2e/kWh, {chosen.source}"


def clock(config: Config) -> tuple[str, str]:
    now = time.time()
    boot = procfs.boot_time(config.proc_path)
    if time.gmtime(now).tm_year < 2025 or boot > now:
        return "FAIL", (
            f"the clock reads {time.strftime('%Y-%m-%d %H:%M', time.gmtime(now))} UTC: timestamps "
            "will be wrong; enable NTP (timedatectl set-ntp true) or set the RTC"
        )
    return "ok", f"clock {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(now))} UTC, up since boot"


CHECKS: tuple[Check, ...] = (
    daemon_answers,
    exact_exits,
    other_users_visible,
    power_sources,
    metrics_port,
    otlp_endpoint,
    carbon_intensity,
    clock,
)


def run(config: Config) -> tuple[str, int]:
    lines, failed = [], 0
    for check in CHECKS:
        try:
            verdict, text = check(config)
        except Exception as exc:  # a check that breaks is itself a finding
            verdict, text = "FAIL", f"{check.__name__} could not run: {exc}"
        failed += verdict == "FAIL"
        lines.append(f"{verdict:<4}  {text}")
    return "\n".join(lines), (1 if failed else 0)
