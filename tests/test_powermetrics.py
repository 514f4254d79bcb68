"""powermetrics (macOS): the parsers on real captures of four Macs, the framing of its
output, the long-running reader on a stand-in that replays them at its -i (garbage and
a crash included), who may run it (root, sudo -n, or one warning and no figures), and
the client's psutil backend and `edgewatt run` reporting its energy."""

from __future__ import annotations

import io
import json
import os
import plistlib
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgewatt.core.power import powermetrics as pm
from edgewatt.core.power.child import MAX_BAD_RUN
from edgewatt.core.power.source import NoData, PowerOptions
from tests.conftest import ROOT, SYSTEM_PYTHON, wait_for

CAPTURES = ROOT / "tests" / "fixtures" / "powermetrics"
STAND_IN = ROOT / "tests" / "bin" / "powermetrics"
NOBODY = 65534


def _text_samples(name: str) -> list[str]:
    text = (CAPTURES / name).read_text()
    starts = [m.start() for m in re.finditer(r"^\*\*\* Sampled system activity", text, re.M)]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]


def test_the_m4_plist_as_plistlib_reads_it() -> None:
    document = (CAPTURES / "m4-mac16-5.plist").read_bytes()
    sample = pm.parse_plist(document)
    full = plistlib.loads(document)  # the reference: a whole parse of the same document
    processor = full["processor"]
    assert sample.rails_w == {
        "CPU": processor["cpu_power"] / 1000,
        "GPU": processor["gpu_power"] / 1000,
        "ANE": processor["ane_power"] / 1000,
    }
    assert sample.rails_w["CPU"] == pytest.approx(2.97845)
    assert sample.total_w == processor["combined_power"] / 1000 == pytest.approx(3.24807)
    assert sample.elapsed_s == full["elapsed_ns"] / 1e9 == 1.023685416
    # The gpu dictionary's own idle ratio, not a cluster's.
    assert (
        sample.gpu_busy == pytest.approx(1 - full["gpu"]["idle_ratio"]) == pytest.approx(0.122657)
    )


def test_the_energy_keys_give_the_same_power_where_the_power_keys_are_missing() -> None:
    document = (CAPTURES / "m4-mac16-5.plist").read_bytes()
    without = re.sub(rb"<key>(cpu|gpu|ane)_power</key>\s*<real>[\d.]+</real>", b"", document)
    sample = pm.parse_plist(without)
    # cpu_energy 3049 mJ over 1.0237 s: 2978.5 mW, as cpu_power says (2978.45).
    assert sample.rails_w["CPU"] == pytest.approx(3.049 / 1.023685416)
    assert sample.rails_w["CPU"] == pytest.approx(2.97845, rel=1e-4)
    assert sample.rails_w["GPU"] == pytest.approx(0.276 / 1.023685416)  # the processor's 276
    assert sample.total_w == pytest.approx(3.24807)


def test_an_intel_plist_gives_the_package() -> None:
    # The keys of an Intel Mac's plist as other parsers read them (no capture here).
    head = b'<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0">\n<dict>\n'
    head += b"<key>elapsed_ns</key><integer>500000000</integer>\n<key>processor</key>\n<dict>\n"
    joules = pm.parse_plist(
        head + b"<key>package_joules</key><real>4.25</real>\n</dict>\n</dict>\n</plist>\n"
    )
    assert joules.total_w == joules.rails_w["package"] == pytest.approx(8.5)
    watts = pm.parse_plist(
        head + b"<key>package_watts</key><real>8.53</real>\n</dict>\n</dict>\n</plist>"
    )
    assert watts.total_w == pytest.approx(8.53)


def _intel_plist(elapsed_ns: int, watts: float) -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0">\n<dict>\n'
        + f"<key>elapsed_ns</key><integer>{elapsed_ns}</integer>\n".encode()
        + b"<key>processor</key>\n<dict>\n"
        + f"<key>package_watts</key><real>{watts}</real>\n".encode()
        + b"</dict>\n</dict>\n</plist>\n"
    )


