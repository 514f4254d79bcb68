"""`edgewatt top`: the device and its targets, live, from one GET /v1/top a refresh.

Built on the standard library's curses: nothing to install on a Jetson (JetPack 5's
Python 3.8 to 3.13, no compiler), and the daemon and client never import it.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from edgewatt.cli.device import setting_line
from edgewatt.cli.phases import PEAK_POWER
from edgewatt.cli.status import FINISHED_SHOWN, finished_rows, human_bytes, name_of
from edgewatt.core.energy_source import sensors as measured_by
from edgewatt.core.text import printable

# How long the live view waits for one answer before asking again: a daemon on a
# device under stress may take seconds; the view stays up meanwhile (Feed).
SLOW_ANSWER_S = 30.0
SORTS = {"p": "power", "e": "energy", "c": "cpu", "m": "memory"}
_KEY = {
    "power": lambda t: (t.get("latest") or {}).get("power_w") or 0.0,
    "energy": lambda t: (t.get("latest") or {}).get("energy_j") or 0.0,
    "cpu": lambda t: (t.get("latest") or {}).get("cpu_utilization") or 0.0,
    "memory": lambda t: (t.get("latest") or {}).get("memory_pss_bytes") or 0,
}
HELP = (
    "q quit   up/down select (detail: scroll phases)   Enter detail (Esc/Enter back)",
    "p sort by power   e energy   c CPU   m memory   ? this help",
)


@dataclass
class View:
    """What the user chose: the sort, the selected row, and which screen."""

    sort: str = "power"
    selected: int = 0
    detail: bool = False
    help: bool = False
    scroll: int = 0  # the detail view's first phase row shown


def _w(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _j(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cpu(util: float | None, cpus: int | None) -> str:
    return "-" if util is None or not cpus else f"{util * cpus * 100:.1f}"


_RATES = ("transmit_bytes_per_s", "receive_bytes_per_s")


def _net(rate: dict[str, Any] | None) -> str:
    if not rate:
        return "-"
    # Unit in each cell, without its space: 1.5KiB/340B.
    sent, received = (human_bytes(rate[k]).replace(" ", "") for k in _RATES)
    return f"{sent}/{received}"


def _cores(utilization: dict[str, float | None]) -> list[str]:
    """Each CPU as number:percent; numbers /proc/stat skips are offline ("1-3:off"),
    one just come online has no interval yet ("2:-")."""
    items, expected = [], 0
    for n, u in sorted((int(k), u) for k, u in utilization.items()):
        if n > expected:
            items.append(f"{expected}:off" if n == expected + 1 else f"{expected}-{n - 1}:off")
        items.append(f"{n}:-" if u is None else f"{n}:{u * 100:.0f}")
        expected = n + 1
    return items


def _gpu(gpu: dict[str, Any]) -> str:
    mhz = gpu.get("frequency_mhz")
    return f"{gpu['name']} {gpu['utilization'] * 100:.0f}% load" + (
        "" if mhz is None else f" at {mhz} MHz"
    )


def _cpu_s(span: dict[str, Any]) -> float:
    return (span.get("cpu_user_s") or 0.0) + (span.get("cpu_system_s") or 0.0)


def ordered(targets: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    """Running targets by the sort key, largest first; finished ones after, the last
    ended first (what a cut screen keeps)."""
    running = [t for t in targets if t.get("state") == "running"]
    done = [t for t in targets if t.get("state") != "running"]
    done.sort(key=lambda t: t.get("exited_at") or 0.0, reverse=True)
    return sorted(running, key=_KEY[sort], reverse=True) + done


def device_lines(document: dict[str, Any], width: int) -> list[str]:
    device, health = document["device"], document.get("health") or {}
    power = device.get("power") or {}
    cpus = device.get("logical_cpus")
    used, total = device.get("memory_used_bytes"), device.get("memory_total_bytes")
    hz = health.get("power_sample_hz")
    # Each sensor with its rail and rate (a daemon before provenance: the reader's rate).
    sensors = measured_by(power.get("provenance")) or (
        f"{','.join(power.get('sources') or [])} at {'-' if hz is None else f'{hz:g}'} Hz"
    )
    lines = [
        f"edgewatt top  {time.strftime('%H:%M:%S', time.localtime(device['time']))}"
        f"  {cpus} cores {_cpu(device.get('cpu_utilization'), 1)}% busy"
        f"  mem {human_bytes(used)}/{human_bytes(total)}",
        f"power {_w(power.get('host_power_w'))} W, {_w(power.get('host_power_avg_w'))} W"
        f" avg {power.get('avg_window_s', 0):.0f} s, {_j(power.get('host_energy_j'))} J"
        f" since start; {sensors}"
        if power.get("sources")
        else "power: no power source on this device (edgewatt doctor says why)",
    ]
    setting = setting_line(device.get("context"))  # power mode, release, clocks
    if setting:
        lines += _wrap("device: ", printable(setting).split(", "), width)
    rails = [
        f"{name} {_w(r.get('power_w'))}/{_w(r.get('power_avg_w'))} W"
        for name, r in sorted((power.get("rails") or {}).items())
    ]
    temps = [
        f"{k.split('/')[-1]} {v:.1f}C" for k, v in sorted(power.get("temperatures_c", {}).items())
    ]
    gpus = [_gpu(g) for g in power.get("gpus") or [] if g.get("utilization") is not None]
    lines += _wrap("rails (W now/avg): ", rails, width)
    lines += _wrap("cpu% per core: ", _cores(device.get("cpu_core_utilization") or {}), width)
    lines += _wrap("temp: ", temps, width)
    lines += _wrap("gpu: ", gpus, width)
    return lines


def _wrap(head: str, items: list[str], width: int) -> list[str]:
    if not items:
        return []
    lines, line = [], head
    for item in items:
        if len(line) + len(item) + 2 > width and line.strip():
            lines.append(line.rstrip())
            line = "  "
        line += item + "  "
    lines.append(line.rstrip())
    return lines


COLUMNS = (
    "ID",
    "NAME",
    "W",
    "J",
    "CPU%",
    "PSS",
    "TX/RX per s",
    "PROCS",
    "PHASE",
    "PHASE J",
    "LABELS",
)
# Dropped in this order while a row is wider than the screen (80 columns keep the rest):
# the ID last, as it names a target for `edgewatt summary ID` (a busy target's "100.0"
# and a 3-digit J once made an 80-column row one too wide, and the ID went first); the
# labels before it, but after the phase's joules: they tell two runs of one script
# apart (the detail view has the phase's figures).
_DROP = ("TX/RX per s", "PROCS", "PHASE J", "LABELS", "ID")
_CAP = {"NAME": 16, "PHASE": 12, "LABELS": 40}


# A finished target's final figures, as `edgewatt status` lists them.
FINISHED_COLUMNS = finished_rows([])[0]
_FINISHED_DROP = ("LABELS", "PID", "ID")


def target_rows(document: dict[str, Any], sort: str) -> list[tuple[str, ...]]:
    """The running targets' rows, in the sort's order."""
    cpus = document["device"].get("logical_cpus")
    rows = []
    for t in ordered(document["targets"], sort):
        if t.get("state") != "running":
            continue
        latest = t.get("latest") or {}
        summary = t.get("summary") or {}
        phases = summary.get("phases") or []
        phase = phases[-1] if phases and phases[-1].get("ended_at") is None else None
        rows.append(
            (
                t["id"],
                name_of(t),
                _w(latest.get("power_w")),
                _j(summary.get("energy_j")),
                _cpu(latest.get("cpu_utilization"), cpus),
                human_bytes(latest.get("memory_pss_bytes")),
                _net(t.get("network_rate")),
                str(latest.get("processes", "-")),
                phase["name"] if phase else "-",
                _j(phase.get("energy_j")) if phase else "-",
                ",".join(f"{k}={v}" for k, v in sorted(t.get("labels", {}).items())) or "-",
            )
        )
    return [tuple(printable(c) for c in row) for row in rows]


def finished_target_rows(document: dict[str, Any], sort: str) -> list[tuple[str, ...]]:
    """The finished targets' rows (end, how, exit status, CPU, energy, peak memory),
    the last ended first."""
    done = [t for t in ordered(document["targets"], sort) if t.get("state") != "running"]
    rows = finished_rows([(t, t.get("summary") or {}) for t in done])[1:]
    return [tuple(printable(c) for c in row) for row in rows]


def table_lines(
    rows: list[tuple[str, ...]],
    width: int,
    columns: tuple[str, ...] = COLUMNS,
    drop: tuple[str, ...] = _DROP,
) -> list[str]:
    """Columns sized to their cells, the least needed (``drop``) left out until a row
    fits; the header first."""
    everything = [columns, *rows]
    widths = {
        c: min(max(len(r[i]) for r in everything), _CAP.get(c, 99)) for i, c in enumerate(columns)
    }
    shown = list(columns)
    for column in drop:
        if sum(widths[c] + 2 for c in shown) - 2 <= width:
            break
        shown.remove(column)
    index = [columns.index(c) for c in shown]
    return [
        "  ".join(row[i][: widths[columns[i]]].ljust(widths[columns[i]]) for i in index)[
            :width
        ].rstrip()
        for row in everything
    ]


def detail_lines(target: dict[str, Any], cpus: int | None, width: int) -> list[str]:
    summary = target.get("summary") or {}
    latest = target.get("latest") or {}
    labels = ", ".join(f"{k}={v}" for k, v in sorted(target.get("labels", {}).items()))
    about = [
        f"target {target['id']}  {target.get('kind')} pid {target.get('pid')}"
        f"  {name_of(target)}  {target.get('state')}{_end(target, summary)}",
        f"registered {time.strftime('%H:%M:%S', time.localtime(target['registered_at']))}"
        f"  labels: {labels or '-'}",
        f"total {_j(summary.get('energy_j'))} J  CPU {_cpu_s(summary):.2f} s"
        f"  processes {latest.get('processes', '-')}"
        f"  PSS peak {human_bytes(summary.get('memory_pss_peak_bytes'))}",
        f"network {_net_detail(target.get('network_rate'), summary.get('network_counts'))}",
        f"members ({target.get('member_count', 0)}): "
        + (" ".join(str(pid) for pid in target.get("members") or []) or "-"),
        # In place of a blank line: an 80x24 screen has no row to spare.
        "phases: J, AVG W attributed; PEAK W the whole device's, at the sensor's rate",
    ]
    lines = [
        f"{'PHASE':<14}  {'TIME s':>7}  {'CPU s':>7}  {'J':>7}  {'AVG W':>6}  {'PEAK W':>6}"
        "  PSS PEAK",
    ]
    for p in summary.get("phases") or []:
        cpu = _cpu_s(p)
        # 14 + 7 + 7 + 7 + 6 + 6 + 10 (PSS) columns and "(running)": 80 at most.
        lines.append(
            f"{p['name'][:14]:<14}  {p.get('duration_s', 0):>7.1f}  {cpu:>7.2f}  "
            f"{_j(p.get('energy_j')):>7}  {_w(p.get('power_avg_w')):>6}  "
            f"{_w(p.get(PEAK_POWER)):>6}  {human_bytes(p.get('memory_pss_peak_bytes'))}"
            + ("  (running)" if p.get("ended_at") is None else "")
        )
    if not summary.get("phases"):
        lines.append("(no phases)")
    # Sentences wrapped at a word, never cut; the table's rows fit 80 columns.
    wrapped = [
        part
        for line in about
        for part in textwrap.wrap(printable(line), max(width, 20), subsequent_indent="  ")
    ]
    return [*wrapped, *(printable(line)[:width] for line in lines)]


def scrolled(detail: list[str], view: View, room: int) -> list[str]:
    """The detail view in ``room`` lines: its phase rows from ``view.scroll`` on (kept
    in range), and where they do not all fit, a last line saying which are shown."""
    table = next((i for i, line in enumerate(detail) if line.startswith("PHASE ")), len(detail))
    head, rows = detail[: table + 1], detail[table + 1 :]
    fits = max(room - len(head), 1)
    if len(rows) <= fits:
        view.scroll = 0
        return detail
    shown = fits - 1  # the last line says which rows these are
    view.scroll = max(0, min(view.scroll, len(rows) - shown))
    first = view.scroll
    where = f"phases {first + 1}-{first + shown} of {len(rows)}: up/down scroll"
    return [*head, *rows[first : first + shown], where]


def _end(target: dict[str, Any], summary: dict[str, Any]) -> str:
    """A finished target's end and exit status, as its row has them."""
    if target.get("state") == "running":
        return ""
    cells = dict(zip(FINISHED_COLUMNS, finished_rows([(target, summary)])[1]))
    return f" {cells['ENDED']}, exit {cells['EXIT']}"


