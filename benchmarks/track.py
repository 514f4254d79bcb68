"""What ``client.track`` adds to each call, beside the same call untracked.

A 10 ms function (time.sleep) is called ``--calls`` times three ways in one run:
untracked, tracked with the daemon (each call's edges are two passes the daemon runs
at once) and tracked in-process (no daemon: the process's own sampler). The overhead
per call is the tracked call's wall time minus the untracked median; reported as
p50/p99 in ms and as the ratio of the tracked p99 to the untracked p99; each edge
(entering, leaving: one request and one pass each) is timed by itself too. Beside
them, the machine's floor ("floor"): the same call with a bare 200-byte request and
answer over a Unix socket to another process at each edge, what no edge through a
daemon can go under on the machine and load of the run. Each edge is reported whole
and less the caller's own wait for a CPU in it (its run_delay in
/proc/thread-self/schedstat, as the kernel counted it): with every core busy, what is
left is what the daemon and the transport cost the caller, which the budget holds.
Beside them, the daemon's CPU over each run (all its threads, from /proc/PID/stat's
10 ms ticks) per edge: what a busy machine does not blur.

    .venv/bin/python benchmarks/track.py [--calls 300] [--interval 5] [--json out.json]
        [--sources none,ina3221,...] [--loads idle,...] [--others 20] [--rev main]

A registration anew (``client.register()`` in a process registered before, its own
connection included; daemon only, the in-process one is first_registration.py's) is
timed as many times beside them. ``--mappings N``: the callers hold N mappings of
64 KiB more, each touched (a process with its libraries and tensors: PSS is read
from its smaps_rollup, whose cost grows with them). ``--fds N``: the callers hold N
file descriptors more (a trainer's data files, loader pipes and device files: an
edge lists a member's descriptors to find the sockets it holds, whose bytes it
counts).

``--others N``: N idle targets registered with each daemon beside the caller's (``sleep``
processes, not the caller's children, as another user's would be): an edge reads only
the target that asked, so its cost stays that of one target.

``--rev REV``: beside this checkout, the same modes with the daemon and the client of
git revision REV (its tree extracted, this checkout's native reader copied into it),
one after the other under the same load: "daemon @main" against "daemon".

Side by side for each power source (no edge waits for a reading), each
a stand-in the daemon and the in-process sampler read as the real one:
``none``; ``ina3221`` (a stand-in INA3221 in the kernel's sysfs layout,
tests/power_standin.py, streamed at ``power_sample_hz`` and read at each edge);
``rapl`` (powercap counters in sysfs, read at each edge); ``tegrastats-50`` and
``tegrastats-1`` (tests/bin/tegrastats printing at 50 Hz and at 1 Hz: pushed lines);
``nvml`` (a fake pynvml module, read at each edge); ``powermetrics``
(tests/bin/powermetrics, pushed; in-process only: the daemon has no key for its path,
macOS runs the client in-process). In-process, tegrastats is the one that
``EDGEWATT_TEGRASTATS`` names, as for the daemon.

Each mode runs three times in one run: on the machine as it is ("idle"),
beside one busy loop ("one hog": a Python ``while True: pass`` process) and beside
one busy loop per core ("all cores"), the untracked median of the same load as the
base. As root, the daemon runs twice: at nice 0 ("daemon", as ``edgewatt serve``
runs by hand) and at the systemd unit's ``Nice=-10`` ("daemon -10");
``--no-unit-nice`` runs the first only.

Budget: an edge at most 1 ms p99 idle, 5 ms with every core
busy, with a daemon and in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import checkout, percentile, start_daemon  # noqa: E402
from edgewatt import client  # noqa: E402
from tests.power_standin import build_tree  # noqa: E402
from tests.test_power_sources import rapl_tree  # noqa: E402

# What the caller holds more (--fds, --mappings): open descriptors, as a trainer's
# files and pipes; mappings, as one with its libraries and tensors loaded, each of its
# own (shared and private alternate, so none merge), every page touched.
HELD = """
import mmap, os
held_fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[4]))]
held_maps = []
for i in range(mappings):
    held_maps.append(mmap.mmap(-1, 65536, flags=mmap.MAP_SHARED if i % 2 else mmap.MAP_PRIVATE))
    held_maps[-1].write(b"x" * 65536)
"""

CALLER = (
    """
import json, os, sys, time
from edgewatt import client
calls, mode, mappings = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
"""
    + HELD
    + """
