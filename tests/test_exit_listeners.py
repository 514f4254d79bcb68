"""The kernel interfaces behind exact exits, one fact each: the taskstats layout, its
records, and the TCP destroy listener with its in-kernel cookie filter."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgewatt.core.channels import CHANNELS
from edgewatt.core.kernel import sockets, taskstats
from edgewatt.core.kernel.netlink import drain
from edgewatt.core.kernel.sockets import DestroyListener, SockDiag, cookie
from tests.conftest import wait_for

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="taskstats needs CAP_NET_ADMIN")

OFFSETS = """
#include <stdio.h>
#include <stddef.h>
#include <linux/taskstats.h>
#define O(f) printf("%s %zu\\n", #f, offsetof(struct taskstats, f))
int main(void) {
    O(version); O(cpu_run_virtual_total); O(ac_pid); O(ac_ppid); O(ac_etime);
    O(ac_utime); O(ac_stime); O(hiwater_rss); O(read_bytes); O(write_bytes);
    O(ac_btime64); O(ac_tgid); CHANNELS
    return 0;
}
"""


def test_the_record_offsets_are_the_kernel_headers(tmp_path: Path) -> None:
    header = Path("/usr/include/linux/taskstats.h")
    if not header.exists() or shutil.which("cc") is None:
        pytest.skip("needs a C compiler and the kernel's uapi headers (linux-libc-dev)")
    # Each channel's member too (core/channels.py declares its offset).
    channels = " ".join(f"O({c.taskstats_member});" for c in CHANNELS)
    (tmp_path / "o.c").write_text(OFFSETS.replace("CHANNELS", channels))
    subprocess.run(["cc", "-o", str(tmp_path / "o"), str(tmp_path / "o.c")], check=True)
    out = subprocess.run([str(tmp_path / "o")], capture_output=True, text=True, check=True)
    offsets = {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}
    assert offsets == {
        "version": 0,
        "cpu_run_virtual_total": 72,
        "ac_pid": 128,
        "ac_ppid": 132,
        "ac_etime": 144,
        "ac_utime": 152,
        "ac_stime": 160,
        "hiwater_rss": 200,
        "read_bytes": 248,
        "write_bytes": 256,
        "ac_btime64": 344,
        "ac_tgid": 368,
        **{c.taskstats_member: c.taskstats_offset for c in CHANNELS},
    }


BURN = "import time\nwhile time.process_time() < 0.3:\n    pass\n"


@root_only
def test_an_exit_record_has_the_processs_cpu_as_its_parent_counts_it() -> None:
    exits = taskstats.TaskExits(taskstats.TaskstatsSocket(), keep_s=30)
    time.sleep(0.01)
    started = time.time()
    child = subprocess.Popen([sys.executable, "-c", BURN])
    _, _, usage = os.wait4(child.pid, 0)
    exits.update()
    record = exits.exited(child.pid, started)
    assert record is not None and record.ppid == os.getpid()
    # The record is taken before the address space is torn down: wait4 sees a few ms
    # more. Both count the scheduler's runtime, not 10 ms ticks.
    waited = usage.ru_utime + usage.ru_stime
    assert record.user_s + record.system_s == pytest.approx(waited, abs=0.015)
    assert record.user_s + record.system_s >= 0.3
    assert exits.complete(started)
    assert not exits.complete(exits.started - 1.0)  # started before the listener
    exits.close()


@root_only
def test_the_fixed_offset_reading_of_a_record_is_the_full_parse() -> None:
    source = taskstats.TaskstatsSocket()
    time.sleep(0.01)
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    os.waitpid(pid, 0)
    mine: list[bytes] = []

    def heard() -> bool:
        datagrams, overflowed = drain(source._sock)
        assert not overflowed
        mine.extend(d for d in datagrams if any(r.tgid == pid for r in taskstats.parse(d)))
        return bool(mine)

    wait_for(heard)
    assert len(mine) == 1
    # Padding after the message sends the same datagram down the attribute walk.
    assert taskstats.parse(mine[0]) == taskstats.parse(mine[0] + bytes(4))
    (record,) = taskstats.parse(mine[0])
    assert (record.pid, record.tgid, record.ppid) == (pid, pid, os.getpid())
    source.close()


def _pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_the_destroy_listener_hears_only_the_sockets_it_follows() -> None:
    listener = DestroyListener()
    server = socket.create_server(("127.0.0.1", 0))
    followed, followed_peer = _pair(server)
    other, other_peer = _pair(server)
    followed.sendall(b"f" * 5000)
    followed_peer.recv(8192)
    diag = SockDiag()
    by_inode = {s.inode: s for s in diag.dump({os.fstat(followed.fileno()).st_ino,
                                                os.fstat(other.fileno()).st_ino})}  # fmt: skip
    mine = by_inode[os.fstat(followed.fileno()).st_ino]
    theirs = by_inode[os.fstat(other.fileno()).st_ino]
    listener.listen({cookie(mine)})
    for s in (followed, other, followed_peer, other_peer):
        s.close()
    found: list[Any] = []

    def heard() -> bool:
        more, overflowed = listener.drain({cookie(mine), cookie(theirs)})
        assert not overflowed
        found.extend(more)
        # Both destroyed: the other's notification, had the filter let it through, is
        # queued by now too.
        return bool(found) and not diag.dump({mine.inode, theirs.inode})

    wait_for(heard)
    # Asked for both cookies, the kernel's filter let only the followed one through.
    assert [cookie(s) for s in found] == [cookie(mine)]
    assert found[0].bytes_acked == 5000 + 2  # the payload, the SYN and the FIN
    listener.listen(set())
    assert not listener.listening
    diag.close()
    listener.close()
    server.close()


def test_a_filter_too_long_for_the_kernel_accepts_everything() -> None:
    program = sockets._cookie_filter(None)
    assert len(program) == 1
    cookies = frozenset(i.to_bytes(8, "little") for i in range(sockets.MAX_FILTERED))
    assert len(sockets._cookie_filter(cookies)) == 5 * sockets.MAX_FILTERED + 1 <= 4096
