"""What persisting registrations writes to the storage under the state directory (an
edge board's eMMC or SD card): one user's worst case, this checkout beside an older
revision in one run.

Each daemon, one after the other on the same sleeping processes, with its own state
directory on this machine's disk:

1. `register`: `--targets` (50) registrations, each with the fattest labels allowed
   (64 values of 1,000 bytes: ~64 KiB of JSON a target);
2. `changes`: `--changes` (200) changes with those held, a quarter each of: a thin
   target registered, the same unregistered, a held target joined (one more holder),
   the same let go;
3. `churn`: one client registering and unregistering a fat target as fast as it is
   answered (the hostile user of the issue), `--churn-s` (10) seconds for the older
   revision (it writes ~50 MB/s meanwhile), `--churn-new-s` (120) for this checkout,
   so its second half is long past the write budget's burst and holds several of the
   budget's paced writes (a 64 KiB record every ~14 s at the default 16 MiB an hour).

Bytes written are the kernel's: `write_bytes` of /proc/PID/io, the page cache the
daemon dirtied (what will reach the storage; a page dirtied again before writeback
counts once). `churn` is also given per second over its second half (past the write
budget's burst: what one user sustains). The ratio is the older revision's figure
over this checkout's.

    .venv/bin/python benchmarks/state_writes.py --rev REV [--targets 50]
        [--changes 200] [--churn-s 10] [--churn-new-s 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measure import checkout, start_daemon  # noqa: E402
from edgewatt.core import transport  # noqa: E402

FAT = {f"l{n:02}": chr(ord("a") + n % 26) * 1000 for n in range(64)}


@dataclass
class Figures:
    daemon: str
    request_bytes: int  # the registrations' request bodies
    register_bytes: int
    change_bytes: int  # all of `changes`
    churn_bytes: int
    churn_cycles: int
    churn_sustained_bps: float  # over the churn's second half
    changes: int
    churn_s: float


def write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


class Client:
    def __init__(self, sock: str) -> None:
        self.sock = sock

    def register(self, pid: int, labels: dict[str, str]) -> str:
        body = {"pid": pid, "labels": labels}
        status, data = transport.call(self.sock, "POST", "/v1/targets", body)
        if status not in (200, 201):
            raise RuntimeError(f"registering {pid}: {status} {data}")
        return data["id"]

    def delete(self, target_id: str) -> None:
        status, data = transport.call(self.sock, "DELETE", f"/v1/targets/{target_id}")
        if status != 200:
            raise RuntimeError(f"unregistering {target_id}: {status} {data}")


@contextlib.contextmanager
def daemon(workdir: Path, pythonpath: Path | None) -> Iterator[tuple[int, Client]]:
    workdir.mkdir()
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    sock = str(workdir / "edgewatt.sock")
    proc = start_daemon(sock, workdir / "state", "--listen", "127.0.0.1:0", env=env)
    try:
        yield proc.pid, Client(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def measure(name: str, workdir: Path, pythonpath: Path | None, args: argparse.Namespace,
            sleepers: list[int], churn_s: float) -> Figures:  # fmt: skip
    with daemon(workdir, pythonpath) as (pid, client):
        at = write_bytes(pid)
        held = [client.register(p, FAT) for p in sleepers[: args.targets]]
        registered = write_bytes(pid) - at
        request = args.targets * len(json.dumps({"pid": sleepers[0], "labels": FAT}))

        thin, spare = sleepers[args.targets], sleepers[args.targets + 1]
        at = write_bytes(pid)
        for n in range(args.changes // 4):
            client.delete(client.register(thin, {"n": str(n)}))
            client.register(sleepers[n % args.targets], {})  # joined: one more holder
            client.delete(held[n % args.targets])
        changed = write_bytes(pid) - at

        at = write_bytes(pid)
        started = time.monotonic()
        half, cycles, middle = started + churn_s / 2, 0, None
        while (now := time.monotonic()) < started + churn_s:
            if middle is None and now >= half:
                middle = (now, write_bytes(pid))
            client.delete(client.register(spare, {**FAT, "l00": str(cycles)}))
            cycles += 1
        churned = write_bytes(pid) - at
        assert middle is not None
        sustained = (write_bytes(pid) - middle[1]) / (time.monotonic() - middle[0])
    changes = args.changes // 4 * 4
    return Figures(name, request, registered, changed, churned, cycles, sustained, changes, churn_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the older revision to compare with")
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--churn-s", type=float, default=10.0)
    parser.add_argument("--churn-new-s", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    code = "import time; time.sleep(3600)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(args.targets + 2)]
    # On this disk, not /tmp: a tmpfs dirties no page the kernel counts.
    (ROOT / ".cache").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="edgewatt-state-", dir=ROOT / ".cache"))
    try:
        pids = [p.pid for p in procs]
        with checkout(args.rev) as tree:
            old = measure(f"edgewatt@{args.rev}", work / "old", tree, args, pids, args.churn_s)
        new = measure("edgewatt", work / "new", None, args, pids, args.churn_new_s)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("requests (MB)", lambda f: f.request_bytes / 1e6),
        (f"register {args.targets} (MB)", lambda f: f.register_bytes / 1e6),
        ("per change (KB)", lambda f: f.change_bytes / f.changes / 1e3),
        ("churn cycles per s", lambda f: f.churn_cycles / f.churn_s),
        ("churn (MB)", lambda f: f.churn_bytes / 1e6),
        ("churn sustained (MB/s)", lambda f: f.churn_sustained_bps / 1e6),
        ("churn sustained (MB/h)", lambda f: f.churn_sustained_bps * 3600 / 1e6),
    ]
    print(f"{'':26}{old.daemon:>22}{new.daemon:>14}{'ratio':>10}")
    for label, value in rows:
        a, b = value(old), value(new)
        ratio = f"{a / b:.3g}x" if b else "-"
        print(f"{label:26}{a:>22.3f}{b:>14.3f}{ratio:>10}")
    if args.json:
        args.json.write_text(json.dumps([asdict(old), asdict(new)], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