@pytest.mark.parametrize("plist", [True, False], ids=["plist", "text"])
def test_a_malformed_elapsed_adds_no_more_than_the_real_time(plist: bool) -> None:
    # A sample that claims 9,900 s (the plist) or 999,999 s (the text header) but came
    # 0.1 s after the previous one: its energy is its power over the real time since,
    # with at most two intervals' slack; before, 8.5 W x 9,900 s = 84,150 J at once.
    arrivals = iter([100.0, 100.1, 100.2])
    if plist:
        frames = [_intel_plist(n, 8.5) for n in (100_000_000, 9_900_000_000_000, 100_000_000)]
        parse = pm.parse_plist
    else:
        block = _text_samples("intel-macbookpro15-1.txt")[0]
        head = re.compile(r"\([0-9.]+ms elapsed\)")
        frames = [
            head.sub(f"({ms}ms elapsed)", block, count=1).encode()
            for ms in ("100.0", "999999999", "100.0")
        ]
        parse = pm._parse_text_frame
    counter = pm._Counter(parse, 0.1, clock=lambda: next(arrivals))
    first, bad, after = (counter(frame) for frame in frames)
    watts = first.sample.total_w
    assert watts is not None and bad.sample.elapsed_s > 9_000  # type: ignore[operator]
    assert first.total_j == pytest.approx(watts * 0.1)
    assert bad.total_j - first.total_j == pytest.approx(watts * (0.1 + 0.2))  # type: ignore[operator]
    assert after.total_j - bad.total_j == pytest.approx(watts * 0.1)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        # Mac16,6: one 5 s sample; the GPU section repeats GPU Power after the total.
        ("m4pro-mac16-6.txt", [({"CPU": 0.954, "GPU": 0.028, "ANE": 0.0}, 0.983, 5.02196)]),
        # MacBookAir10,1 on macOS 12: DRAM and "Package Power", no combined line.
        (
            "m1-macbookair10-1.txt",
            [
                ({"ANE": 0.0, "DRAM": 0.22, "CPU": 0.947, "GPU": 0.153}, 1.473, 0.10451),
                ({"ANE": 0.0, "DRAM": 0.162, "CPU": 0.42, "GPU": 0.067}, 0.773, 0.10481),
            ],
        ),
        # MacBookPro15,1 (Intel): the package's power alone, in W.
        ("intel-macbookpro15-1.txt", [({"package": 8.53}, 8.53, 1.00238)]),
    ],
)
def test_text_captures(capture: str, expected: list[tuple[dict[str, float], float, float]]) -> None:
    samples = [pm.parse_text(block) for block in _text_samples(capture)]
    for sample, (rails, total, elapsed) in zip(samples, expected):
        assert sample.rails_w == pytest.approx(rails)
        assert sample.total_w == pytest.approx(total)
        assert sample.elapsed_s == pytest.approx(elapsed)
    if capture.startswith("m1"):
        assert len(samples) == 10
        assert [s.total_w for s in samples][-1] == pytest.approx(0.321)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (b"Machine model: Mac16,5\n", "not a plist document"),
        (b"<?xml version='1.0'?><plist><dict><key>x</key><integer>1</integer></dict></plist>",
         "without a processor"),
        (b"<plist><dict><key>processor</key><dict><key>cpu_power</key><real>1e12</real>"
         b"</dict></dict></plist>", "is not a power"),
        (b"<plist><dict><key>processor</key><dict></dict></dict></plist>", "without power figures"),
        (b"<plist><dict><key>processor</key><dict><key>cpu_power</key><real>" + b"9" * 400
         + b"</real></dict></dict></plist>", "without power figures"),
    ],
)  # fmt: skip
def test_a_plist_that_is_not_a_sample_is_refused(document: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        pm.parse_plist(document)


def test_text_without_its_total_is_refused() -> None:
    block = _text_samples("m1-macbookair10-1.txt")[0].replace("Package Power", "Packaged")
    with pytest.raises(ValueError, match="not a powermetrics power sample"):
        pm.parse_text(block)


def test_plist_documents_are_cut_at_their_end_whichever_side_the_nul_is() -> None:
    doc = b'<?xml version="1.0"?>\n<plist version="1.0">\n<dict/>\n</plist>\n'
    leading = doc + b"\0" + doc + b"\0" + doc
    trailing = doc + b"\0" + doc + b"\0"
    assert [d.strip(b"\0") for d in pm.plist_documents(io.BytesIO(leading))] == [doc] * 3
    assert [d.strip(b"\0") for d in pm.plist_documents(io.BytesIO(trailing))] == [doc] * 2
    huge = b"<plist>\n" + b"<x/>\n" * 300_000 + b"</plist>\n"
    frames = list(pm.plist_documents(io.BytesIO(huge + doc), limit=1 << 20))
    assert frames == [None, doc]  # skipped to its end, never held


def test_a_text_sample_is_handed_over_at_its_total_not_an_interval_later() -> None:
    read, write = os.pipe()
    block = _text_samples("intel-macbookpro15-1.txt")[0].encode()
    with os.fdopen(read, "rb") as stream, os.fdopen(write, "wb") as writer:
        writer.write(b"Machine model: MacBookPro15,1\n\n" + block)
        writer.flush()
        got: list[bytes | None] = []
        reading = threading.Thread(target=lambda: got.append(next(pm.text_samples(stream))))
        reading.start()
        reading.join(timeout=5)  # the pipe stays open: no next header comes
        assert got and got[0] is not None
        assert pm.parse_text(got[0].decode()).total_w == 8.53
        assert got[0].endswith(b"(CPUs+GT+SA): 8.53W\n")


@pytest.mark.parametrize("plist", [True, False], ids=["plist", "text"])
def test_the_reader_replays_at_its_interval_and_counts_each_samples_energy(
    plist: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "args"
    monkeypatch.setenv("FAKE_POWERMETRICS_LOG", str(log))
    reader = pm.PowermetricsReader(str(STAND_IN), 0.1, plist=plist)
    reader.start()
    try:
        wait_for(lambda: reader.latest is not None, timeout=10)
        time.sleep(1.0)
        taken = reader.take()
    finally:
        reader.close()
    samplers = "cpu_power,gpu_power,ane_power" if plist else "cpu_power"
    fmt = "plist" if plist else "text"
    assert log.read_text().split() == [
        "euid=0", "--samplers", samplers, "-i", "100", "-f", fmt, "-b", "1"
    ]  # fmt: skip
    assert 8 <= len(taken) <= 13, len(taken)
    assert reader.bad_frames == 0 and reader.restarts == 0
    # Each sample's power times the elapsed time it reports (the real interval),
    # added up: the counter.
    total = 3.24807 if plist else 8.53
    counted = [t.sample for t in taken]
    for before, after in zip(counted, counted[1:]):
        assert after.sample.total_w == pytest.approx(total)
        assert 0.07 < after.sample.elapsed_s < 0.2, after.sample.elapsed_s  # type: ignore[operator]
        assert after.total_j - before.total_j == pytest.approx(total * after.sample.elapsed_s)  # type: ignore[operator]
    rail = "CPU" if plist else "package"
    assert counted[-1].rails_j[rail] == pytest.approx(
        counted[-1].total_j * counted[-1].sample.rails_w[rail] / total  # type: ignore[operator]
    )


def test_the_rate_has_a_floor_of_ten_hertz() -> None:
    reader = pm.PowermetricsReader(str(STAND_IN), 1 / 50, plist=True)
    assert reader.interval_ms == 100 and reader.command[reader.command.index("-i") + 1] == "100"


def test_garbage_is_skipped_and_a_crash_is_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_POWERMETRICS_HOSTILE", "1")
    reader = pm.PowermetricsReader(str(STAND_IN), 0.1, plist=True, max_backoff_s=0.2)
    reader.start()
    try:
        wait_for(lambda: reader.bad_frames >= 4, timeout=20)
        good = [t.sample.sample.total_w for t in reader.take()]
    finally:
        reader.close()
    assert good and all(w == pytest.approx(3.24807) for w in good)
    assert reader.restarts == 0  # garbage is skipped, not a reason to restart

    monkeypatch.delenv("FAKE_POWERMETRICS_HOSTILE")
    monkeypatch.setenv("FAKE_POWERMETRICS_EXIT_AFTER", "3")
    reader = pm.PowermetricsReader(str(STAND_IN), 0.1, plist=False, max_backoff_s=0.2)
    reader.start()
    try:
        wait_for(lambda: reader.restarts >= 2, timeout=20)
        taken = reader.take()
    finally:
        reader.close()
    assert len(taken) >= 6  # three per run, on after each crash
    energies = [t.sample.total_j for t in taken]
    assert energies == sorted(energies)  # the counter never goes back across restarts

    # Nothing but garbage: a wedged powermetrics is restarted.
    monkeypatch.delenv("FAKE_POWERMETRICS_EXIT_AFTER")
    monkeypatch.setenv("FAKE_POWERMETRICS_HOSTILE", "only")
    reader = pm.PowermetricsReader(str(STAND_IN), 0.1, plist=True, max_backoff_s=0.2)
    reader.start()
    try:
        wait_for(lambda: reader.restarts >= 1, timeout=30)
    finally:
        reader.close()
    assert reader.latest is None and reader.bad_frames >= MAX_BAD_RUN


DISCOVER = """
import json, logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from edgewatt.core.power import powermetrics as pm
from edgewatt.core.power.source import NoData, PowerOptions
try:
    source = pm.discover(PowerOptions(sample_hz=10, powermetrics_path=sys.argv[1]))
except NoData as exc:
    print(json.dumps({"nodata": str(exc)}))
    sys.exit(0)
deadline = time.monotonic() + 10
while source.read() is None and time.monotonic() < deadline:
    time.sleep(0.05)
reading = source.read()
print(json.dumps({"total_w": reading and reading.total_w, "pid": source.child_pid()}), flush=True)
sys.stdin.readline()
source.close()
"""


def _as_nobody(stand_in: Path) -> subprocess.Popen[str]:
    public = stand_in.parents[2]  # the package is there too (public_dir)
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", DISCOVER, str(stand_in)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd="/", user=NOBODY, group=NOBODY,
        env={"PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONPATH": str(public)},
    )  # fmt: skip


@pytest.fixture
def stand_in_for_nobody(public_dir: Path) -> Path:
    """The stand-in and its captures where nobody may run them, beside the package."""
    for part in ("bin", "fixtures/powermetrics"):
        shutil.copytree(ROOT / "tests" / part, public_dir / "tests" / part)
    for p in (public_dir / "tests").rglob("*"):
        p.chmod(0o755 if p.is_dir() or p.parent.name == "bin" else 0o644)
    (public_dir / "tests").chmod(0o755)
    return public_dir / "tests" / "bin" / "powermetrics"


def test_without_root_or_sudo_it_says_how_to_allow_it_once_and_measures_nothing(
    stand_in_for_nobody: Path,
) -> None:
    proc = _as_nobody(stand_in_for_nobody)
    out, err = proc.communicate(timeout=30)
    assert json.loads(out) == {"nodata": "powermetrics needs root and sudo -n does not allow it"}
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line
    assert lines[0] == (
        "edgewatt: powermetrics needs root, so this run has no power figures: run as root, "
        f"or let nobody run it without a password: echo 'nobody ALL=(root) NOPASSWD: "
        f"{stand_in_for_nobody}' | sudo tee /etc/sudoers.d/edgewatt-powermetrics"
    )


def test_where_the_sudoers_allow_it_it_runs_as_root_through_sudo(
    stand_in_for_nobody: Path,
) -> None:
    if shutil.which("sudo") is None:
        if os.environ.get("CI"):
            pytest.fail("sudo is not installed; .ci/run must install it")
        pytest.skip("sudo not installed (apt-get install sudo)")
    rule = Path(f"/etc/sudoers.d/edgewatt-test-{os.getpid()}")
    rule.write_text(f"nobody ALL=(root) NOPASSWD: {stand_in_for_nobody}\n")
    rule.chmod(0o440)
    proc = _as_nobody(stand_in_for_nobody)
    try:
        assert proc.stdout is not None
        out = json.loads(proc.stdout.readline())
        assert out["total_w"] == pytest.approx(8.53)  # the Intel capture, in text
        # The reader's child is sudo; the stand-in under it runs as root.
        replaying = [
            int(pid) for pid in os.listdir("/proc") if pid.isdigit()
            and str(stand_in_for_nobody).encode() in _cmdline(int(pid))
            and b"--samplers" in _cmdline(int(pid))
            and b"sudo" not in _cmdline(int(pid)).split(b"\0")[0]
        ]  # fmt: skip
        assert replaying, "the stand-in is not running"
        assert all(_euid(pid) == 0 for pid in replaying)
        assert _euid(out["pid"]) == 0 and b"sudo" in _cmdline(out["pid"])
    finally:
        rule.unlink()
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _euid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+\d+\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


CLIENT = """
import json, time
from edgewatt import client
r = client.register(fallback="always")
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
time.sleep(1.0)
print(json.dumps(r.summary()))
r.close()
"""


def _client_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "EDGEWATT_SOCKET": str(tmp_path / "none.sock"),
        "EDGEWATT_CLIENT_BACKEND": "psutil",
        "EDGEWATT_POWERMETRICS": str(STAND_IN),
        **extra,
    }