# What a target's network figures count (its summary's network_counts).
_COUNTED = {
    "tcp-payload": "TCP payload",
    "ip-bytes": "IP bytes with headers",
    "interface-bytes": "its namespace's interface frames",
    "ip-bytes+interface-bytes": "IP bytes and interface frames",
}


def _net_detail(rate: dict[str, Any] | None, counts: str | None) -> str:
    if not rate:
        return "rate: - (known after two samples of a running target whose bytes are counted)"
    return (
        f"rate: {human_bytes(rate['transmit_bytes_per_s'])}/s sent,"
        f" {human_bytes(rate['receive_bytes_per_s'])}/s received"
        f" ({_COUNTED.get(counts or '', 'TCP payload')}, over the last {rate['window_s']:.1f} s)"
    )


class Line(NamedTuple):
    """A line of the screen; the live view draws a selected one reversed and a
    finished target's dimmed (--once prints the text alone)."""

    text: str
    selected: bool = False
    finished: bool = False


def styled_frame(
    document: dict[str, Any], view: View, width: int = 80, height: int = 24, stale: str = ""
) -> list[Line]:
    """One screen's lines, at most ``height``, each at most ``width`` columns;
    ``stale``: how old the figures are and why, where they are (the footer's first)."""
    lines = [Line(line) for line in device_lines(document, width)]
    targets = ordered(document["targets"], view.sort)
    view.selected = max(min(view.selected, len(targets) - 1), 0)
    if view.help:
        lines += [Line(""), *map(Line, HELP)]
    elif view.detail and targets:
        cpus = document["device"].get("logical_cpus")
        detail = detail_lines(targets[view.selected], cpus, width)
        lines += [Line(""), *map(Line, scrolled(detail, view, height - 2 - len(lines)))]
    else:
        lines += _tables(document, view, width, height - 1 - len(lines))
    lines = [line._replace(text=line.text[:width]) for line in lines]
    keys = "q quit  arrows select  Enter detail  p/e/c/m sort  ? help"
    footer = Line(f"{stale}  {keys}"[:width] if stale else keys[:width])
    return [*lines[: max(height - 1, 0)], footer]


