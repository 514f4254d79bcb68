"""Shared fixtures: the real daemon started as a subprocess on a temp socket and port."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgewatt.core import transport
from edgewatt.core.facts import procfs
from edgewatt.core.targets import Limits, Resolver, TargetTable

ROOT = Path(__file__).resolve().parent.parent


def copy_package(into: Path) -> None:
    """Lay the source folders out as the installed package ``into/edgewatt/...``,
    readable by every user: for tests that run code as another user with the system
    Python (PYTHONPATH=into)."""
    for folder in ("core", "client", "exporter", "cli"):
        shutil.copytree(
            ROOT / folder, into / "edgewatt" / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    for p in into.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


# A daemon with the systemd unit's lack of CAP_SYS_ADMIN (no setns into a container's
# network namespace), as root otherwise: DaemonProcess.prefix.
WITHOUT_SYS_ADMIN = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 256 KiB that a test can fill (an edge board's eMMC)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "state"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# For code run as another user, who cannot read root's venv.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory any user can enter (pytest's tmp_path is private to root), holding
    the package for PYTHONPATH."""
    path = Path(tempfile.mkdtemp(prefix="edgewatt-test-"))
    path.chmod(0o755)
    copy_package(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Any, timeout: float = 10.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)


def rounded_quotient(numerator: float, denominator: float, digits: int = 3) -> tuple[float, float]:
    """Where n / d lies for figures shown as ``numerator`` and ``denominator``, each
    rounded to ``digits`` decimals (both positive): a quotient exact by design is
    compared with this, not with a percentage."""
    half = 0.5 * 10.0**-digits
    slack = 1e-12 * (abs(numerator) + 1)  # the decimal's nearest double
    return (
        (numerator - half - slack) / (denominator + half),
        (numerator + half + slack) / (denominator - half),
    )


@dataclass
class DaemonProcess:
    """A running `edgewatt serve` with helpers to talk to it as a user would."""

    socket: str
    port: int
    state_dir: Path
    interval: float
    log_path: Path
    proc: subprocess.Popen | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)  # e.g. setpriv, to drop a capability
    python: str = sys.executable  # another environment's interpreter

    def start(self) -> DaemonProcess:
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                *self.prefix,
                self.python,
                "-m",
                "edgewatt.cli",
                "serve",
                "--socket",
                self.socket,
                "--listen",
                f"127.0.0.1:{self.port}",
                "--state-dir",
                str(self.state_dir),
                "--interval",
                str(self.interval),
                *self.extra_args,
            ],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **self.env},
        )
        wait_for(self._healthy, timeout=15)
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited early:\n{self.log()}")
        try:
            return self.call("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Stop the daemon; returns seconds it took to exit."""
        assert self.proc is not None
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return time.monotonic() - started

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(self, method: str, path: str, body: Any = None, timeout: float = 5.0) -> Any:
        return transport.call(self.socket, method, path, body, timeout=timeout)

    def register(self, pid: int, **body: Any) -> dict[str, Any]:
        status, data = self.call("POST", "/v1/targets", {"pid": pid, **body})
        assert status in (200, 201), (status, data)
        return data

    def samples_taken(self, target_id: str) -> int:
        """The passes that have recorded ``target_id`` so far (its summary's count; a
        summary read without ``fresh`` takes none)."""
        return self.call("GET", f"/v1/targets/{target_id}/summary")[1]["samples"]

    def wait_passes(self, target_id: str, n: int = 1, timeout: float = 20.0) -> None:
        """Until ``n`` passes that started after this call have ended with a sample of
        ``target_id``, the last one published (/metrics and every reader show it): what
        a sleep of n intervals hoped for, known on a busy machine. A pass under way at
        the call counts for nothing, and a pass records its rows before it publishes,
        so the row of the pass after the n-th shows it done."""
        goal = self.samples_taken(target_id) + n + 2
        wait_for(lambda: self.samples_taken(target_id) >= goal, timeout=timeout)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def series(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """Samples named ``name`` whose labels include ``labels``."""
        found = []
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    found.append((sample.labels, sample.value))
        return found

    def value(self, name: str, **labels: str) -> float | None:
        found = self.series(name, **labels)
        assert len(found) <= 1, found
        return found[0][1] if found else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """A failed test's report ends with the last lines of its daemons' logs: what
    CI's run of a clean clone shows, where the temporary directory is gone."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for n, daemon in enumerate(getattr(item, "edgewatt_daemons", [])):
        with contextlib.suppress(OSError):
            tail = daemon.log().splitlines()[-40:]
            report.sections.append((f"daemon {n} log, last lines", "\n".join(tail)))


@pytest.fixture
def daemon_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[DaemonProcess] = []
    request.node.edgewatt_daemons = started  # for the report of a failure

    def make(
        interval: float = 0.2,
        state_dir: Path | None = None,
        socket_dir: Path | None = None,
        **kw: Any,
    ) -> DaemonProcess:
        d = DaemonProcess(
            socket=str((socket_dir or tmp_path) / f"ew{len(started)}.sock"),
            port=free_port(),
            state_dir=state_dir or tmp_path / "state",
            interval=interval,
            log_path=tmp_path / f"daemon{len(started)}.log",
            **kw,
        )
        started.append(d)
        return d.start()

    yield make
    for d in started:
        with contextlib.suppress(Exception):
            d.stop()


@pytest.fixture
def daemon(daemon_factory: Any) -> DaemonProcess:
    return daemon_factory()


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Start helper processes (python -c CODE); all are killed at the end."""
    procs: list[subprocess.Popen] = []

    def make(code: str, **kw: Any) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], **kw)
        procs.append(p)
        return p

    yield make
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()


