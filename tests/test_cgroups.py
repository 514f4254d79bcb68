"""Cgroup facts (facts/cgroups.py, cgroup_names.py): the kernel's files parsed, names
checked and resolved, and a real cgroup v2 read against what the kernel counted."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from edgewatt.core.facts import cgroups
from edgewatt.core.facts.cgroup_names import CgroupName, UnknownName, parse
from edgewatt.core.facts.cgroups import (
    Cgroup,
    CgroupTree,
    InvalidCgroup,
    OwnCgroup,
    normalize,
    parse_blkio,
    parse_cpu_stat,
    parse_io_stat,
)
from edgewatt.core.facts.procfs import NoSuchProcess

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_mounts_of_a_hybrid_and_a_v2_host(tmp_path: Path) -> None:
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(HYBRID_MOUNTS)
    found = cgroups.mounts(str(hybrid))
    assert found.v2 == "/sys/fs/cgroup/unified"
    assert found.v1["memory"] == "/sys/fs/cgroup/memory"
    assert found.v1["blkio"] == "/sys/fs/cgroup/blkio"
    v2 = tmp_path / "v2"
    v2.write_text(V2_MOUNTS)
    assert cgroups.mounts(str(v2)) == cgroups.Mounts("/sys/fs/cgroup", {})


def test_cpu_stat_io_stat_and_blkio_parsed() -> None:
    text = "usage_usec 5230000\nuser_usec 4000000\nsystem_usec 1230000\nnr_periods 0\n"
    assert parse_cpu_stat(text) == (4.0, 1.23)
    with pytest.raises(ValueError, match="user_usec"):
        parse_cpu_stat("usage_usec 1\n")
    io = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n259:0 rbytes=1 wbytes=2\n"
    assert parse_io_stat(io) == (4097, 8194)
    blkio = "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 0\n8:16 Read 1\nTotal 4609\n"
    assert parse_blkio(blkio) == (4097, 512)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("system.slice", "starts with '/'"),
        ("/a/../b", "'..'"),
        ('/a"b', "quotes"),
        ("/a\nb", "control characters"),
        (7, "starts with '/'"),
    ],
)
def test_a_bad_cgroup_path_is_refused_by_name(path: object, problem: str) -> None:
    with pytest.raises(InvalidCgroup, match=problem):
        normalize(path)


def test_paths_are_normalised() -> None:
    assert normalize("//system.slice//x.service/") == "/system.slice/x.service"
    assert normalize("/") == "/"


def test_names_are_checked() -> None:
    assert parse("unit", "flower-supernode") == CgroupName("unit", "flower-supernode.service")
    assert parse("unit", "user@1000.service").name == "user@1000.service"
    with pytest.raises(InvalidCgroup, match="not a systemd unit name"):
        parse("unit", "--all")  # never passed to systemctl as an option
    with pytest.raises(InvalidCgroup, match="not a container name"):
        parse("container", "-f", "podman")
    with pytest.raises(InvalidCgroup, match="runtime must be one of podman, docker"):
        parse("container", "web", "lxc")
    assert parse("container", "fl-client", "docker").display == "docker:fl-client"


def test_a_container_resolves_through_its_runtime_to_its_process_cgroup() -> None:
    asked = []

    def runner(argv: list[str]) -> str:
        asked.append(argv)
        return str(os.getpid())  # a running container's main process: this one

    name = CgroupName("container", "fl-client", "podman")
    assert name.resolve(runner) == cgroups.cgroup_of(os.getpid())
    assert asked == [["podman", "inspect", "--format", "{{.State.Pid}}", "fl-client"]]
    with pytest.raises(UnknownName, match="podman container fl-client is not running"):
        name.resolve(lambda argv: "0")


def test_a_unit_resolves_through_systemctl() -> None:
    name = CgroupName("unit", "x.service")
    path = name.resolve(lambda argv: "/system.slice/x.service")
    assert path == "/system.slice/x.service"
    with pytest.raises(UnknownName, match=r"unit x\.service is not running"):
        name.resolve(lambda argv: "")


# -- a real cgroup v2 -------------------------------------------------------------

WHERE = cgroups.mounts()
needs_v2 = pytest.mark.skipif(
    WHERE.v2 is None or os.geteuid() != 0, reason="needs root and a cgroup v2 mount"
)


def _burn_in(cgroup: Path, seconds: float, processes: int) -> float:
    """Run a process inside ``cgroup`` that starts ``processes`` short-lived children,
    each burning ``seconds`` of CPU; returns the CPU seconds the kernel counted for the
    whole tree (this process's RUSAGE_CHILDREN, as each was reaped)."""
    code = (
        "import os, time\n"
        f"for _ in range({processes}):\n"
        "    if os.fork() == 0:\n"
        "        t = time.process_time()\n"
        f"        while time.process_time() - t < {seconds}: pass\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
    )
    procs = str(cgroup / "cgroup.procs")

    def join() -> None:  # in the child, before its exec: every instruction is counted
        with open(procs, "w") as f:
            f.write("0")

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], preexec_fn=join, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cpu_stat(cgroup: Path) -> float:
    user, system = parse_cpu_stat((cgroup / "cpu.stat").read_text())
    return user + system