def _tables(document: dict[str, Any], view: View, width: int, room: int) -> list[Line]:
    """The running targets' table, then the finished ones' in the ``room`` lines left,
    dimmed, with their final figures; the selected target's row marked (and kept
    among the rows shown)."""
    running = table_lines(target_rows(document, view.sort), width)
    lines = [Line(f"targets (sort: {view.sort}; W, J attributed; CPU% of one core)")]
    lines += [Line(text, selected=n == view.selected + 1) for n, text in enumerate(running)]
    if len(running) == 1:
        none = "(no registered targets)" if not document["targets"] else "(none running)"
        lines.append(Line(none))
    done = finished_target_rows(document, view.sort)
    # Title and header, then as many rows as fit, the last line saying how many not.
    fit = min(max(room - len(lines) - 2, 0), FINISHED_SHOWN)
    shown = done if len(done) <= fit else done[: max(fit - 1, 0)]
    view.selected = max(min(view.selected, len(running) - 1 + len(shown) - 1), 0)
    if shown:
        retention = (document.get("health") or {}).get("exited_retention_s")
        kept = "" if retention is None else f", kept {retention:g} s after their end"
        finished = table_lines(shown, width, FINISHED_COLUMNS, _FINISHED_DROP)
        first = len(running) - 1  # the first finished target's index in ordered()
        lines.append(Line(f"finished{kept} (the last first):", finished=True))
        lines += [
            Line(text, selected=n > 0 and first + n - 1 == view.selected, finished=True)
            for n, text in enumerate(finished)
        ]
    if len(shown) < len(done):
        more = len(done) - len(shown)
        lines.append(Line(f"({more} more finished: edgewatt status lists them)", finished=True))
    return lines