# The caller's own wait for a CPU (run_delay, ns, as the kernel counts it): an edge
# less that wait is what the daemon and the transport cost it.
schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
def waited():
    return int(os.pread(schedstat, 200, 0).split()[1]) / 1e9
reg = None
if mode == "floor":  # a bare request and answer with another process: the machine's floor
    import socket
    mine, theirs = socket.socketpair()
    if os.fork() == 0:
        mine.close()
        while (asked := theirs.recv(4096)):
            theirs.sendall(asked)
        os._exit(0)
    theirs.close()
elif mode != "untracked":
    reg = client.register(fallback="never" if mode == "daemon" else "always")
    assert reg.mode == ("daemon" if mode == "daemon" else "local"), reg.mode
tracked = client.track("step", registration=reg)
def step():
    time.sleep(0.010)
def edge():
    if mode == "floor":
        mine.sendall(b"x" * 200); mine.recv(4096)
    else:
        (tracked.__exit__(None, None, None) if entering is None else tracked.__enter__())
walls, edges, own, cpu = [], [], [], []
for _ in range(calls):
    if reg is None and mode != "floor":
        started = time.perf_counter()
        step()
        walls.append(time.perf_counter() - started)
        continue
    entering = True
    wait = waited()
    started = time.perf_counter()
    edge()
    entered = time.perf_counter()
    own.append(waited() - wait)
    step()
    entering, wait = None, waited()
    leaving = time.perf_counter()
    edge()
    left = time.perf_counter()
    own.append(waited() - wait)
    edges += [entered - started, left - leaving]
    walls.append(left - started)
    if reg is not None:
        cpu.append(tracked.last.cpu_s)
print(json.dumps({"walls": walls, "edges": edges, "own_wait": own,
                  "cpu_known": sum(c is not None for c in cpu)}))
"""
)

# A registration of the caller anew, as a process's first call: its own connection,
# the target made and read, the answer (its unregistering not counted).
REGISTERING = (
    """
import json, sys, time
from edgewatt import client
calls, mappings = int(sys.argv[1]), int(sys.argv[3])
"""
    + HELD
    + """
registers = []
for _ in range(calls):
    started = time.perf_counter()
    reg = client.register(fallback="never")
    registers.append(time.perf_counter() - started)
    reg.close()
print(json.dumps({"registers": registers}))
"""
)

# A pynvml that is FakeNvml (tests/test_power_sources.py): imported, it puts the fake
# in its own place in sys.modules, which the import then hands out.
FAKE_PYNVML = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.test_power_sources import FakeNvml
sys.modules["pynvml"] = FakeNvml()
"""

SOURCES = ("none", "ina3221", "rapl", "tegrastats-50", "tegrastats-1", "nvml", "powermetrics")
IN_PROCESS_ONLY = {"powermetrics"}  # the daemon has no path key for it


def source_env(source: str, workdir: Path) -> dict[str, str]:
    """What makes the daemon and the in-process sampler read ``source``'s stand-in."""
    sysfs = workdir / source / "sys"
    sysfs.mkdir(parents=True)
    env = {"EDGEWATT_SYSFS_PATH": str(sysfs)}
    if source == "none":
        return {**env, "EDGEWATT_POWER_SOURCES": "ina3221"}  # an empty tree: none found
    if source == "ina3221":
        build_tree(sysfs)
    elif source == "rapl":
        rapl_tree(sysfs, package_uj=1_000_000, dram_uj=1_000_000)
    elif source.startswith("tegrastats"):
        hz = source.split("-")[1]
        tegrastats = str(ROOT / "tests" / "bin" / "tegrastats")
        return {**env, "EDGEWATT_TEGRASTATS": tegrastats, "EDGEWATT_POWER_SAMPLE_HZ": hz,
                "EDGEWATT_POWER_SOURCES": "tegrastats"}  # fmt: skip
    elif source == "nvml":
        (workdir / source / "pynvml.py").write_text(FAKE_PYNVML)
        env["PYTHONPATH"] = str(workdir / source)
    elif source == "powermetrics":
        env["EDGEWATT_POWERMETRICS"] = str(ROOT / "tests" / "bin" / "powermetrics")
    return {**env, "EDGEWATT_POWER_SOURCES": source}


def with_native_reader(top: Path) -> Path:
    """``top`` (a revision's checkout) with this checkout's built native reader (a tree
    from git has none): both read power the same way."""
    for built in (ROOT / "core" / "power").glob("_stream*.so"):
        shutil.copy(built, top / "edgewatt" / "core" / "power" / built.name)
    return top


