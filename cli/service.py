"""`edgewatt install-service`, `uninstall-service` and `config example`.

The unit is rendered here (deploy/systemd/edgewatt.service is this template with the
usual path, checked by a test), so an installed package needs nothing from the repo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from edgewatt.cli import service_env
from edgewatt.exporter.config import KEYS, shown_default

SYSTEM_UNIT = """[Unit]
Description=edgewatt: what processes cost on this device (CPU, memory, network, power)
Documentation=man:systemd.exec(5)
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={edgewatt} serve --config /etc/edgewatt/config.yaml \\
    --socket /run/edgewatt/edgewatt.sock --state-dir /var/lib/edgewatt
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
# The sampler pings every half period; a stalled sampler gets the service restarted.
WatchdogSec=30
TimeoutStopSec=10
# Ahead of the work it measures: a `track` edge is two wakes of the daemon and a pass
# (~1 ms of CPU), each behind a busy core's slice at the same priority (handler p99 6
# to 15 ms with a busy loop per core, 1.6 ms at -10: docs/performance.md). Set as
# root before the start; no capability, and its CPU is the same.
Nice=-10

# A dynamic, unprivileged user with exactly three capabilities: reading other users'
# /proc/PID/{io,fd,exe} (CAP_SYS_PTRACE), root-only files such as RAPL's energy_uj
# (CAP_DAC_READ_SEARCH), and listening to the kernel's exit records and TCP destroy
# notifications (CAP_NET_ADMIN: a target's figures end at its exit, not at the last
# pass; it costs 0.1 in systemd-analyze security's exposure). sock_diag queries,
# sysfs power monitors and tegrastats need nothing more.
DynamicUser=yes
AmbientCapabilities=CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_NET_ADMIN
CapabilityBoundingSet=CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_NET_ADMIN
RuntimeDirectory=edgewatt
RuntimeDirectoryMode=0755
StateDirectory=edgewatt
ConfigurationDirectory=edgewatt
UMask=0022

NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
RestrictNamespaces=yes
# The native power reader's one thread reads at SCHED_FIFO 1, ahead of the work it
# measures: with a busy loop per core its readings came up to 14 ms late at p99 (a
# 10 ms period), 0.1 ms at FIFO (docs/performance.md). RLIMIT_RTPRIO 1 allows that
# lowest real-time priority with no capability; a real-time thread that never blocks
# for 200 ms gets SIGXCPU (LimitRTTIME; the service restarts). Exposure 2.3 -> 2.5.
RestrictRealtime=no
LimitRTPRIO=1
LimitRTTIME=200ms
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources @mount @swap @reboot
SystemCallFilter=~@raw-io @module @obsolete @cpu-emulation @debug
SystemCallFilter=sched_setscheduler
SystemCallErrorNumber=EPERM
RemoveIPC=yes
KeyringMode=private
DevicePolicy=closed

MemoryMax=256M
TasksMax=256

[Install]
WantedBy=multi-user.target
"""

# A user unit cannot take capabilities or most of the sandbox; it monitors that
# user's processes only.
USER_UNIT = """[Unit]
Description=edgewatt for this user: what processes cost (CPU, memory, network, power)

[Service]
Type=notify
NotifyAccess=main
ExecStart={edgewatt} serve --config %E/edgewatt/config.yaml --socket %t/edgewatt.sock \\
    --state-dir %S/edgewatt --listen 127.0.0.1:9464
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
WatchdogSec=30
TimeoutStopSec=10
# Ahead of the work it measures: a `track` edge is two wakes of the daemon and a pass
# (~1 ms of CPU), each behind a busy core's slice at the same priority (handler p99 6
# to 15 ms with a busy loop per core, 1.6 ms at -10: docs/performance.md). Set as
# root before the start; no capability, and its CPU is the same.
Nice=-10
MemoryMax=256M