def test_the_psutil_backend_reports_powermetrics_energy_in_register_summaries(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CLIENT], capture_output=True, text=True, cwd=ROOT,
        env=_client_env(tmp_path), timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # The Intel capture's 8.53 W held for the whole window: the device's energy is
    # 8.53 W times its duration (the samples' own intervals added up). Not exact: the
    # counter adds 8.53 W x the elapsed time each sample reports, but is dated when
    # the sample arrives, and the stand-in can be preempted between taking its time and
    # printing (ms on a busy machine): the window's edges are off by that much.
    assert summary["device_energy_j"] == pytest.approx(8.53 * summary["duration_s"], rel=0.02)
    assert summary["duration_s"] >= 1.4
    assert summary["shorter_than_sensor_period"] is False


def test_edgewatt_run_prints_the_runs_energy_from_powermetrics_and_ends_with_its_command(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run.jsonl"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "edgewatt.cli", "run", "--output", str(out), "--", sys.executable,
         "-c", "import time; time.sleep(1.5)"],
        capture_output=True, text=True, cwd=ROOT, env=_client_env(tmp_path), timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    # It does not wait for the monitoring's own powermetrics child (it never exits).
    assert took < 6, (took, result.stderr)
    summary = json.loads(out.read_text().splitlines()[-1])
    # 8.53 W over the time it was measured: the command's 1.5 s and what a busy machine
    # adds to its start and end (the run's duration, not the sleep's). As above, up to
    # how late each sample arrived after the time it reports.
    assert summary["duration_s"] >= 1.5
    assert summary["avg_power_w"] == pytest.approx(8.53, rel=0.05)
    assert 8.53 * 1.5 * 0.95 <= summary["energy_j"] <= 8.53 * summary["duration_s"] * 1.05
    shown = re.search(r"device energy\s+([\d.]+) J", result.stderr)
    assert shown is not None and float(shown.group(1)) == pytest.approx(
        summary["energy_j"], abs=0.05
    )
    assert "restarting" not in result.stderr  # its child was not signalled as an orphan


def test_discovery_finds_nothing_without_the_executable(tmp_path: Path) -> None:
    with pytest.raises(NoData, match="no powermetrics executable at"):
        pm.discover(PowerOptions(powermetrics_path=str(tmp_path / "powermetrics")))