def daemon_cpu_s(pid: int) -> float:
    """The daemon's CPU so far (s), its ended threads' (each connection's) included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_path(env: dict[str, str], first: Path | None) -> dict[str, str]:
    """``env`` with ``first`` (a revision's folder) put first on its PYTHONPATH."""
    if first is None:
        return env
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": str(first) + (os.pathsep + rest if rest else "")}


def run_caller(
    calls: int,
    mode: str,
    socket_path: str,
    power_env: dict[str, str],
    mappings: int = 0,
    fds: int = 0,
) -> dict:
    code = REGISTERING if mode == "register" else CALLER
    out = subprocess.run(
        [sys.executable, "-c", code, str(calls), mode, str(mappings), str(fds)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "EDGEWATT_SOCKET": socket_path, **power_env},
    )
    return json.loads(out.stdout)


LOADS = ("idle", "one hog", "all cores")
UNIT_NICE = -10  # deploy/systemd/edgewatt.service's Nice=
DAEMON = {0: "daemon", UNIT_NICE: f"daemon {UNIT_NICE}"}


@contextlib.contextmanager
def hogs(load: str) -> Iterator[None]:
    """The busy loops of ``load``."""
    count = {"idle": 0, "one hog": 1, "all cores": os.cpu_count() or 1}[load]
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.3 if procs else 0.0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def figures(runs: dict[str, dict]) -> dict[str, dict]:
    """p50/p99/max of each mode's overhead over the untracked median, in ms."""
    base = statistics.median(runs["untracked"]["walls"])
    untracked_p99 = percentile(runs["untracked"]["walls"], 0.99)
    results = {}
    for mode, run in runs.items():
        overhead = sorted((w - base) * 1000 for w in run["walls"])
        edges = sorted(e * 1000 for e in run["edges"]) or [0.0]
        # Each edge less the caller's own wait for a CPU in it (as the kernel counted).
        less_wait = sorted(max(0.0, e - w) * 1000 for e, w in zip(run["edges"], run["own_wait"]))
        registers = sorted(run.get("registers", ()))
        results[mode] = {
            "p50_ms": round(percentile(overhead, 0.5), 3),
            "p99_ms": round(percentile(overhead, 0.99), 3),
            "max_ms": round(overhead[-1], 3),
            "edge_p50_ms": round(percentile(edges, 0.5), 3),
            "edge_p99_ms": round(percentile(edges, 0.99), 3),
            "edge_p99_less_own_wait_ms": round(percentile(less_wait or [0.0], 0.99), 3),
            # The call's entering and leaving apart: a phase's start is answered before
            # the rest of its pass, its end once its closing row is written.
            "entering_p99_ms": round(percentile(run["edges"][0::2] or [0.0], 0.99) * 1e3, 3),
            "leaving_p99_ms": round(percentile(run["edges"][1::2] or [0.0], 0.99) * 1e3, 3),
            # The daemon's CPU over the run (10 ms ticks) per edge: what load leaves exact.
            "daemon_cpu_us_per_edge": (
                round(run["daemon_cpu_s"] / len(run["edges"]) * 1e6)
                if "daemon_cpu_s" in run
                else None
            ),
            # A registration anew (daemon only): its round trip, a connection's included.
            "register_p50_ms": round(percentile(registers, 0.5) * 1e3, 3) if registers else None,
            "register_p99_ms": round(percentile(registers, 0.99) * 1e3, 3) if registers else None,
            "cpu_known": run["cpu_known"],
            "p99_ratio_to_untracked": round(percentile(run["walls"], 0.99) / untracked_p99, 3),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--interval", type=float, default=5.0, help="the daemon's interval (s)")
    parser.add_argument("--sources", default=",".join(SOURCES), help="of " + ", ".join(SOURCES))
    parser.add_argument("--loads", default=",".join(LOADS), help="of " + ", ".join(LOADS))
    parser.add_argument(
        "--no-unit-nice", dest="unit_nice", action="store_false", help="one daemon, at nice 0"
    )
    parser.add_argument("--rev", help="a git revision measured beside this checkout")
    parser.add_argument(
        "--others", type=int, default=0, help="idle targets registered beside the caller's"
    )
    parser.add_argument(
        "--mappings", type=int, default=0, help="64 KiB mappings the caller holds, each touched"
    )
    parser.add_argument(
        "--fds", type=int, default=0, help="file descriptors more the caller holds open"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    with builds_of(args.rev) as builds:
        results = measure(args, builds)
    report(args, results)


@contextlib.contextmanager
def builds_of(rev: str | None) -> Iterator[dict[str, Path | None]]:
    """Each build's suffix in the modes' names, and its folder first on PYTHONPATH:
    this checkout's (none), and ``rev``'s beside it where given."""
    builds: dict[str, Path | None] = {"": None}
    if rev is None:
        yield builds
        return
    with checkout(rev) as top:
        builds[f" @{rev}"] = with_native_reader(top)
        yield builds


def measure(args: argparse.Namespace, builds: dict[str, Path | None]) -> dict[str, dict]:
    """Every source's and load's figures, by "source/load", then by mode."""
    workdir = Path(tempfile.mkdtemp(prefix="edgewatt-track-"))
    # The daemon as `edgewatt serve` runs by hand, and as the systemd unit runs it
    # (Nice=UNIT_NICE; root only can start it so here).
    nices = [0] + ([UNIT_NICE] if os.geteuid() == 0 and args.unit_nice else [])
    results: dict[str, dict[str, dict]] = {}
    for source in args.sources.split(","):
        power_env = source_env(source, workdir)
        daemons = {}
        if source not in IN_PROCESS_ONLY:
            daemons = {
                (nice, build): start_daemon(
                    f"{workdir}/{source}/ew{nice}{build.strip()}.sock",
                    workdir / source / f"state{nice}{build.strip()}",
                    "--listen",
                    "127.0.0.1:0",
                    "--interval",
                    str(args.interval),
                    env=with_path({**os.environ, **power_env}, first),
                    nice=nice,
                )
                for nice in nices
                for build, first in builds.items()
            }
        others = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.others)]
        held = [
            client.register(pid=p.pid, socket=f"{workdir}/{source}/ew{nice}{build.strip()}.sock")
            for p in others
            for nice, build in daemons
        ]
        try:
            for load in args.loads.split(","):
                with hogs(load):
                    none = str(workdir / "none.sock")
                    runs = {"untracked": run_caller(args.calls, "untracked", none, power_env)}
                    runs["floor"] = run_caller(args.calls, "floor", none, power_env)
                    for (nice, build), daemon in daemons.items():
                        sock = f"{workdir}/{source}/ew{nice}{build.strip()}.sock"
                        env = with_path(power_env, builds[build])
                        cpu = daemon_cpu_s(daemon.pid)
                        run = run_caller(args.calls, "daemon", sock, env, args.mappings, args.fds)
                        run["daemon_cpu_s"] = daemon_cpu_s(daemon.pid) - cpu
                        registering = run_caller(
                            args.calls, "register", sock, env, args.mappings, args.fds
                        )
                        run["registers"] = registering["registers"]
                        runs[DAEMON[nice] + build] = run
                    for build, first in builds.items():
                        env = with_path(power_env, first)
                        runs["in-process" + build] = run_caller(
                            args.calls, "in-process", none, env, args.mappings, args.fds
                        )
                results[f"{source}/{load}"] = figures(runs)
        finally:
            for daemon in daemons.values():
                daemon.terminate()
                daemon.wait()
            for other in others:
                other.kill()
                other.wait()
            held.clear()
    return results


def report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    print(
        f"10 ms function, {args.calls} calls each, daemon interval {args.interval:g} s, "
        f"{os.cpu_count()} cores, {args.others} other targets registered, the caller holding "
        f"{args.mappings} mappings and {args.fds} file descriptors more; a call's overhead "
        "over the untracked median, each edge, and a registration anew (ms)"
    )
    print(
        f"{'source/load':24} {'':18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'edge p50':>9} {'edge p99':>9} {'p99 less own wait':>18} {'daemon CPU us':>14} "
        f"{'enter p99':>10} {'leave p99':>10} {'register p50/p99':>17}"
    )
    for where, modes in results.items():
        for mode, r in modes.items():
            if mode == "untracked":
                continue
            registered = (
                f"{r['register_p50_ms']:.2f} / {r['register_p99_ms']:.2f}"
                if r["register_p50_ms"] is not None
                else ""
            )
            print(
                f"{where:24} {mode:18} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f} "
                f"{r['edge_p50_ms']:9.2f} {r['edge_p99_ms']:9.2f} "
                f"{r['edge_p99_less_own_wait_ms']:18.2f} {r['daemon_cpu_us_per_edge'] or '':>14} "
                f"{r['entering_p99_ms']:10.2f} {r['leaving_p99_ms']:10.2f} {registered:>17}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