@needs_v2
def test_cgroup_cpu_is_what_the_kernel_counted_for_members_that_came_and_went(
    cgroup_dir: Path,
) -> None:
    cgroup = Cgroup("/" + cgroup_dir.name, WHERE)
    tree = CgroupTree(cgroup, os.cpu_count() or 1)
    first = tree.sample(lambda pid: [])
    assert first.pids == () and first.cpu_user_s + first.cpu_system_s == 0.0
    # Three processes of 0.15 s each, all gone before the next reading.
    kernel = _burn_in(cgroup_dir, 0.15, 3)
    reading = tree.sample(lambda pid: [])
    cpu = reading.cpu_user_s + reading.cpu_system_s
    assert cpu == pytest.approx(_cpu_stat(cgroup_dir), abs=1e-6)
    assert cpu == pytest.approx(kernel, abs=0.02)
    assert cpu >= 0.45
    assert reading.pids == ()


@needs_v2
def test_a_cgroup_made_again_is_followed_and_its_counts_add_up(cgroup_dir: Path) -> None:
    path = "/" + cgroup_dir.name
    tree = CgroupTree(Cgroup(path, WHERE), os.cpu_count() or 1, resolve=lambda: Cgroup(path, WHERE))
    tree.sample(lambda pid: [])
    first = _burn_in(cgroup_dir, 0.1, 1)
    tree.sample(lambda pid: [])
    cgroup_dir.rmdir()  # the service stopped ...
    cgroup_dir.mkdir()  # ... and started again, under the same path: a new cgroup
    second = _burn_in(cgroup_dir, 0.1, 1)
    reading = tree.sample(lambda pid: [])
    assert reading.cpu_user_s + reading.cpu_system_s == pytest.approx(first + second, abs=0.02)


@needs_v2
def test_a_removed_cgroup_ends_its_target(cgroup_dir: Path) -> None:
    tree = CgroupTree(Cgroup("/" + cgroup_dir.name, WHERE), 1, resolve=lambda: None)
    tree.sample(lambda pid: [])
    cgroup_dir.rmdir()
    with pytest.raises(NoSuchProcess):
        tree.sample(lambda pid: [])


@needs_v2
def test_a_run_cgroup_is_made_used_and_removed_and_stale_ones_go() -> None:
    assert WHERE.v2 is not None
    parent = Path(WHERE.v2 + cgroups.RUN_PARENT)
    parent.mkdir(exist_ok=True)
    stale = parent / "run-999999999"  # a run killed before it removed its cgroup
    stale.mkdir(exist_ok=True)
    own = OwnCgroup(WHERE)
    assert not stale.exists()
    assert own.path == f"{cgroups.RUN_PARENT}/run-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    own.add(child.pid)
    assert cgroups.cgroup_of(child.pid) == own.path
    assert "processes still in it" in (own.remove() or "")
    child.communicate(b"")
    assert own.remove() is None
    assert not Path(own.directory).exists()


@needs_v2
def test_a_unit_is_found_by_its_cgroup_name_where_systemctl_fails(cgroup_dir: Path) -> None:
    (cgroup_dir / "x.service").mkdir()  # as systemd names a unit's cgroup, in its slice

    def no_bus(argv: list[str]) -> str:
        raise UnknownName("systemctl show: Failed to get properties: no bus")

    name = CgroupName("unit", "x.service")
    assert name.resolve(no_bus, v2=WHERE.v2) == f"/{cgroup_dir.name}/x.service"
    with pytest.raises(UnknownName, match="no bus; no cgroup is named so"):
        CgroupName("unit", "y.service").resolve(no_bus, v2=WHERE.v2)


@needs_v2
def test_a_restarting_cgroup_is_waited_for_within_the_grace(cgroup_dir: Path) -> None:
    path = "/" + cgroup_dir.name

    def locate() -> Cgroup | None:
        return Cgroup(path, WHERE) if cgroup_dir.exists() else None

    tree = CgroupTree(Cgroup(path, WHERE), 1, resolve=locate, restart_grace_s=60)
    first = _burn_in(cgroup_dir, 0.1, 1)
    before = tree.sample(lambda pid: [])
    cgroup_dir.rmdir()  # stopped: no cgroup for a moment
    waiting = tree.sample(lambda pid: [])
    assert waiting.cpu_user_s + waiting.cpu_system_s == before.cpu_user_s + before.cpu_system_s
    assert waiting.pids == ()
    cgroup_dir.mkdir()  # started again
    second = _burn_in(cgroup_dir, 0.1, 1)
    after = tree.sample(lambda pid: [])
    assert after.cpu_user_s + after.cpu_system_s == pytest.approx(first + second, abs=0.02)
    ended = CgroupTree(Cgroup(path, WHERE), 1, resolve=lambda: None, restart_grace_s=0)
    ended.sample(lambda pid: [])
    cgroup_dir.rmdir()
    with pytest.raises(NoSuchProcess):
        ended.sample(lambda pid: [])
