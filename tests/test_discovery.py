"""Finding the daemon: the client and the CLI look where the service listens, and trust
only a server run by root or by the caller (SO_PEERCRED), before sending anything."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from edgewatt import client
from edgewatt.core import transport
from tests.conftest import ROOT, SYSTEM_PYTHON, free_port

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing users needs root")


def test_candidates_follow_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEWATT_SOCKET", raising=False)
    monkeypatch.setattr(transport, "current_uid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert transport.candidates() == [
        ("/run/user/1000/edgewatt.sock", "your own daemon"),
        ("/run/edgewatt/edgewatt.sock", "the system service"),
    ]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    own = transport.candidates()[0][0]
    # A directory of the user's own: in the shared temp directory itself another user
    # could take the name first.
    assert Path(own).parent.name == "edgewatt-1000" and Path(own).name == "edgewatt.sock"
    # A named socket is the only one: a named daemon is never swapped for another.
    monkeypatch.setenv("EDGEWATT_SOCKET", "/srv/ew.sock")
    assert transport.candidates() == [("/srv/ew.sock", "EDGEWATT_SOCKET")]
    assert transport.candidates("/x.sock") == [("/x.sock", "given")]
    monkeypatch.setattr(transport, "current_uid", lambda: 0)
    monkeypatch.delenv("EDGEWATT_SOCKET")
    assert transport.candidates() == [("/run/edgewatt/edgewatt.sock", "the system service")]


def test_each_place_looked_at_is_named_with_what_it_said(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening: what a killed daemon leaves
    assert transport.find_daemon(str(stale)) == transport.Found(
        None, f"{stale} (given): nobody listening (a stale socket)"
    )
    missing = tmp_path / "none.sock"
    assert transport.find_daemon(str(missing)).looked == f"{missing} (given): no such socket"


class Squatter:
    """A Unix server run as another user (nobody) that records what it is sent."""

    CODE = textwrap.dedent(
        """
        import socket, sys
        server = socket.socket(socket.AF_UNIX)
        server.bind(sys.argv[1]); server.listen(16)
        print("listening", flush=True)
        while True:
            conn, _ = server.accept()
            conn.settimeout(0.5)
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            print(len(data), flush=True)
            conn.close()
        """
    )

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", self.CODE, str(path)],
            stdout=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY,
        )  # fmt: skip
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "listening\n"
        self.received: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.received.append(int(line))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=5)


@needs_root
def test_a_socket_served_by_another_user_gets_nothing(
    public_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = public_dir / "tmp"  # a shared temp directory, where anyone may listen first
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    path = shared / "edgewatt.sock"
    squatter = Squatter(path)
    try:
        found = transport.find_daemon(str(path))
        assert found == transport.Found(
            None,
            f"{path} (given): served by uid {NOBODY}, neither root nor you, from a directory "
            "that root did not give it: not trusted",
        )
        with caplog.at_level("WARNING", logger="edgewatt"):
            reg = client.register(labels={"secret": "s3"}, socket=str(path))
        try:
            assert reg.mode == "local"
        finally:
            reg.close()
        assert "not trusted; monitoring pid" in caplog.text
        status = subprocess.run(
            [sys.executable, "-m", "edgewatt.cli", "status", "--socket", str(path)],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        )  # fmt: skip
        assert status.returncode == 1
        assert f"served by uid {NOBODY}, neither root nor you, from a dir" in status.stderr
    finally:
        squatter.close()
    # It saw connections, and not one byte of a request or a label.
    assert squatter.received and set(squatter.received) == {0}


@needs_root
def test_a_service_user_in_a_directory_root_made_for_it_is_trusted() -> None:
    # systemd's DynamicUser: the daemon runs as an unnamed uid in RuntimeDirectory=,
    # which root made for it under /run. Here nobody, in a folder made the same way.
    top = Path(tempfile.mkdtemp(prefix="edgewatt-test-", dir="/run"))
    try:
        top.chmod(0o755)
        service_dir = top / "edgewatt"
        service_dir.mkdir(mode=0o755)
        os.chown(service_dir, NOBODY, NOBODY)
        server = Squatter(service_dir / "edgewatt.sock")
        try:
            found = transport.find_daemon(str(service_dir / "edgewatt.sock"))
            assert found.path == str(service_dir / "edgewatt.sock")
            service_dir.chmod(0o777)  # now anyone could have put it there
            assert transport.find_daemon(str(service_dir / "edgewatt.sock")).path is None
        finally:
            server.close()
    finally:
        shutil.rmtree(top)


# Run as nobody, with no XDG_RUNTIME_DIR and no EDGEWATT_SOCKET: what a training
# script run by a normal user sees when the system service is up.
USER_SCRIPT = """
import json, os, subprocess, sys, urllib.request
from edgewatt import client
reg = client.register(labels={"run": "discovery"})
status = subprocess.run([sys.executable, "-m", "edgewatt.cli", "status", "--json"],
                        capture_output=True, text=True)
