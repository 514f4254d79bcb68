"""Per-target TCP bytes: the targets' sockets found through /proc/PID/fd, their
counters read from the kernel with sock_diag (``sockets.py``).

Cost follows the targets' sockets, not the host's: each pass lists the fds of the
targets' processes (except those that have not run since the last pass: their fds
cannot have changed) and looks up each of their known TCP sockets by its 4-tuple and
cookie. A full dump of the host's TCP sockets happens only in a pass where a target
holds a socket inode never seen before, and even then only the wanted entries are
decoded. Inodes that turn out not to be TCP (Unix, UDP, netlink) are remembered, so
they cause no further dumps.

Counting: a socket, once seen held by a target, is followed until the kernel no
longer knows it (its last bytes after close() included); its last counts then stay in
the target's total, so totals never go backwards. With a :class:`DestroyListener`
(CAP_NET_ADMIN) those last counts are the kernel's final ones, sent when it destroyed
the socket, matched by cookie: a connection that closes right after its last transfer
is counted to its last byte (``exact``). Without it, what a connection carries after
the last pass that saw it is lost (its last interval). Either way a connection opened
and closed between two passes is never seen, so not counted (measured in
``tests/test_network.py``). UDP and Unix sockets are not counted by this method.

A target's traffic is what crosses its boundary: a connection whose two ends are both
held by its members (a SuperNode and its ClientApp over loopback) is the target
talking to itself and counts in neither direction (also when one end was made after
its holder's descriptors were listed: ``_find_other_ends``); loopback to any process
outside the target still counts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from edgewatt.core.kernel.sockets import (
    DestroyListener,
    SockDiag,
    TcpSocket,
    cookie,
    endpoints,
    on_this_host,
    socket_inodes,
)

_NONE: frozenset[int] = frozenset()  # a target holding no socket

log = logging.getLogger(__name__)


@dataclass
class _Account:
    live: dict[int, TcpSocket] = field(default_factory=dict)  # inode -> last seen
    closed_tx: int = 0
    closed_rx: int = 0
    # The target talking to itself: both ends held by its members. Counted in neither
    # direction from the pass that sees both ends (what one end carried before that
    # stays: totals never go backwards).
    internal: set[int] = field(default_factory=set)
    # New connections to this host whose other end waits in a listener's accept queue,
    # held by no process yet: counted from the next pass, with every byte since they
    # opened, unless that pass finds the other end held by a member.
    pending: dict[int, TcpSocket] = field(default_factory=dict)

    def totals(self) -> tuple[int, int]:
        if not self.live:
            return self.closed_tx, self.closed_rx
        tx = self.closed_tx + sum(s.bytes_acked for s in self.live.values())
        rx = self.closed_rx + sum(s.bytes_received for s in self.live.values())
        return tx, rx


class NetworkAccounting:
    def __init__(
        self,
        proc: str = "/proc",
        diag: SockDiag | None = None,
        destroyed: DestroyListener | None = None,
    ) -> None:
        self.proc = proc
        self.diag = diag or SockDiag()
        self.destroyed = destroyed
        self._finals: dict[bytes, TcpSocket] = {}  # cookie -> counts at destruction
        self.overflows = 0  # drains that lost notifications
        self._overflowed = False  # in the last pass: final counts may be missing
        self._accounts: dict[str, _Account] = {}
        self._not_tcp: set[int] = set()
        self._hidden: set[int] = set()  # pids whose fds we may not list (logged once)
        self.dumps = 0  # full dumps so far: the expensive path, for benchmarks
        # /proc/PID/fd kept open per pid: listing through it skips the path walk, and
        # fails (ENOENT) rather than show another process once the pid is reused.
        self._fd_dirs: dict[int, int] = {}
        self._by_pid: dict[int, set[int] | None] = {}  # socket inodes found last pass
        # Targets that held no socket and followed none when last counted (their pids
        # visible): one whose members have not run since cannot have taken one.
        self.unattached: set[str] = set()

    def sample(
        self, targets: Mapping[str, tuple[int, ...]], idle: AbstractSet[int] = frozenset()
    ) -> dict[str, tuple[int, int] | None]:
        """(transmit, receive) bytes per target id, None where its sockets are hidden.

        ``idle``: pids that have not run since the previous pass (``TreeReading``); their
        descriptors cannot have changed, so the sockets found then are taken as held.
        """
        held: dict[str, set[int]] = {}
        hidden: set[str] = set()
        found_by_pid: dict[int, set[int] | None] = {}
        for target, pids in targets.items():
            inodes: AbstractSet[int] = _NONE
            for pid in pids:
                found = self._by_pid.get(pid) if pid in idle else None
                if found is None:
                    found = self._socket_inodes(pid)
                found_by_pid[pid] = found
                if found is None:
                    hidden.add(target)
                    self._say_hidden(pid)
                elif found:  # read, never changed: a lone member's set is taken as is
                    inodes = found if not inodes else inodes | found
            held[target] = inodes
        self._by_pid = found_by_pid
        alive = found_by_pid.keys()
        self._hidden.intersection_update(alive)
        for pid in self._fd_dirs.keys() - alive:
            os.close(self._fd_dirs.pop(pid))
        tracked = self._followed()
        wanted = set().union(*held.values()) if held else set()
        self._not_tcp &= wanted  # forget inodes no longer held: they may be reused
        unknown = wanted - tracked.keys() - self._not_tcp
        if unknown:
            unknown -= set().union(*(a.internal for a in self._accounts.values()))
        unix = {inode for inode in unknown if self.diag.is_unix(inode)}
        self._not_tcp |= unix
        unknown -= unix
        if unknown:
            unknown = self._still_held(unknown, found_by_pid)
        fresh: dict[int, TcpSocket] = {}
        if unknown:
            self.dumps += 1
            fresh = {s.inode: s for s in self.diag.dump(unknown)}
            self._not_tcp |= unknown - set(fresh)
        current = dict(fresh)
        for known in tracked.values():
            now = self.diag.lookup(known)
            if now is not None:
                current[known.inode] = now
        self._take_finals({cookie(s) for s in tracked.values()})
        result: dict[str, tuple[int, int] | None] = {}
        in_kernel = current.keys()
        for target in targets:
            account = self._accounts.get(target)
            if account is None:
                account = self._accounts[target] = _Account()
            if not held[target] and not account.live and not account.pending:
                # No socket held, none followed (most targets): what it had, without
                # the bookkeeping below, which would find nothing to do.
                if account.internal:
                    account.internal.clear()
                if target in hidden:
                    self.unattached.discard(target)
                    result[target] = None
                else:
                    self.unattached.add(target)
                    result[target] = account.totals()
                continue
            self.unattached.discard(target)
            account.internal &= held[target]  # a closed one's inode may be reused
            waited, account.pending = account.pending, {}
            account.live.update(waited)  # its other end had a pass to be taken
            seen = held[target] & in_kernel - account.internal
            new = seen - account.live.keys()
            for inode in seen:
                account.live[inode] = current[inode]
            self._set_aside_internal(account, new | waited.keys())
            self._find_other_ends(account, new, targets[target])
            for inode in list(account.live):
                if inode in current:
                    account.live[inode] = current[inode]
                else:  # gone from the kernel: its final counts, else its last, stay
                    last = account.live.pop(inode)
                    last = self._finals.pop(cookie(last), last)
                    account.closed_tx += last.bytes_acked
                    account.closed_rx += last.bytes_received
            result[target] = (
                None
                if target in hidden and not account.live and not account.pending
                else account.totals()
            )
        if self.destroyed is not None:
            followed = self._followed()
            self.destroyed.listen({cookie(s) for s in followed.values()})
            # A socket first seen this pass that closed before the filter took it in
            # has no final counts coming: say so rather than count it short unseen.
            for inode, sock in fresh.items():
                if inode in followed and self.diag.lookup(sock) is None:
                    self._overflowed = True
        return result

    def _followed(self) -> dict[int, TcpSocket]:
        """Every socket some target follows: counted, or waiting to be (pending)."""
        return {
            i: s
            for a in self._accounts.values()
            if a.live or a.pending
            for i, s in (*a.live.items(), *a.pending.items())
        }

    @staticmethod
    def _set_aside_internal(account: _Account, uncounted: AbstractSet[int]) -> None:
        """Connections whose two ends the target holds leave its accounts: its traffic
        is what crosses its boundary (loopback to a process outside it counts). One end
        counted in an earlier pass keeps what it was counted with (``uncounted``: first
        counted in this pass, so with nothing yet)."""
        ends = {endpoints(s.sockid): inode for inode, s in account.live.items()}
        for (local, remote), inode in ends.items():
            peer = ends.get((remote, local))
            if peer is None or peer == inode:
                continue
            for one in (inode, peer):
                sock = account.live.pop(one, None)
                if sock is not None and one not in uncounted:  # what it was counted with stays
                    account.closed_tx += sock.bytes_acked
                    account.closed_rx += sock.bytes_received
                account.internal.add(one)

    def _find_other_ends(
        self, account: _Account, new: AbstractSet[int], pids: tuple[int, ...]
    ) -> None:
        """New connections to this host whose other end the target was not seen to hold.
        A pass lists its members' descriptors one after the other, so that end may have
        been made after its holder's listing (a ClientApp connecting to its SuperNode
        while the SuperNode's were listed: its model was once counted so). The kernel
        names the other end; the members are listed again to see whether it is theirs."""
        relisted: set[int] | None = None
        for inode in new & account.live.keys():
            sock = account.live[inode]
            if not on_this_host(sock.sockid):
                continue
            other = self.diag.other_end(sock)
            if other is None:
                continue  # closed already: what crossed, crossed
            if other.inode == 0:  # not accepted yet: by whom is not known
                account.pending[inode] = account.live.pop(inode)
                continue
            if relisted is None:
                relisted = set().union(*(self._socket_inodes(pid) or set() for pid in pids))
            if other.inode in relisted:
                del account.live[inode]  # first counted this pass: with nothing yet
                account.internal |= {inode, other.inode}

    @property
    def exact(self) -> bool:
        """Whether closed sockets count to their last byte: the destroy listener runs
        and lost nothing in the last pass."""
        return self.destroyed is not None and not self._overflowed

    def _take_finals(self, tracked: set[bytes]) -> None:
        """Final counts of tracked sockets destroyed since the last pass. Drained after
        the lookups, so a socket destroyed between its lookup and this drain keeps its
        final counts for the next pass, which finds it gone."""
        self._overflowed = False
        if self.destroyed is None:
            return
        destroyed, overflowed = self.destroyed.drain(tracked)
        if overflowed:
            self.overflows += 1
            self._overflowed = True
            log.warning("TCP destroy notifications were lost (socket buffer overflow)")
        for sock in destroyed:
            self._finals[cookie(sock)] = sock
        for gone in self._finals.keys() - tracked:
            del self._finals[gone]

    def _still_held(self, inodes: set[int], found_by_pid: dict[int, set[int] | None]) -> set[int]:
        """The inodes their processes still hold. A socket closed since its fd was
        listed (a Unix one often: a client's request to the daemon) is neither told
        apart by unix_diag nor found by a dump, which matches inodes of live sockets
        only; listing the holder's fds again is far cheaper than that dump."""
        held: set[int] = set()
        for pid, found in found_by_pid.items():
            if found and found & inodes:
                held |= (self._socket_inodes(pid) or set()) & inodes
        return held

    def _socket_inodes(self, pid: int) -> set[int] | None:
        """None when the process's fds are not ours to see."""
        for _ in range(2):  # a second time with a fresh directory if the pid was reused
            fd_dir = self._fd_dirs.get(pid)
            if fd_dir is None:
                try:
                    fd_dir = os.open(f"{self.proc}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY)
                except PermissionError:
                    return None
                except OSError:
                    return set()  # exited: the tree notices on its next pass
                self._fd_dirs[pid] = fd_dir
            try:
                return socket_inodes(fd_dir)
            except PermissionError:
                return None
            except OSError:
                os.close(self._fd_dirs.pop(pid))
        return set()

    def _say_hidden(self, pid: int) -> None:
        if pid not in self._hidden:
            self._hidden.add(pid)
            log.warning(
                "cannot list the sockets of pid %d (another user's process): its network "
                "bytes are not counted; run the daemon as root to count every user's",
                pid,
            )

    def forget(self, target: str) -> None:
        self._accounts.pop(target, None)
        self.unattached.discard(target)

    def close(self) -> None:
        for fd_dir in self._fd_dirs.values():
            os.close(fd_dir)
        self._fd_dirs.clear()
        self.diag.close()
        if self.destroyed is not None:
            self.destroyed.close()
