"""What monitoring N processes costs: the edgewatt daemon beside prometheus-process-exporter.

Both watch the same N idle processes at the same cadence: the daemon samples every
`--interval` seconds and is scraped once per interval; process-exporter (Debian's
`prometheus-process-exporter`, one group per pid, `-threads=false -gather-smaps=false`
so both report the same kind of figures) does its reading at scrape time, so one
scrape per interval is the same cadence. Both run for the whole comparison but never
at once: the one not measured is stopped (SIGSTOP), and they take turns in
`--windows` windows each (A B B A A B ...), so a change in the machine's speed during
the run (on a shared VM, +-20 % from minute to minute) falls on both alike. Figures
per exporter: CPU time over its windows (from /proc/PID/stat, all threads), RSS at the
end, /metrics latency p50/p99 (full body read), and the ratio of the two CPU costs.

    .venv/bin/python benchmarks/overhead.py [--targets 200] [--duration 60] [--windows 6]
        [--idle-processes 2000] [--sweep 1,10,100,200,500] [--json out.json] [--png out.png]

`--idle-processes K` adds a run of the daemon with K unrelated idle processes on the
host, to show the cost does not follow the host's process count. `--sweep` repeats the
comparison for each N and, with the `plot` extra, draws cost versus N.

`--rev REV` runs a daemon from that git revision as a third exporter in the same turns
(its figures beside this checkout's: "no added cost" is a ratio near 1). `--busy` adds a
comparison with one busy target: a process with 8 threads that compute and talk over a
TCP connection, what most users run. For each edgewatt daemon the CPU is also split by
thread (their kernel names; run time from /proc/PID/task/TID/schedstat, in ns).

    .venv/bin/python benchmarks/overhead.py --sweep 1,200,1000 --busy --rev REV
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import (  # noqa: E402
    checkout,
    free_port,
    percentile,
    rss_bytes,
    start_daemon,
    thread_counters,
)
from edgewatt.core import transport  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
PROCESS_EXPORTER = "prometheus-process-exporter"
# One group per pid: each target's argv[0] carries its index, and the group is named
# after it, as `name: "{{.Matches.id}}"` makes process-exporter do.
PROCESS_EXPORTER_CONFIG = """\
process_names:
  - name: "{{.Matches.id}}"
    cmdline:
      - '^{prefix}-(?P<id>\\d+)'
"""
# This run's processes only: other runs on the host (helpers, CI) use other pids.
PREFIX = f"edgewatt-bench{os.getpid()}"


# The busy target: 8 threads computing a little and passing bytes over one loopback
# TCP connection, 100 times a second each.
BUSY = """
import socket, threading, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
out = socket.create_connection(server.getsockname())
into, _ = server.accept()
def work():
    while True:
        sum(range(20000))
        out.sendall(b"x" * 100)
        into.recv(100)
        time.sleep(0.01)
for _ in range(8):
    threading.Thread(target=work, daemon=True).start()