def frame(document: dict[str, Any], view: View, width: int = 80, height: int = 24) -> list[str]:
    """One screen's text: styled_frame's lines without their style."""
    return [line.text for line in styled_frame(document, view, width, height)]


class Feed:
    """The daemon's answers, asked for in a thread of their own every ``interval`` s:
    a slow answer (a daemon on a device under stress) or a failing one leaves the view
    up with the last figures, saying how old they are, and the asking goes on."""

    def __init__(self, fetch: Callable[[], dict[str, Any]], interval: float) -> None:
        self._fetch = fetch
        self._interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.document = fetch()  # the first answer: none, and top says why and exits
        self._fetched = time.monotonic()
        self._asked: float | None = None  # when the pending ask went out
        self._error = ""
        self._thread = threading.Thread(target=self._run, name="edgewatt-top", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self._fetched + self._interval - time.monotonic())):
            with self._lock:
                self._asked = time.monotonic()
            try:
                document = self._fetch()
            except Exception as exc:  # the view stays up; the footer says what failed
                with self._lock:
                    self._error, self._asked = str(exc) or type(exc).__name__, None
                self._stop.wait(self._interval)
                continue
            with self._lock:
                self.document, self._fetched = document, time.monotonic()
                self._asked, self._error = None, ""

    def state(self) -> tuple[dict[str, Any], str]:
        """The latest document, and its age and why where it is over two refreshes old
        ("" while fresh)."""
        with self._lock:
            now = time.monotonic()
            age = now - self._fetched
            if age < 2 * self._interval:
                return self.document, ""
            if self._asked is not None:
                why = f"the daemon has not answered for {now - self._asked:.0f} s"
            else:
                why = f"the daemon failed: {self._error}" if self._error else "asking"
            return self.document, f"figures {age:.0f} s old ({why})"

    def close(self) -> None:
        self._stop.set()


