"""The process-events connector: messages in the kernel's layout, the real socket, and
membership applied from them in order."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess

import pytest

from edgewatt.core.facts.membership import LINEAGE, PARENT_LINKS, Membership
from edgewatt.core.facts.process import ProcessTree
from edgewatt.core.facts.procfs import ProcHandle
from edgewatt.core.kernel.netlink import NLMSGHDR
from edgewatt.core.kernel.proc_events import (
    CN_IDX_PROC,
    CN_VAL_PROC,
    NLMSG_DONE,
    PROC_EVENT_EXIT,
    PROC_EVENT_FORK,
    ProcEvent,
    ProcEvents,
    parse,
)
from edgewatt.core.kernel.taskstats import TaskExits, TaskstatsSocket
from tests.conftest import wait_for


def message(what: int, body: bytes, idx: int = CN_IDX_PROC) -> bytes:
    """One netlink message as the kernel sends it: nlmsghdr, cn_msg, proc_event."""
    event = struct.pack("=IIQ", what, 1, 123_456_789) + body
    cn = struct.pack("=IIIIHH", idx, CN_VAL_PROC, 7, 0, len(event), 0) + event
    return NLMSGHDR.pack(NLMSGHDR.size + len(cn), NLMSG_DONE, 0, 7, 0) + cn


def test_fork_exec_and_exit_events_in_order() -> None:
    data = b"".join(
        [
            message(PROC_EVENT_FORK, struct.pack("=iiii", 100, 100, 200, 200)),
            message(PROC_EVENT_FORK, struct.pack("=iiii", 200, 200, 201, 200)),  # a thread
            message(0x00000002, struct.pack("=ii", 200, 200)),  # an exec: not followed
            message(PROC_EVENT_EXIT, struct.pack("=iiIIii", 201, 200, 0, 17, 100, 100)),
            message(PROC_EVENT_EXIT, struct.pack("=iiIIii", 200, 200, 0, 17, 1, 1)),
            message(PROC_EVENT_EXIT, struct.pack("=iiII", 300, 300, 0, 17)),  # before 4.18
            message(PROC_EVENT_FORK, struct.pack("=iiii", 1, 1, 2, 2), idx=99),  # not ours
        ]
    )
    assert parse(data) == [
        ProcEvent("fork", 200, 100),
        ProcEvent("exit", 200, 1),  # the parent at the exit: who reaps it
        ProcEvent("exit", 300, 0),
    ]


def test_a_truncated_message_is_skipped() -> None:
    whole = message(PROC_EVENT_FORK, struct.pack("=iiii", 100, 100, 200, 200))
    assert parse(whole[:-4]) == []


def test_the_real_socket_hears_a_double_fork() -> None:
    try:
        events = ProcEvents()
    except PermissionError:
        pytest.skip("listening needs CAP_NET_ADMIN on this kernel")
    try:
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            worker = os.fork()
            if worker == 0:
                os._exit(0)
            os.write(write, str(worker).encode())
            os._exit(0)
        os.waitpid(middle, 0)
        worker = int(os.read(read, 32))
        expected = {
            ProcEvent("fork", middle, os.getpid()),
            ProcEvent("fork", worker, middle),
            ProcEvent("exit", middle, os.getpid()),
        }
        seen: list[ProcEvent] = []

        def arrived() -> bool:
            seen.extend(e for e in events.drain()[0] if middle in (e.pid, e.parent))
            return expected <= set(seen)

        with contextlib.suppress(AssertionError):  # what is missing, said below
            wait_for(arrived, timeout=5)
    finally:
        events.close()
    assert ProcEvent("fork", middle, os.getpid()) in seen
    assert ProcEvent("fork", worker, middle) in seen
    assert ProcEvent("exit", middle, os.getpid()) in seen


class Replay:
    """A stand-in for the events socket: the given batches, one per drain."""

    def __init__(self, *batches: list[ProcEvent]) -> None:
        self.batches = list(batches)
        self.overflows = 0

    def drain(self, decode: bool = True) -> tuple[list[ProcEvent], bool]:
        return (self.batches.pop(0) if self.batches else []), False

    def close(self) -> None:
        pass


def test_membership_follows_forks_in_order_wherever_reparented() -> None:
    events = Replay(
        [
            ProcEvent("fork", 11, 10),  # the root forks a middle process
            ProcEvent("fork", 12, 11),  # which forks the worker
            ProcEvent("exit", 11, 10),  # and exits at once: the worker is an orphan
            ProcEvent("fork", 99, 1),  # somebody else's
        ],
        [ProcEvent("fork", 13, 12), ProcEvent("exit", 12, 1)],  # reaped by init
    )
    membership = Membership(events)  # type: ignore[arg-type]
    assert membership.mode == LINEAGE
    lineage = membership.track("t", 10)
    membership.update()
    assert lineage.pids == {10, 12}
    assert lineage.take_exited() == {11: 10}
    assert lineage.parents[12] == 11
    membership.update()
    assert lineage.pids == {10, 13}
    assert lineage.take_exited() == {12: 1}
    membership.forget("t")
    assert Membership().mode == PARENT_LINKS


def test_a_member_whose_exit_event_never_comes_is_dropped_as_not_exact() -> None:
    # Forked (the event says), gone from /proc before its first read, and no exit event
    # at the next pass either: it waits one pass, then the figures stop being exact.
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
    pid = int(gone.stdout)
    membership = Membership(Replay([], [ProcEvent("fork", pid, os.getpid())]))  # type: ignore[arg-type]
    lineage = membership.track("t", os.getpid())
    tree = ProcessTree(ProcHandle(os.getpid()), children=True, logical_cpus=1, lineage=lineage)
    membership.update()
    tree.sample(lambda parent: [])
    membership.update()
    tree.sample(lambda parent: [])
    assert pid in lineage.pids and tree.exact  # its exit event may be on its way
    membership.update()
    reading = tree.sample(lambda parent: [])
    assert pid not in lineage.pids and not tree.exact
    assert reading.pids == (os.getpid(),)
    membership.forget("t")


@pytest.mark.skipif(os.geteuid() != 0, reason="taskstats needs CAP_NET_ADMIN")
def test_a_member_whose_exit_record_never_came_makes_the_figures_not_exact() -> None:
    # Forked and exited between two passes, the events say, but the exit records hold
    # nothing of it (here it exited before the listener started; in life, a record lost
    # to an overflow): its CPU is counted by owner, so it is lost, and the figures say so.
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
    pid = int(gone.stdout)
    exits = TaskExits(TaskstatsSocket(), keep_s=30)
    born_and_gone = [ProcEvent("fork", pid, os.getpid()), ProcEvent("exit", pid, os.getpid())]
    membership = Membership(Replay([], born_and_gone))  # type: ignore[arg-type]
    lineage = membership.track("t", os.getpid())
    tree = ProcessTree(
        ProcHandle(os.getpid()), children=True, logical_cpus=1, lineage=lineage, exits=exits
    )
    try:
        membership.update()
        tree.sample(lambda parent: [])
        assert tree.own_cpu and tree.exact
        membership.update()
        tree.sample(lambda parent: [])
        assert not tree.exact
    finally:
        membership.forget("t")
        exits.close()