time.sleep(10**6)
"""


@dataclass
class Result:
    exporter: str
    targets: int
    case: str  # "200", or "1 busy"
    idle_processes: int
    duration_s: float
    cpu_s: float  # CPU time the exporter used over the measured window
    cpu_share: float  # cpu_s / duration_s: 0.01 = 1 % of one core
    rss_mib: float
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_bytes: int
    threads_ms_per_s: dict[str, float]  # CPU by thread name, ms per second
    run_ms_per_s: float  # their sum: run time in ns, where ticks are 10 ms


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@contextmanager
def idle_processes(count: int, prefix: str, busy: bool = False) -> Iterator[list[int]]:
    """``count`` sleeping processes whose argv[0] is ``prefix-<i>``; ``busy``: the one
    busy process (BUSY) instead."""
    if busy:
        procs = [subprocess.Popen([f"{prefix}-0", "-c", BUSY], executable=sys.executable)]
    else:
        procs = [
            subprocess.Popen([f"{prefix}-{i}", "100000"], executable="/bin/sleep")
            for i in range(count)
        ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def scrape(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read()
    return time.perf_counter() - started, len(body)


@dataclass
class Exporter:
    """One running exporter and what its measured windows add up to."""

    name: str
    pid: int
    url: str
    cpu_s: float = 0.0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    size: int = 0
    per_thread: bool = True  # split its CPU by thread (a thread that ends loses its part)
    thread_ns: dict[str, int] = field(default_factory=dict)

    def window(self, seconds: float, interval: float) -> None:
        """Scrape once per interval for ``seconds``; adds the CPU time used meanwhile."""
        threads_before = thread_counters(self.pid) if self.per_thread else {}
        cpu_before, started = cpu_seconds(self.pid), time.monotonic()
        tick = started
        while time.monotonic() - started < seconds:
            latency, self.size = scrape(self.url)
            self.latencies.append(latency)
            tick += interval
            time.sleep(max(0.0, tick - time.monotonic()))
        self.seconds += time.monotonic() - started
        self.cpu_s += cpu_seconds(self.pid) - cpu_before
        if self.per_thread:
            for thread, after in thread_counters(self.pid).items():
                before = threads_before.get(thread)
                ran = after.run_ns - (before.run_ns if before is not None else 0)
                self.thread_ns[thread] = self.thread_ns.get(thread, 0) + ran

    def result(self, targets: int, idle: int, name: str | None = None, case: str = "") -> Result:
        return Result(
            exporter=name or self.name,
            targets=targets,
            case=case or str(targets),
            idle_processes=idle,
            duration_s=round(self.seconds, 1),
            cpu_s=round(self.cpu_s, 3),
            cpu_share=round(self.cpu_s / self.seconds, 5),
            rss_mib=round(rss_bytes(self.pid) / 2**20, 1),
            scrape_p50_ms=round(percentile(self.latencies, 0.5) * 1000, 2),
            scrape_p99_ms=round(percentile(self.latencies, 0.99) * 1000, 2),
            scrape_bytes=self.size,
            threads_ms_per_s={
                thread: round(ns / 1e6 / self.seconds, 3)
                for thread, ns in sorted(self.thread_ns.items())
            },
            run_ms_per_s=round(sum(self.thread_ns.values()) / 1e6 / self.seconds, 3),
        )


@contextmanager
def alone(running: Exporter, exporters: list[Exporter]) -> Iterator[None]:
    """``running`` continued and every other exporter stopped: they never compete."""
    for other in exporters:
        if other is not running:
            os.kill(other.pid, signal.SIGSTOP)
    os.kill(running.pid, signal.SIGCONT)
    try:
        yield
    finally:
        for other in exporters:
            os.kill(other.pid, signal.SIGCONT)


@contextmanager
def daemon(
    pids: list[int], workdir: Path, args: argparse.Namespace, pythonpath: Path | None = None
) -> Iterator[tuple[int, str]]:
    """The edgewatt daemon with every pid registered (from ``pythonpath``, an older
    revision's tree, where given): yields its pid and /metrics URL."""
    workdir.mkdir()
    sock = str(workdir / "edgewatt.sock")
    port = free_port()
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    proc = start_daemon(
        sock,
        workdir / "state",
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        str(args.interval),
        env=env,
    )
    try:
        for i, pid in enumerate(pids):
            body = {"pid": pid, "labels": {"run": f"bench-{i}"}}
            status, data = transport.call(sock, "POST", "/v1/targets", body, timeout=10)
            if status != 201:
                raise RuntimeError(f"registering pid {pid}: {status} {data}")
        yield proc.pid, f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only then
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def process_exporter(workdir: Path) -> Iterator[tuple[int, str] | None]:
    """Debian's process-exporter, one group per benchmark process; None if absent."""
    binary = shutil.which(PROCESS_EXPORTER)
    if binary is None:
        yield None
        return
    config = workdir / "process-exporter.yml"
    config.write_text(PROCESS_EXPORTER_CONFIG.replace("{prefix}", PREFIX))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary, "-config.path", str(config), "-web.listen-address", f"127.0.0.1:{port}",
            "-threads=false", "-gather-smaps=false",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                scrape(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("process-exporter did not start") from None
                time.sleep(0.05)
        yield proc.pid, url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=10)


def compare(
    targets: int, workdir: Path, args: argparse.Namespace, busy: bool = False
) -> list[Result]:
    case = f"{targets} busy" if busy else str(targets)
    with contextlib.ExitStack() as stack:
        pids = stack.enter_context(idle_processes(targets, PREFIX, busy))
        pid, url = stack.enter_context(daemon(pids, workdir / "this", args))
        exporters = [Exporter("edgewatt", pid, url, per_thread=True)]
        if args.rev:
            tree = stack.enter_context(checkout(args.rev))
            old = stack.enter_context(daemon(pids, workdir / "rev", args, tree))
            exporters.append(Exporter(f"edgewatt@{args.rev}", *old, per_thread=True))
        other = stack.enter_context(process_exporter(workdir))
        if other is not None:
            exporters.append(Exporter("process-exporter", *other))
        for exporter in exporters:
            with alone(exporter, exporters):
                for _ in range(3):  # first scrapes build caches on both sides
                    scrape(exporter.url)
                    time.sleep(args.interval)
        for turn in range(args.windows):
            for exporter in exporters if turn % 2 == 0 else exporters[::-1]:
                with alone(exporter, exporters):
                    exporter.window(args.duration / args.windows, args.interval)
        results = [e.result(targets, 0, case=case) for e in exporters]
        if args.idle_processes and targets == args.targets:
            # Same daemon, A-B-A: with the unrelated processes, then without again,
            # so drift on the machine shows up rather than passing for an effect.
            k = args.idle_processes
            with alone(exporters[0], exporters):
                with idle_processes(k, "edgewatt-unrelated"):
                    loaded = Exporter("edgewatt", pid, url, per_thread=True)
                    loaded.window(args.duration, args.interval)
                again = Exporter("edgewatt", pid, url, per_thread=True)
                again.window(args.duration, args.interval)
            results += [loaded.result(targets, k), again.result(targets, 0, "edgewatt (again)")]
    return results


def print_table(results: list[Result]) -> None:
    header = (
        f"{'exporter':22s} {'N':>7s} {'idle':>5s} {'CPU s':>7s} {'% core':>7s} "
        f"{'RSS MiB':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'bytes':>8s}  CPU ms/s by thread"
    )
    print(header)
    for r in results:
        threads = " ".join(f"{t}={ms:.2f}" for t, ms in r.threads_ms_per_s.items() if ms >= 0.005)
        if r.exporter == "process-exporter":
            threads = f"(all threads: {r.run_ms_per_s:.2f})"
        print(
            f"{r.exporter:22s} {r.case:>7s} {r.idle_processes:5d} {r.cpu_s:7.2f} "
            f"{r.cpu_share * 100:7.2f} {r.rss_mib:8.1f} {r.scrape_p50_ms:8.2f} "
            f"{r.scrape_p99_ms:8.2f} {r.scrape_bytes:8d}  {threads}"
        )


def ratios(
    results: list[Result], exporter: str = "edgewatt", ticks: bool = True
) -> dict[str, float]:
    """CPU of ``exporter`` / CPU of process-exporter, per case (no extra idle processes):
    from /proc/PID/stat's ticks, or (``ticks`` false) the threads' run time in ns."""
    out = {}
    for case in dict.fromkeys(r.case for r in results):
        ours = [
            r for r in results if r.case == case and r.exporter == exporter and not r.idle_processes
        ]
        theirs = [r for r in results if r.case == case and r.exporter == "process-exporter"]
        if ticks and ours and theirs and theirs[0].cpu_s > 0:
            out[case] = round(ours[0].cpu_s / theirs[0].cpu_s, 3)
        elif not ticks and ours and theirs and theirs[0].run_ms_per_s > 0:
            out[case] = round(ours[0].run_ms_per_s / theirs[0].run_ms_per_s, 3)
    return out


def plot(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("edgewatt", "process-exporter"):
        points = sorted(
            (r.targets, r.cpu_share * 100)
            for r in results
            if r.exporter == name and not r.idle_processes
        )
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.set_xlabel("monitored processes (N)")
    ax.set_ylabel("CPU (% of one core)")
    ax.set_title("Monitoring cost at one sample and one scrape per second")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=200, help="monitored processes (N)")
    parser.add_argument("--duration", type=float, default=60, help="seconds measured per run")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument(
        "--windows", type=int, default=6, help="turns each exporter takes within --duration"
    )
    parser.add_argument("--idle-processes", type=int, default=0, metavar="K")
    parser.add_argument(
        "--sweep", metavar="N,N,...", help="compare at each N (e.g. 1,10,100,200,500)"
    )
    parser.add_argument("--busy", action="store_true", help="also compare on one busy target")
    parser.add_argument("--rev", metavar="REV", help="also run a daemon from this git revision")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--png", metavar="PATH", help="cost versus N (needs --sweep and matplotlib)"
    )
    args = parser.parse_args()

    sizes = [int(n) for n in args.sweep.split(",")] if args.sweep else [args.targets]
    if args.targets not in sizes:
        args.targets = sizes[-1]
    if shutil.which(PROCESS_EXPORTER) is None:
        print(
            f"{PROCESS_EXPORTER} not found, measuring edgewatt alone: "
            f"apt-get install {PROCESS_EXPORTER}"
        )
    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-overhead-"))
    results: list[Result] = []
    try:
        cases = [(n, False) for n in sizes] + ([(1, True)] if args.busy else [])
        for n, busy in cases:
            found = compare(n, workdir, args, busy)
            results += found
            print_table(found)
            print(flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print("Summary")
    print_table(results)
    names = ["edgewatt"] + ([f"edgewatt@{args.rev}"] if args.rev else [])
    cpu_ratio = ratios(results)
    run_ratio = {name: ratios(results, name, ticks=False) for name in names}
    rev_ratio = ratios(results, names[-1]) if args.rev else {}
    for name in names:
        ticked = ratios(results, name)
        for case, ratio in run_ratio[name].items():
            print(
                f"CPU ratio {name}/process-exporter at N={case}: {ratio:.3f} by run time "
                f"({ticked.get(case, float('nan')):.3f} by ticks)"
            )
    idle_change = None
    base = [
        r.cpu_s
        for r in results
        if r.exporter in ("edgewatt", "edgewatt (again)")
        and r.case == str(args.targets)
        and not r.idle_processes
    ]
    loaded = [r for r in results if r.idle_processes]
    if loaded:
        # Against the mean of the runs before and after (same N, same daemon).
        idle_change = round(loaded[0].cpu_s / statistics.mean(base) - 1, 3)
        print(
            f"edgewatt CPU with {loaded[0].idle_processes} unrelated idle processes: "
            f"{idle_change * 100:+.1f} %"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "interval_s": args.interval,
                    "results": [asdict(r) for r in results],
                    "cpu_ratio": cpu_ratio,
                    "rev": args.rev,
                    "rev_cpu_ratio": rev_ratio,
                    "run_time_ratio": run_ratio,
                    "idle_processes_change": idle_change,
                },
                indent=1,
            )
        )
    if args.png:
        plot(results, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