def run_screen(fetch: Callable[[], dict[str, Any]], interval: float) -> None:
    """The live view: a refresh every ``interval`` s (fetched apart: Feed); a key
    redraws at once."""
    import curses  # here: only the live view needs it (--once and --json do not)

    def loop(screen: Any) -> None:
        curses.curs_set(0)
        # Redrawn at least every second: the age of stale figures moves on.
        screen.timeout(int(min(interval, 1.0) * 1000))
        view = View()
        feed = Feed(fetch, interval)
        try:
            show(screen, feed, view)
        finally:
            feed.close()

    def show(screen: Any, feed: Feed, view: View) -> None:
        while True:
            document, stale = feed.state()
            height, width = screen.getmaxyx()
            screen.erase()
            for y, line in enumerate(styled_frame(document, view, width - 1, height, stale)):
                attribute = curses.A_REVERSE if line.selected else 0
                if line.finished:
                    attribute |= curses.A_DIM  # finished: final figures
                screen.addnstr(y, 0, line.text, width - 1, attribute)
            screen.refresh()
            key = screen.getch()
            count = len(document["targets"])
            if key in (ord("q"), ord("Q")):
                return
            if view.detail and key in (curses.KEY_DOWN, curses.KEY_UP):
                view.scroll += 1 if key == curses.KEY_DOWN else -1  # its phases
            elif key == curses.KEY_DOWN:
                view.selected = min(view.selected + 1, max(count - 1, 0))
            elif key == curses.KEY_UP:
                view.selected = max(view.selected - 1, 0)
            elif key in (10, 13, curses.KEY_ENTER):
                view.detail, view.scroll = not view.detail, 0
            elif key == 27:
                view.detail = view.help = False
            elif key == ord("?"):
                view.help = not view.help
            elif key in range(256) and chr(key) in SORTS:
                view.sort = SORTS[chr(key)]

    curses.wrapper(loop)


def once(document: dict[str, Any], as_json: bool, width: int) -> str:
    if as_json:
        return json.dumps(document, indent=2)
    return "\n".join(frame(document, View(), width, 10**6))