doctor = subprocess.run([sys.executable, "-m", "edgewatt.cli", "doctor"],
                        capture_output=True, text=True)
metrics = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
run = subprocess.run([sys.executable, "-m", "edgewatt.cli", "run", "--", "true"],
                     capture_output=True, text=True)
print(json.dumps({"pid": os.getpid(), "uid": os.getuid(), "mode": reg.mode,
                  "socket": reg.socket, "status": status.stdout,
                  "status_rc": status.returncode, "doctor": doctor.stdout.splitlines()[0],
                  "metrics": metrics, "run": run.stderr}))
reg.close()
"""

# In a private mount namespace, a tmpfs on /run: the daemon listens at the real system
# path without touching the host's /run. As the systemd unit runs it: a dynamic user
# (uid 61234 here) with CAP_DAC_READ_SEARCH (which also lets it read a checkout in a
# private folder), in RuntimeDirectory=edgewatt, which root made and gave to it.
NAMESPACE = """
set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 0755 /run/edgewatt /run/edgewatt-state
chown 61234:61234 /run/edgewatt /run/edgewatt-state
setpriv --reuid 61234 --regid 61234 --clear-groups \
    --inh-caps +dac_read_search --ambient-caps +dac_read_search \
    "$PY" -m edgewatt.cli serve --listen "127.0.0.1:$PORT" --state-dir /run/edgewatt-state \
    --socket /run/edgewatt/edgewatt.sock --interval 0.2 >"$STATE/daemon.log" 2>&1 &
daemon=$!
for i in $(seq 100); do [ -S /run/edgewatt/edgewatt.sock ] && break; sleep 0.1; done
setpriv --reuid 65534 --regid 65534 --clear-groups \
    env -i PATH=/usr/bin:/bin HOME=/ PYTHONPATH="$PUBLIC" "$SYSPY" -c "$SCRIPT" "$PORT"
kill $daemon; wait $daemon || true
"""


@needs_root
@pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("setpriv"), reason="util-linux")
def test_a_normal_user_without_xdg_runtime_dir_finds_the_system_service(
    public_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "PY": sys.executable,
        "SYSPY": SYSTEM_PYTHON,
        "PORT": str(port),
        "STATE": str(tmp_path),
        "PUBLIC": str(public_dir),
        "SCRIPT": USER_SCRIPT,
    }
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + (tmp_path / "daemon.log").read_text()
    out = json.loads(result.stdout)
    assert (out["mode"], out["socket"]) == ("daemon", "/run/edgewatt/edgewatt.sock")
    assert out["status_rc"] == 0
    [target] = json.loads(out["status"])
    assert out["uid"] == NOBODY
    assert target["pid"] == out["pid"] and target["labels"] == {"run": "discovery"}
    assert out["doctor"].startswith(
        "ok    daemon answering at /run/edgewatt/edgewatt.sock (the system service): 1 targets"
    )
    assert f'edgewatt_target_id="{target["id"]}"' in out["metrics"]
    assert 'run="discovery"' in out["metrics"]
    assert "(exit status 0, monitored via daemon)" in out["run"], out[
        "run"
    ]  # edgewatt run finds it too