[Install]
WantedBy=default.target
"""


def config_example() -> str:
    """Every key, commented out at its default, with its meaning above it."""
    lines = [
        "# edgewatt daemon configuration (YAML). Every key is optional: the values shown,",
        "# commented out, are the defaults. Precedence: this file < OTEL_* and INFLUX_* <",
        "# EDGEWATT_<KEY> environment variables < command-line flags. SIGHUP applies the",
        "# keys marked so; the others need a restart.",
    ]
    for key, spec in KEYS.items():
        shown = shown_default(key)
        shown = {"unset": "null", "none": "{}"}.get(shown, shown)
        notes = [*spec.also_set_by(), *(["applied on SIGHUP"] if spec.live else [])]
        meaning = f"{spec.meaning} ({'; '.join(notes)})" if notes else spec.meaning
        lines += ["", f"# {meaning}", f"# {key}: {shown}"]
    return "\n".join(lines) + "\n"


def edgewatt_path() -> str:
    """The installed console script: on PATH, else beside this interpreter."""
    found = shutil.which("edgewatt")
    if found:
        return os.path.abspath(found)
    beside = Path(sys.executable).parent / "edgewatt"
    return str(beside) if beside.exists() else os.path.abspath(sys.argv[0])


def render_unit(user: bool, edgewatt: str | None = None) -> str:
    return (USER_UNIT if user else SYSTEM_UNIT).replace("{edgewatt}", edgewatt or edgewatt_path())


def _paths(root: Path, user: bool) -> tuple[Path, Path, list[Path]]:
    if user:
        home = Path(os.environ.get("HOME", "~")).expanduser()
        config_home = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
        state_home = Path(os.environ.get("XDG_STATE_HOME", home / ".local" / "state"))
        unit = root / str(config_home).lstrip("/") / "systemd" / "user" / "edgewatt.service"
        config = root / str(config_home).lstrip("/") / "edgewatt" / "config.yaml"
        return unit, config, [root / str(state_home).lstrip("/") / "edgewatt"]
    return (
        root / "etc/systemd/system/edgewatt.service",
        root / "etc/edgewatt/config.yaml",
        [root / "var/lib/edgewatt", root / "var/lib/private/edgewatt"],
    )


def _systemctl(user: bool, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if user else []), *args]


def install(
    root: Path,
    user: bool,
    dry_run: bool,
    out: TextIO = sys.stdout,
    hidden: tuple[str, ...] = service_env.HIDDEN,
) -> int:
    """Write the unit and a config (kept when one exists), then enable and start it.
    ``hidden``: the folders the system unit's sandbox hides (tests widen it)."""
    unit_path, config_path, _ = _paths(root, user)
    why_copy = None if user else service_env.needs_copy(hidden)
    env = root / service_env.SERVICE_ENV
    if why_copy is None:
        unit = render_unit(user)
    else:
        unit = render_unit(user, f"/{service_env.SERVICE_ENV}/bin/python -m edgewatt.cli")
    commands = [_systemctl(user, "daemon-reload"), _systemctl(user, "enable", "--now", "edgewatt")]
    write_config = not config_path.exists()
    if dry_run:
        if why_copy is not None:
            print(f"# would copy edgewatt and its dependencies into {env} ({why_copy})", file=out)
        print(f"# would write {unit_path}:", file=out)
        print(unit, file=out)
        if write_config:
            print(f"# would write {config_path} (none exists):", file=out)
            print(config_example(), file=out)
        else:
            print(f"# would keep the existing {config_path}", file=out)
        for command in commands:
            print("# would run: " + " ".join(command), file=out)
        return 0
    if why_copy is not None:
        try:
            copied = service_env.copy_environment(env, hidden)
        except (service_env.CannotRelocate, OSError, subprocess.CalledProcessError) as exc:
            print(f"edgewatt install-service: {why_copy}, and {exc}", file=sys.stderr)
            return 1
        print(
            f"copied edgewatt and {copied - 1} dependencies into {env}: {why_copy}. "
            "Run install-service again after upgrading edgewatt.",
            file=out,
        )
    unit_path.parent.mkdir(parents=True, exist_ok=True)
    unit_path.write_text(unit)
    print(f"wrote {unit_path}", file=out)
    if write_config:
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(config_example())
        print(f"wrote {config_path}", file=out)
    else:
        print(f"kept the existing {config_path}", file=out)
    if str(root) != "/":
        print("not running systemctl: installed under " + str(root), file=out)
        return 0
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{' '.join(command)} failed: {result.stderr.strip()}", file=sys.stderr)
            return 1
    print("edgewatt is enabled and running; `edgewatt status` lists its targets", file=out)
    return 0


def uninstall(root: Path, user: bool, purge: bool, out: TextIO = sys.stdout) -> int:
    unit_path, config_path, state_dirs = _paths(root, user)
    if str(root) == "/":
        subprocess.run(_systemctl(user, "disable", "--now", "edgewatt"), capture_output=True)
    if unit_path.exists():
        unit_path.unlink()
        print(f"removed {unit_path}", file=out)
    env = root / service_env.SERVICE_ENV
    if not user and service_env.remove_environment(env):
        print(f"removed {env}", file=out)
    if str(root) == "/":
        subprocess.run(_systemctl(user, "daemon-reload"), capture_output=True)
    if purge:
        for path in (config_path.parent, *state_dirs):
            if path.exists():
                shutil.rmtree(path)
                print(f"removed {path}", file=out)
    else:
        print(f"kept {config_path.parent} and the state directory (--purge removes them)", file=out)
    return 0