def settled(pid: int) -> None:
    """Until the process waits: its scheduler counters stand still for 0.2 s."""
    before = None
    for _ in range(100):
        with open(f"/proc/{pid}/schedstat") as f:
            now = f.read()
        if now == before:
            return
        before = now
        time.sleep(0.2)
    raise AssertionError(f"pid {pid} never waited")


def kernel_cpu_seconds(pid: int) -> float:
    """utime+stime+cutime+cstime of a live process, straight from the kernel."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def binary(name: str, package: str = "prometheus") -> str:
    """A system binary the end-to-end tests need: skipped when absent, failed in CI."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run must install Debian's {package}")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return path


STORES = ROOT / ".cache" / "stores"  # Debian 13's packages, by tests/bin/fetch-stores


def fetched(folder: Path, relative: str, what: str, fetcher: str) -> str:
    """An executable that ``tests/bin/FETCHER`` put under ``folder`` (make test runs
    it): skipped with the fetch's own reason (``folder``/UNAVAILABLE) where it could
    not, failed in CI."""
    path = folder / relative
    if not os.access(path, os.X_OK):
        reason = folder / "UNAVAILABLE"
        why = reason.read_text().strip() if reason.exists() else f"run tests/bin/{fetcher}"
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing: {why}")
        pytest.skip(f"{what} is missing: {why}")
    return str(path)


def store_binary(name: str) -> str:
    """A binary of Debian 13's victoria-metrics or prometheus package."""
    return fetched(STORES, f"usr/bin/{name}", f"{name} from Debian 13", "fetch-stores")


def query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Any]:
    """A real Prometheus server scraping daemons every second; yields its URL."""
    running: list[tuple[subprocess.Popen, Any]] = []

    def make(*daemons: DaemonProcess) -> str:
        exe = binary("prometheus")
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: edgewatt\n    static_configs:\n"
            f"      - targets: {[f'127.0.0.1:{d.port}' for d in daemons]}\n"
        )
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        running.append((proc, log))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(f"{url}/-/ready"), timeout=30, step=0.2)
        return url

    yield make
    for proc, log in running:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def table_with(pid: int, **clocks: Callable[[], float]) -> TargetTable:
    """A target table with ``pid`` registered (descendants included), for in-process
    sampler tests; ``clocks``: its wall_clock and monotonic_clock, where given."""
    table = TargetTable(
        Limits(max_targets=10, history_samples=100, exited_retention_s=60),
        Resolver(procfs.boot_time(), procfs.CLOCK_TICKS),
        **clocks,
    )
    table.register(pid, {}, True, os.getuid())
    return table


STORE_HEALTH = {"victoria-metrics": "/health", "prometheus": "/-/ready", "vmagent": "/health"}


class PushPath:
    """Debian 13's vmagent, VictoriaMetrics and Prometheus 2.53, as a fleet runs them:
    devices push OTLP/HTTP to vmagent (``vmagent``/opentelemetry), which remote-writes
    into both stores, buffering on disk while one is down. Each can be stopped and
    started again (same port, same data)."""

    NAMES = ("victoria-metrics", "prometheus", "vmagent")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.binaries = {name: store_binary(name) for name in self.NAMES}
        ports = {name: free_port() for name in self.NAMES}
        self.url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        self.vmagent, self.victoria = self.url["vmagent"], self.url["victoria-metrics"]
        self.prometheus = self.url["prometheus"]
        (directory / "prometheus.yml").write_text("global:\n  evaluation_interval: 1s\n")
        self.args = {
            "victoria-metrics": [
                f"-httpListenAddr=127.0.0.1:{ports['victoria-metrics']}",
                f"-storageDataPath={directory / 'vm'}",
                "-search.latencyOffset=1s",  # the last 30 s are hidden by default
            ],
            "prometheus": [
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'prom'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                "--web.enable-remote-write-receiver",
            ],
            "vmagent": [
                f"-httpListenAddr=127.0.0.1:{ports['vmagent']}",
                "-opentelemetry.usePrometheusNaming",
                f"-remoteWrite.url={self.victoria}/api/v1/write",
                f"-remoteWrite.url={self.prometheus}/api/v1/write",
                f"-remoteWrite.tmpDataPath={directory / 'vmagent'}",
                "-remoteWrite.flushInterval=1s",
            ],
        }
        self.running: dict[str, tuple[subprocess.Popen, Any]] = {}

    def start(self, name: str) -> None:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen([self.binaries[name], *self.args[name]], stdout=log, stderr=log)
        self.running[name] = (proc, log)
        wait_for(lambda: _healthy(self.url[name] + STORE_HEALTH[name]), timeout=30, step=0.2)

    def stop(self, name: str) -> None:
        proc, log = self.running.pop(name)
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def push_path(tmp_path: Path) -> Iterator[PushPath]:
    path = PushPath(tmp_path)
    try:
        for name in PushPath.NAMES:
            path.start(name)
        yield path
    finally:
        for name in list(path.running):
            path.stop(name)


