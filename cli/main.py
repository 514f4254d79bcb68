"""The `edgewatt` command: serve (the daemon), run, register, summary, status and more."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence

from edgewatt.core import __version__

# Flags users reach for that edgewatt spells otherwise (other exporters' habits).
FLAG_HINTS = {
    "--port": "--listen HOST:PORT",
    "--host": "--listen HOST:PORT",
    "--bind": "--listen HOST:PORT",
    "--web.listen-address": "--listen HOST:PORT",
    "--labels": "--label KEY=VALUE",
    "--out": "--output FILE.jsonl",
}


def unknown_flags(extra: list[str], sub: argparse.ArgumentParser) -> str:
    """What to say about flags a subcommand does not know: each with its closest."""
    import difflib

    known = [o for action in sub._actions for o in action.option_strings]
    parts: list[str] = []
    after_flag = False
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("-"):
            if not after_flag:  # else it is the unknown flag's value
                parts.append(f"unexpected argument {arg!r}")
            after_flag = False
            continue
        after_flag = "=" not in arg
        hint = FLAG_HINTS.get(flag)
        if hint is None or hint.split()[0] not in known:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = close[0] if close else None
        parts.append(f"unknown flag {flag}" + (f" (did you mean {hint}?)" if hint else ""))
    return "; ".join(parts)


def unknown_command(command: str, known: list[str]) -> str:
    """What to say about a subcommand edgewatt lacks: its closest, and the list."""
    import difflib

    close = difflib.get_close_matches(command, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown command {command!r}{hint}; the commands: {', '.join(known)}"


def _parser(
    serve_flags: bool = True,
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="edgewatt", description="Measure what processes really cost on this device."
    )
    parser.add_argument("--version", action="version", version=f"edgewatt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the daemon in the foreground",
        description="Run the daemon. Precedence: defaults < --config YAML < EDGEWATT_* "
        "environment < these flags.",
    )
    serve.add_argument("--config", metavar="PATH", help="YAML file of config keys")
    if serve_flags:  # declared with the config keys; imported only for `serve`
        from edgewatt.exporter.config import add_flags

        add_flags(serve)

    run = sub.add_parser(
        "run",
        help="run a command, monitored",
        description="Run CMD monitored (by the daemon when one answers) and print a summary.",
    )
    run.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--output", metavar="FILE.jsonl", help="write samples as JSON Lines")
    run.add_argument("--interval", type=float, default=1.0, metavar="SECONDS")
    run.add_argument(
        "--emissions",
        metavar="FILE.csv",
        help="append the run's row to codecarbon's emissions.csv (measured energy)",
    )
    run.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")
    placement = run.add_mutually_exclusive_group()
    placement.add_argument(
        "--cgroup",
        dest="cgroup",
        action="store_const",
        const="insist",
        default="auto",
        help="insist on a cgroup of its own for CMD (exact CPU, every byte of its "
        "traffic): without one, CMD is not run (exit status 2). By default CMD gets one "
        "where it can (root, a delegated cgroup, the user's systemd manager), else it is "
        "a process target, said in one line",
    )
    placement.add_argument(
        "--no-cgroup",
        dest="cgroup",
        action="store_const",
        const="no",
        help="a process target, without a line about it: a connection CMD opens and "
        "closes between two passes is not counted",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command")

    report = sub.add_parser(
        "report",
        help="summarise a monitor file or a federation's rounds file",
        description="Summarise FILE.jsonl: a monitor file (edgewatt run --output, a "
        "FileMonitor with records='edgewatt') as a table of its figures, or a federated-"
        "learning rounds file (written by edgewatt.client.flower.collect on the "
        "ServerApp) as a table per round and kind (train, evaluate) of its clients. "
        "A cut-off last line is skipped with a warning; any other bad line is an error "
        "naming file and line (exit 1).",
    )
    report.add_argument(
        "file", metavar="FILE.jsonl", help="a monitor file or a Flower rounds file (fl.jsonl)"
    )
    report.add_argument("--plot", metavar="OUT.png", help="also plot it (needs edgewatt[plot])")

    install = sub.add_parser("install-service", help="install and start the systemd service")
    install.add_argument("--dry-run", action="store_true", help="print what would be written")
    install.add_argument("--user", action="store_true", help="a user service (own processes)")
    install.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests, images
    uninstall = sub.add_parser("uninstall-service", help="stop and remove the service")
    uninstall.add_argument("--user", action="store_true")
    uninstall.add_argument("--purge", action="store_true", help="also remove config and state")
    uninstall.add_argument("--root", default="/", help=argparse.SUPPRESS)
    doctor = sub.add_parser("doctor", help="check this machine, one line per finding")
    doctor.add_argument("--config", metavar="PATH", help="YAML config (default: none)")
    doctor.add_argument("--socket", metavar="PATH", help="the daemon to check (default: found)")

    config = sub.add_parser("config", help="configuration helpers")
    config.add_argument("what", choices=["example"], help="example: every key, its default")

    register = sub.add_parser(
        "register",
        help="register a container, a systemd unit, a cgroup or a process",
        description="Register a target with the daemon; prints its id.",
    )
    what = register.add_mutually_exclusive_group(required=True)
    what.add_argument("--container", metavar="NAME", help="a podman or docker container")
    what.add_argument("--unit", metavar="UNIT", help="a systemd unit (.service if no suffix)")
    what.add_argument("--cgroup", metavar="PATH", help="a cgroup v2 path, e.g. /system.slice/x")
    what.add_argument("--pid", type=int, metavar="PID", help="a process and its descendants")
    register.add_argument("--runtime", choices=["podman", "docker"], help="the container's")
    register.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    register.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")
    summary = sub.add_parser("summary", help="a target's figures since it was registered")
    summary.add_argument(
        "id", metavar="ID|KEY=VALUE", help="a target's id, or a label: its newest target"
    )
    summary.add_argument("--json", action="store_true", help="print the API's JSON")
    summary.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")
    unregister = sub.add_parser("unregister", help="let go of a registered target")
    unregister.add_argument("id", metavar="ID")
    unregister.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")

    status = sub.add_parser("status", help="show the registered targets")
    status.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")
    status.add_argument("--json", action="store_true", help="print the API's JSON")
    top = sub.add_parser("top", help="live view of the device's power and its targets")
    top.add_argument("--socket", metavar="PATH", help="Unix socket of the daemon")
    top.add_argument("--interval", type=float, default=1.0, metavar="S", help="refresh (s)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--json", action="store_true", help="print GET /v1/top's JSON and exit")
    return parser, sub.choices


def _serve(args: argparse.Namespace) -> int:
    from edgewatt.exporter import config as config_mod
    from edgewatt.exporter.daemon import serve

    flags = config_mod.given_flags(args)
    try:
        config = config_mod.build(args.config, os.environ, flags)
    except config_mod.ConfigError as exc:
        print(f"edgewatt: config error: {exc}", file=sys.stderr)
        return 2
    # SIGHUP re-reads the YAML file and the environment; flags still win.
    return serve(config, reload=lambda: config_mod.build(args.config, os.environ, flags))


def _status(args: argparse.Namespace) -> int:
    from edgewatt.cli import daemon_socket
    from edgewatt.cli.status import finished_summaries, render
    from edgewatt.core import transport

    path = daemon_socket.find("status", args.socket)
    if path is None:
        return 1
    try:
        targets = transport.call_ok(path, "GET", "/v1/targets")["targets"]
        health = transport.call_ok(path, "GET", "/healthz")
    except (OSError, transport.DaemonError) as exc:
        print(f"edgewatt status: the daemon at {path} failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(targets, indent=2))
    else:
        finished = finished_summaries(path, targets)
        retention = health.get("exited_retention_s")
        print(render(targets, health.get("logical_cpus"), finished, retention))
    return 0


def _top(args: argparse.Namespace) -> int:
    import shutil

    from edgewatt.cli import daemon_socket, top
    from edgewatt.core import transport

    if not args.interval > 0:  # NaN too
        print(f"edgewatt top: --interval must be above 0 s, not {args.interval}", file=sys.stderr)
        return 2
    path = daemon_socket.find("top", args.socket)
    if path is None:
        return 1
    try:
        if args.once or args.json:
            document = transport.call_ok(path, "GET", "/v1/top")
            width = shutil.get_terminal_size((100, 24)).columns
            print(top.once(document, args.json, width))
        else:
            # An answer slower than a request's usual bound is waited for (the view
            # stays up meanwhile, saying how old its figures are: top.Feed).
            top.run_screen(
                lambda: transport.call_ok(path, "GET", "/v1/top", timeout=top.SLOW_ANSWER_S),
                args.interval,
            )
    except ImportError:  # a Python built without curses: the frame still prints
        print("edgewatt top: this Python has no curses; use --once or --json", file=sys.stderr)
        return 1
    except (OSError, transport.DaemonError) as exc:
        print(f"edgewatt top: the daemon at {path} failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _register(args: argparse.Namespace) -> int:
    from edgewatt.cli.registrations import register
    from edgewatt.cli.run import parse_labels

    try:
        body: dict = {"labels": parse_labels(args.label)}
    except ValueError as exc:
        print(f"edgewatt register: {exc}", file=sys.stderr)
        return 2
    for key in ("container", "unit", "cgroup", "pid"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.runtime is not None:
        body["runtime"] = args.runtime
    if args.container is not None:
        from edgewatt.cli.registrations import container_id

        found = container_id(args.container, args.runtime)
        if found is not None:  # the daemon finds it by id where it may not ask the runtime
            body["runtime"], body["container_id"] = found
    return register(body, args.socket)


def _summary(args: argparse.Namespace) -> int:
    from edgewatt.cli.registrations import summary

    return summary(args.id, args.socket, args.json)


def _unregister(args: argparse.Namespace) -> int:
    from edgewatt.cli.registrations import unregister

    return unregister(args.id, args.socket)


def _run(args: argparse.Namespace) -> int:
    from edgewatt.cli.run import parse_labels, run

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        labels = parse_labels(args.label)
        if args.interval <= 0:
            raise ValueError("--interval must be a positive number of seconds")
        return run(
            command, labels, args.output, args.interval, args.socket, args.cgroup, args.emissions
        )
    except ValueError as exc:
        print(f"edgewatt run: {exc}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from edgewatt.cli.report import report

    try:
        print(report(args.file, args.plot))
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"edgewatt report: {exc}", file=sys.stderr)
        return 1
    return 0


def _install(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgewatt.cli.service import install

    return install(Path(args.root), args.user, args.dry_run)


def _uninstall(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgewatt.cli.service import uninstall

    return uninstall(Path(args.root), args.user, args.purge)


def _doctor(args: argparse.Namespace) -> int:
    from edgewatt.cli.doctor import run
    from edgewatt.exporter import config as config_mod

    try:
        config = config_mod.build(args.config, os.environ, {})
    except config_mod.ConfigError as exc:
        print(f"FAIL  config: {exc}")
        return 1
    # With --config, the daemon that config describes; else looked for as clients do.
    text, code = run(config, args.socket or (config.socket if args.config else None))
    print(text)
    return code


def _config(args: argparse.Namespace) -> int:
    from edgewatt.cli.service import config_example

    print(config_example(), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    # The subcommand is the first word (the top level's flags take no value): the
    # daemon's config, and with it `serve`'s flags, is loaded only for `serve`.
    command = next((a for a in given if not a.startswith("-")), None)
    parser, subcommands = _parser(serve_flags=command == "serve")
    if command is not None and command not in subcommands:
        parser.error(unknown_command(command, list(subcommands)))
    args, extra = parser.parse_known_args(given)
    if extra:  # the subcommand's usage, not the top level's
        subcommands[args.command].error(unknown_flags(extra, subcommands[args.command]))
    handlers = {
        "serve": _serve,
        "status": _status,
        "top": _top,
        "register": _register,
        "summary": _summary,
        "unregister": _unregister,
        "run": _run,
        "report": _report,
        "install-service": _install,
        "uninstall-service": _uninstall,
        "config": _config,
        "doctor": _doctor,
    }
    try:
        code = handlers[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
    except BrokenPipeError:
        # A reader that stopped early (`edgewatt summary ID | head`): no traceback for
        # what it did not want; the shell's status for a write to a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code
