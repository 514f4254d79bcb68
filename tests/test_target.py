"""A target: who it is, what the last pass saw of it, its name as a person reads it,
another registration joining it, its end and how the API describes it."""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.facts.cgroup_names import CgroupName
from edgewatt.core.facts.commands import command_line
from edgewatt.core.labels import MAX_LABELS, Room
from edgewatt.core.targets.errors import Conflict
from edgewatt.core.targets.history import History
from edgewatt.core.targets.row import row_of, sample_dict
from edgewatt.core.targets.target import UNREGISTERED, Identity, Observed, Target
from tests.snapshots import process


def _identity(**fields: Any) -> Identity:
    given: dict[str, Any] = dict(
        id="t1", pid=4242, start_ticks=7, start_time=1_699_999_990.98765, labels={"run": "a"},
        children=True, uid=1000, registered_at=1_700_000_000.12345, executable="edgewatt",
    )  # fmt: skip
    return Identity(**{**given, **fields})


def _proc(root: Path, pid: int, argv: list[str], exe: str) -> None:
    """A /proc entry for ``pid``: its command line and its executable's link."""
    entry = root / str(pid)
    entry.mkdir(exist_ok=True)
    (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    if (entry / "exe").is_symlink():
        (entry / "exe").unlink()
    os.symlink(exe, entry / "exe")


def test_a_target_is_its_process_or_its_cgroup_and_says_its_state() -> None:
    target = Target(_identity(), History(10))
    assert target.identity.key == (4242, 7) and target.id == "t1"
    # Before its end and any pass: nothing of either (a summary shows these as null).
    assert (target.exit_mode, target.end_reason, target.exit_status, target.restored_at) == (
        None, None, None, None
    )  # fmt: skip
    assert (target.handle, target.holders, target.command) == (None, 1, None)
    assert (target.pid, target.uid, target.labels, target.children) == (
        4242,
        1000,
        {"run": "a"},
        True,
    )
    assert (target.kind, target.state, target.cgroup_name, target.gids) == (
        "process", "running", None, frozenset()
    )  # fmt: skip
    target.end(1_700_000_005.0, "exact", exit_status=-9)
    assert (target.state, target.exit_mode, target.exit_status, target.end_reason) == (
        "exited", "exact", -9, None
    )  # fmt: skip
    let_go = Target(_identity(), History(10), handle=object())  # type: ignore[arg-type]
    let_go.end(1_700_000_006.0, "last-sample", end_reason=UNREGISTERED)
    assert (let_go.state, let_go.exited_at, let_go.handle) == (
        "unregistered",
        1_700_000_006.0,
        None,
    )
    assert let_go.end_reason == "unregistered"  # the word a cgroup's summary gives
    cgroup = Target(_identity(pid=0, cgroup_name=CgroupName("unit", "web.service")), History(1))
    assert cgroup.kind == "cgroup" and cgroup.cgroup_name == CgroupName("unit", "web.service")


def test_a_pass_keeps_what_it_saw_and_adds_its_row() -> None:
    registered = Target(_identity(pid=0), History(10), Observed(cgroup="/web"))
    # Before its first pass: the cgroup it was registered in, no member, nothing said
    # of its network figures.
    assert (registered.cgroup, registered.members) == ("/web", ())
    observed = registered.observed
    assert (observed.network_counts, observed.network_unknown, observed.cgroup_packets) == (
        None, None, None
    )  # fmt: skip
    target = Target(_identity(pid=0, cgroup_name=CgroupName("container", "web")), History(10))
    seen = dataclasses.replace(
        process(0), members=(5, 6), cgroup="/web", cgroup_memory=(4096, 8192),
        cgroup_packets=(3, 4), network_counts="interface-frames", network_unknown=None,
    )  # fmt: skip
    # A pass on demand for another target: its sensor period and power, no row.
    target.observe(seen, None, 0.2, (1.0, 2.0))
    assert target.history.count == 0 and target.history.pending_period_s == 0.2
    assert (target.history.pending_power.low, target.history.pending_power.high) == (1.0, 2.0)
    assert (target.members, target.cgroup, target.observed.cgroup_memory) == (
        (5, 6),
        "/web",
        (4096, 8192),
    )
    assert (target.observed.cgroup_packets, target.observed.network_counts) == (
        (3, 4),
        "interface-frames",
    )
    # A pass without the cgroup's figures keeps them; what is counted stays till a pass says.
    bare = dataclasses.replace(process(0), members=(7,), network_unknown="no nftables")
    target.observe(bare, row_of(bare, 12.0), 0.5)
    assert target.history.count == 1 and target.history.pending_period_s is None
    assert (target.members, target.cgroup, target.observed.network_unknown) == ((7,), "/web", None)
    gone = dataclasses.replace(seen, network_counts=None, network_unknown="its namespace")
    target.observe(gone, row_of(gone, 13.0), None)
    assert (target.observed.network_counts, target.observed.network_unknown) == (
        "interface-frames", "its namespace"
    )  # fmt: skip
    assert target.command is None  # a container keeps the name it was registered by


def test_a_targets_command_is_read_again_once_its_held_fork_execd(tmp_path: Path) -> None:
    # Before the exec the executable stays the one registered (not the fork's new read).
    _proc(
        tmp_path, 4242, ["/usr/bin/edgewatt", "run", "python3", "train.py"], "/opt/ew/edgewatt-cli"
    )
    target = Target(_identity(), History(10), handle=types.SimpleNamespace(proc=str(tmp_path)))  # type: ignore[arg-type]
    forked = dataclasses.replace(process(0), members=(4242,), root_execs=0)
    target.observe(forked, None, None)
    assert (target.command, target.named_execs, target.executable) == (
        "edgewatt run python3 train.py", 0, "edgewatt"
    )  # fmt: skip
    # The exec: the command's own line and executable from then on.
    _proc(tmp_path, 4242, ["/usr/bin/python3", "train.py"], "/usr/bin/python3.12")
    target.observe(forked, None, None)  # not seen by this pass: nothing read again
    assert target.command == "edgewatt run python3 train.py"
    execd = dataclasses.replace(forked, root_execs=1)
    target.observe(execd, None, None)
    assert (target.command, target.named_execs, target.executable) == (
        "python3 train.py", 1, "python3.12"
    )  # fmt: skip
    _proc(tmp_path, 4242, ["/usr/bin/python3", "eval.py"], "/usr/bin/python3.13")
    target.observe(execd, None, None)
    assert (target.command, target.executable) == ("python3 train.py", "python3.12")
    # Gone before it was read: the registration's name stays.
    late = Target(
        _identity(pid=4343), History(10), handle=types.SimpleNamespace(proc=str(tmp_path))
    )  # type: ignore[arg-type]
    late.observe(execd, None, None)
    assert (late.command, late.executable, late.named_execs) == (None, "edgewatt", 1)


def test_a_cgroups_command_is_its_first_members(tmp_path: Path) -> None:
    _proc(tmp_path, 4242, ["/usr/bin/python3", "serve.py"], "/usr/bin/python3")
    _proc(tmp_path, 4243, ["/bin/sh", "-c", "sleep 9"], "/bin/sh")
    _proc(tmp_path, 1, ["/sbin/init"], "/sbin/init")  # no member's: never read
    handle = types.SimpleNamespace(proc=str(tmp_path))
    target = Target(
        _identity(pid=0, cgroup_name=CgroupName("cgroup", "/jobs/a")), History(10), handle=handle
    )  # type: ignore[arg-type]
    target.observe(dataclasses.replace(process(0), members=()), None, None)
    assert target.command is None  # no member yet
    target.observe(dataclasses.replace(process(0), members=(4243, 4242)), None, None)
    assert (target.command, target.executable) == ("python3 serve.py", "edgewatt")
    # A container (or a unit) keeps the name it was registered by: what runs there.
    name = CgroupName("container", "web", "docker")
    container = Target(_identity(pid=0, cgroup_name=name), History(10), handle=handle)  # type: ignore[arg-type]
    container.observe(dataclasses.replace(process(0), members=(4242,)), None, None)
    assert container.command is None
    # No handle (restored without one): the system's /proc.
    mine = Target(_identity(pid=os.getpid()), History(10))
    mine.observe(dataclasses.replace(process(0), members=(os.getpid(),)), None, None)
    assert mine.command is not None and mine.command == command_line(os.getpid())


def test_another_registration_adds_the_labels_it_may_and_says_why_not_the_others() -> None:
    target = Target(_identity(labels={"run": "a", "team": "x"}), History(10))
    registered = target.identity
    refused = target.join({"run": "a", "team": "y", "seed": "1"}, True)
    assert refused == [
        {"field": "labels.team", "asked": "y", "kept": "x", "why": "the target has team='x'"}
    ]
    assert target.labels == {"run": "a", "team": "x", "seed": "1"}
    assert registered.labels == {"run": "a", "team": "x"}  # a new mapping: the sampler sees it
    # Room for 8 bytes of labels: "b"="1234567" fits, "c"="1" is one byte over.
    room = Room(8, "at most 16384 bytes of labels per user")
    refused = target.join({"b": "1234567", "c": "1"}, False, room)
    assert refused == [
        {
            "field": "labels.c",
            "asked": "1",
            "kept": None,
            "why": "at most 16384 bytes of labels per user",
        },
        {
            "field": "children",
            "asked": False,
            "kept": True,
            "why": "the target counts its children",
        },
    ]
    assert target.labels == {"run": "a", "team": "x", "seed": "1", "b": "1234567"}
    assert target.join({"b": "1234567"}, True, Room(0, "full")) == []  # held already: fits
    # At the most labels a target may have.
    full = Target(
        _identity(children=False, labels={f"l{i}": "v" for i in range(MAX_LABELS - 1)}), History(1)
    )
    refused = full.join({"x": "1", "y": "2"}, True)
    assert refused == [
        {
            "field": "labels.y",
            "asked": "2",
            "kept": None,
            "why": "the target has 64 labels, the most it may",
        },
        {
            "field": "children",
            "asked": True,
            "kept": False,
            "why": "the target counts the process alone",
        },
    ]
    assert len(full.labels) == MAX_LABELS and full.labels["x"] == "1"


def test_a_phase_starts_only_while_the_target_runs() -> None:
    target = Target(_identity(), History(10))
    phase = target.start_phase("train", 1_700_000_001.0, 12.5, depth=1)
    assert (phase.name, phase.started_at, phase.started_monotonic, phase.depth) == (
        "train", 1_700_000_001.0, 12.5, 1
    )  # fmt: skip
    assert target.history.phases == [phase]
    target.end(1_700_000_002.0, "exact", rss_peak_bytes=4096)
    assert phase.ended_at == 1_700_000_002.0 and target.history.memory.rss.high == 4096
    with pytest.raises(Conflict) as refused:
        target.start_phase("eval", 1_700_000_003.0, 14.0)
    assert (refused.value.error, refused.value.detail) == ("target has exited", "target t1 exited")


def test_a_target_is_described_by_who_it_is_its_state_and_its_latest_sample() -> None:
    target = Target(_identity(), History(10))
    described = {
        "id": "t1", "kind": "process", "pid": 4242, "start_time": 1_699_999_990.99,
        "executable": "edgewatt", "command": None, "labels": {"run": "a"}, "children": True,
        "state": "running", "registered_at": 1_700_000_000.123, "exited_at": None,
        "latest": None, "cgroup": None,
    }  # fmt: skip
    assert target.describe() == described
    row = row_of(process(0), 10.0)
    target.history.add(row)
    target.end(1_700_000_009.0, "exact")
    assert target.describe() == {
        **described, "state": "exited", "exited_at": 1_700_000_009.0, "latest": sample_dict(row)
    }  # fmt: skip
    name = CgroupName("container", "web", "podman")
    cgroup = Target(_identity(pid=0, cgroup_name=name), History(1))
    no_pass = {
        "kind": "container", "name": "web", "runtime": "podman", "path": None,
        "memory_current_bytes": None, "memory_peak_bytes": None,
        "network_transmit_packets": None, "network_receive_packets": None,
    }  # fmt: skip
    assert cgroup.describe()["cgroup"] == no_pass
    seen = dataclasses.replace(
        process(0), cgroup="/web", cgroup_memory=(4096, 8192), cgroup_packets=(3, 5)
    )
    cgroup.observe(seen, None, None)
    assert cgroup.describe()["cgroup"] == {
        **no_pass, "path": "/web", "memory_current_bytes": 4096, "memory_peak_bytes": 8192,
        "network_transmit_packets": 3, "network_receive_packets": 5,
    }  # fmt: skip
    unit = Target(_identity(pid=0, cgroup_name=CgroupName("unit", "web.service")), History(1))
    assert unit.cgroup_info() is not None and unit.cgroup_info()["runtime"] is None  # type: ignore[index]