# -- talking to the API as a client would ---------------------------------------------


def raw(sock_path: str, data: bytes, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
    """Send raw bytes, read one response; returns (status, JSON body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(data)
        chunks = b""
        while b"\r\n\r\n" not in chunks:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks += chunk
        head, _, body = chunks.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(v)
            for k, _, v in (x.partition(": ") for x in lines[1:])
            if k.lower() == "content-length"
        )
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        assert "application/json" in head.decode().lower()
        return status, json.loads(body)


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


def call_as(
    uid: int, public: Path, sock_path: str, method: str, path: str, body: Any = None
) -> Any:
    """(status, JSON body) of an API call made by a process running as ``uid`` (the
    stdlib-only client, from ``public``: see copy_package)."""
    code = (
        "import json; from edgewatt.core import transport;"
        f"print(json.dumps(transport.call({sock_path!r}, {method!r}, {path!r}, {body!r})))"
    )
    out = subprocess.run(
        [SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, user=uid, group=uid,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public)}, cwd="/", check=True,
    )  # fmt: skip
    status, answer = json.loads(out.stdout)
    return status, answer


def assert_tcp_ip_bytes(figure: int, payload: int, packets: int) -> None:
    """IP bytes of TCP traffic: the payload a peer counted plus each packet's headers,
    IPv4's 20 and TCP's 20 to 60 (options: timestamps, SACK blocks, a SYN's MSS)."""
    headers = figure - payload
    assert 40 * packets <= headers <= 80 * packets, (figure, payload, packets)


# A sender's last line, once its TCP socket ``s`` is done: the payload bytes the kernel
# sent on it, what it sent again included, and of those the ones sent again (struct
# tcp_info's tcpi_bytes_sent and tcpi_bytes_retrans, Linux 4.19).
PRINT_TCP_SENT = (
    "import struct; print(*struct.unpack_from('QQ', s.getsockopt(socket.IPPROTO_TCP, "
    "socket.TCP_INFO, 232), 200), flush=True)\n"
)


def tcp_sent(printed: bytes | str, payload: int) -> int:
    """The payload bytes the kernel sent, from PRINT_TCP_SENT's line: the ``payload``
    the peer counted plus every segment TCP sent again. Each crossed the interface (on
    a busy host loopback reorders packets, and TCP resends what it takes for lost), so
    each is in a cgroup's counters; a test compares them with this, not the payload."""
    sent, again = map(int, printed.split())
    assert sent == payload + again, (sent, payload, again)
    return sent


@pytest.fixture
def cgroup_dir() -> Iterator[Path]:
    """A cgroup v2 directory of the test's own (root and a v2 mount: the tests that use
    it say so); at the end its members and sub-cgroups are removed with it."""
    from edgewatt.core.facts import cgroups

    where = cgroups.mounts().v2
    assert where is not None
    made = Path(where) / f"edgewatt-test-{os.getpid()}"
    made.mkdir()
    yield made
    for directory in [*sorted(made.rglob("*"), reverse=True), made]:
        if not directory.is_dir() or not (directory / "cgroup.procs").exists():
            continue
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for _ in range(1000):  # until the killed members are gone
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.005)


@pytest.fixture
def traffic() -> Iterator[Any]:
    """A CgroupTraffic of the test's own (root, cgroup v2 and nftables: the tests that
    use it say so); closed at the end, its table with it."""
    from edgewatt.core.facts import cgroups
    from edgewatt.core.facts.cgroup_traffic import CgroupTraffic
    from edgewatt.core.kernel.nftables import Nft

    where = cgroups.mounts().v2
    assert where is not None
    counted = CgroupTraffic(where)
    yield counted
    counted.close()
    answer = Nft().run("list tables") or {}
    names = [f"inet {t['table']['name']}" for t in answer["nftables"] if "table" in t]
    assert counted.table not in names
