"""`edgewatt register`, `edgewatt summary`, `edgewatt unregister`: a target by hand.

    edgewatt register --container fl-client [--runtime podman] [--label k=v]...
    edgewatt register --unit flower-supernode.service
    edgewatt register --cgroup /system.slice/x.service
    edgewatt register --pid 1234
    edgewatt summary ID|KEY=VALUE [--json]
    edgewatt unregister ID

Each talks to the daemon found as clients find it (or --socket), which checks the
caller's right to the target (SO_PEERCRED) and resolves a name through the runtime.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

from edgewatt.cli import daemon_socket
from edgewatt.cli.phases import phase_table
from edgewatt.cli.report import ESCAPES, covers_line
from edgewatt.cli.spreads import spread_rows
from edgewatt.cli.status import human_bytes
from edgewatt.core import transport
from edgewatt.core.text import printable


def _call(path: str, command: str, method: str, url: str, body: Any = None) -> Any:
    try:
        return transport.call_ok(path, method, url, body)
    except transport.DaemonError as exc:
        print(f"edgewatt {command}: the daemon refused: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"edgewatt {command}: the daemon at {path} failed: {exc}", file=sys.stderr)
    return None


def container_id(name: str, runtime: str | None) -> tuple[str, str] | None:
    """(runtime, full id) of the container as the caller's own runtime tells it, or
    None (no runtime, no such container, no right to ask: the daemon asks itself)."""
    from edgewatt.core.facts.cgroup_names import (
        CONTAINER_ID,
        RUNTIMES,
        UnknownName,
        run_command,
    )

    for candidate in [runtime] if runtime else [r for r in RUNTIMES if shutil.which(r)]:
        try:
            found = run_command([candidate, "inspect", "--format", "{{.Id}}", name])
        except UnknownName:
            continue
        if CONTAINER_ID.fullmatch(found):
            return candidate, found
    return None


def register(body: dict[str, Any], socket: str | None) -> int:
    path = daemon_socket.find("register", socket)
    if path is None:
        return 1
    answer = _call(path, "register", "POST", "/v1/targets", body)
    if answer is None:
        return 1
    cgroup = answer.get("cgroup") or {}
    where = f"cgroup {cgroup['path']}" if cgroup else f"pid {answer['pid']}"
    print(answer["id"])
    print(
        f"registered {where} as target {answer['id']}; read it with: "
        f"edgewatt summary {answer['id']}",
        file=sys.stderr,
    )
    return 0


def unregister(target_id: str, socket: str | None) -> int:
    path = daemon_socket.find("unregister", socket)
    if path is None:
        return 1
    return 0 if _call(path, "unregister", "DELETE", f"/v1/targets/{target_id}") else 1


def summary(target_id: str, socket: str | None, as_json: bool) -> int:
    """The summary of target ``target_id``, or of the newest target (running or
    finished) labelled so where it is KEY=VALUE."""
    path = daemon_socket.find("summary", socket)
    if path is None:
        return 1
    if "=" in target_id:
        found = _labelled(path, target_id)
        if found is None:
            return 1
        target_id = found
    answer = _call(path, "summary", "GET", f"/v1/targets/{target_id}/summary?fresh=1")
    if answer is None:
        return 1
    print(json.dumps(answer, indent=2) if as_json else render(answer))
    return 0


def _labelled(path: str, label: str) -> str | None:
    """The id of the newest target the daemon keeps with label KEY=VALUE (the others
    named on stderr), or None after a line saying none has it."""
    key, _, value = label.partition("=")
    listing = _call(path, "summary", "GET", "/v1/targets")
    if listing is None:
        return None
    matching = [t for t in listing["targets"] if t.get("labels", {}).get(key) == value]
    if not matching:
        print(f"edgewatt summary: no target labelled {printable(label)} "
              "(running, or finished within exited_retention)", file=sys.stderr)  # fmt: skip
        return None
    matching.sort(key=lambda t: t["registered_at"])
    if len(matching) > 1:
        others = ", ".join(t["id"] for t in matching[:-1])
        print(f"edgewatt summary: {len(matching)} targets labelled {printable(label)}; "
              f"the newest, {matching[-1]['id']} (others: {others})", file=sys.stderr)  # fmt: skip
    return matching[-1]["id"]


def render(s: dict[str, Any]) -> str:
    """A summary as a person reads it: every figure with its unit, its phases in a
    table under the totals."""

    def value(key: str, unit: str) -> str:
        v = s.get(key)
        if v is None:
            return "-"
        return human_bytes(v) if unit == "bytes" else f"{v:g} {unit}"

    cgroup = s.get("cgroup") or {}
    name = f"{cgroup.get('kind')} {cgroup.get('name')}" if cgroup else f"pid {s['pid']}"
    # PSS is sampled only (smaps): none where no pass read a member alive, and why.
    pss = (
        f"{value('memory_pss_peak_bytes', 'bytes')} (what it holds)"
        if s.get("memory_pss_peak_bytes") is not None
        else "not measured (sampled only: no pass read it; the kernel keeps none at an exit)"
    )
    counts = {
        "ip-bytes": "IP bytes, headers included",
        "interface-bytes": "frames on its network namespace's interfaces",
        "ip-bytes+interface-bytes": "IP bytes, and frames of a namespace it may not enter",
    }.get(s.get("network_counts") or "", f"TCP; {ESCAPES}")
    least = "at least " if s.get("network_lower_bound") else ""  # short connections escape
    network = (
        f"unknown: {s['network_unknown']}"
        if s.get("network_unknown")
        else f"sent {least}{value('network_transmit_bytes', 'bytes')}, "
        f"received {least}{value('network_receive_bytes', 'bytes')} ({counts})"
    )
    lines = [
        f"target {s['id']}: {name} ({s['state']}, {s['membership']})",
        *([f"  command    {s['command']}"] if s.get("command") else []),
        f"  duration   {value('duration_s', 's')}",
        *_covers(s),
        f"  CPU        user {value('cpu_user_s', 's')}, system {value('cpu_system_s', 's')}",
        f"  memory     peak PSS {pss}, "
        f"largest process's peak RSS {value('memory_rss_largest_peak_bytes', 'bytes')}, "
        f"RSS summed peak {value('memory_rss_peak_bytes', 'bytes')}",
        f"  storage    read {value('disk_read_bytes', 'bytes')}, "
        f"written {value('disk_write_bytes', 'bytes')}",
        f"  network    {network}",
        f"  energy     {_energy(s)}",
        *(f"  {label:<10} {shown}" for label, shown in spread_rows(s)),
    ]
    if cgroup:
        lines.insert(
            4,
            f"  cgroup     {cgroup.get('path')}: memory now "
            f"{value_of(cgroup, 'memory_current_bytes')}, kernel's peak "
            f"{value_of(cgroup, 'memory_peak_bytes')}",
        )
    return "\n".join(
        [*lines, *phase_table(s.get("phases") or [], dropped=s.get("phases_dropped") or 0)]
    )


def _covers(s: dict[str, Any]) -> list[str]:
    """A line saying which part of the run the figures cover, where not all of it."""
    covered = s.get("covers")
    if not isinstance(covered, dict) or covered.get("whole") is not False:
        return []
    return [f"  covers     {covers_line(covered)}"]


def _energy(s: dict[str, Any]) -> str:
    if s.get("energy_j") is None:
        return "unknown: no power source on this device"
    device = s.get("device_energy_j")
    whole = "" if device is None else f" (the whole device: {device:g} J)"
    return f"{s['energy_j']:g} J attributed{whole}"


def value_of(d: dict[str, Any], key: str) -> str:
    return "-" if d.get(key) is None else human_bytes(d[key])
