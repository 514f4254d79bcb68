"""Every byte a cgroup's sockets send and receive, short connections and UDP included,
from nftables counters in a table of the daemon's own (``inet edgewatt_PID``) in each
network namespace the cgroup's members use (docs/reference.md, "Cgroup targets"; the
rules themselves: cgroup_rules.py).

Sent: what its sockets hand to an interface other than loopback, plus what they send
over loopback to sockets outside it. Received: what reaches its sockets from outside
it. Traffic between two members is not the target's. Loopback is counted on the way
in: segmentation offload splits a 64 KB batch after the output hook, so it leaves as
one packet and arrives as many, and only counts taken on one side subtract exactly.

The figures are IP bytes: payload plus IP and TCP/UDP headers, one set per packet as
the hook sees it (sent out of the host with offload: one per batch), with the packet
counts beside them. The tables and rules themselves, made and removed (a stopped
container's last counts still read, a killed daemon's table cleaned up), are
``traffic_tables.py``'s; this module keeps the accounting per target: which
namespaces its members use, what each counted, what is carried when one is left.

A namespace the daemon may not enter (setns needs CAP_SYS_ADMIN, which the systemd unit
does not grant: a container with a network of its own), or may not trust a table in
(one another user namespace owns: its maker is root there, and could add counters or
forge them), is counted from outside: the bytes and packets of its interfaces but
loopback (``/proc/PID/net/dev`` of a member, which needs no capability), from when the
target first saw it. Those are frames: IP bytes plus each packet's link header (14
bytes on Ethernet and veth), and every frame of the namespace, ARP and neighbour
discovery included: the namespace's traffic, which is the container's own where it
does not share it. The target's summary says so (``network_counts``).

What one target or user costs is bounded: MAX_NAMESPACES_PER_TARGET and
MAX_NAMESPACES_PER_USER (a person: her subordinate uids are hers); beyond them, and
wherever a member's namespace cannot be counted, the target's figures are absent
(problem() says why), never a part.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edgewatt.core.facts.cgroup_rules import Spec
from edgewatt.core.facts.traffic_counts import Counts, interface_counts
from edgewatt.core.facts.traffic_tables import TrafficTables
from edgewatt.core.kernel.nftables import Nft, NftError
from edgewatt.core.uids import alone

log = logging.getLogger(__name__)

# What a target's figures count, by how its namespaces are counted (the summary's
# network_counts): by its sockets' rules, by the interfaces of namespaces it may not
# enter, or both.
IP_BYTES, INTERFACE_BYTES = "ip-bytes", "interface-bytes"

# Bounds on what one target's or one user's members may make the daemon count: each
# namespace costs a context (one netlink socket, libnftables' caches) or a file read a
# pass. Beyond them the target's network figures are absent, saying why.
MAX_NAMESPACES_PER_TARGET = 16
MAX_NAMESPACES_PER_USER = 32


@dataclass
class _Watch:
    spec: Spec
    uid: int
    namespaces: set[int] = field(default_factory=set)
    last: dict[int, Counts] = field(default_factory=dict)  # per namespace inode
    # Counts of its cgroup's rules in a namespace when it joined them (another target
    # on the same cgroup had them first).
    base: dict[int, Counts] = field(default_factory=dict)
    carried: Counts = field(default_factory=Counts)  # from namespaces no member uses any more
    ns_of: dict[int, int] = field(default_factory=dict)  # member pid -> namespace inode
    # Namespaces counted by their interfaces (the daemon may not enter them, or their
    # owner may write the daemon's table there): inode -> the counts when first seen.
    interfaces: dict[int, Counts] = field(default_factory=dict)
    counted_by_interfaces: bool = False  # ever, in this target's life
    # Namespaces a member uses where its traffic cannot be counted, and why: while a
    # member is in one, the target's figures are absent (a part is not the whole).
    failed: dict[int, str] = field(default_factory=dict)


class CgroupTraffic:
    """``v2_mount``: where cgroup v2 is mounted; nftables names cgroups by their path
    under /sys/fs/cgroup."""

    def __init__(
        self,
        v2_mount: str,
        proc: str = "/proc",
        open_nft: Callable[[str | None], Nft] = Nft,
        person: Callable[[int], int] = alone,
    ) -> None:
        """``person``: the person a target's uid is, whose namespaces are bounded
        together (core/persons.py)."""
        relative = os.path.relpath(v2_mount, "/sys/fs/cgroup")
        if relative.startswith(".."):
            raise NftError(
                f"cgroup v2 is mounted at {v2_mount}; nftables looks under /sys/fs/cgroup"
            )
        self._prefix = "" if relative == "." else relative
        self._proc = proc
        self._person = person
        self._tables = TrafficTables(proc, open_nft)
        self._watches: dict[str, _Watch] = {}
        self._names = (f"w{n}" for n in itertools.count(1))
        self.table = self._tables.table

    def clean_stale(self) -> int:
        """Remove tables left by an earlier daemon (killed before it could); returns
        how many (see TrafficTables.clean_stale)."""
        return self._tables.clean_stale()

    def close(self) -> None:
        self._tables.close()
        self._watches.clear()

    def watch(
        self, target_id: str, path: str, level: int, pids: Iterable[int], uid: int = 0
    ) -> None:
        """Count the traffic of cgroup ``path`` (v2, absolute) in every namespace its
        members ``pids`` use; a new path (a restarted container) starts new rules.
        ``uid``: the target's registrant, whose person's namespaces are bounded
        together."""
        nft_path = f"{self._prefix}/{path.strip('/')}".strip("/")
        current = self._watches.get(target_id)
        if current is not None and current.spec.path != nft_path:
            self._settle(target_id, current, set())  # its earlier cgroup's counts stay
            spec = self._spec(nft_path, level)
            self._watches[target_id] = _Watch(spec, uid, carried=current.carried)
        elif current is None:
            self._watches[target_id] = _Watch(self._spec(nft_path, level), uid)
        watch = self._watches[target_id]
        used: set[int] = set()
        ns_of = {}
        for pid in pids:
            inode = watch.ns_of.get(pid)
            if inode is None:
                try:
                    inode = os.stat(f"{self._proc}/{pid}/ns/net").st_ino
                except OSError:
                    continue  # exited since the cgroup was read
                if inode not in watch.namespaces and inode not in watch.failed:
                    self._install(target_id, watch, inode, f"{self._proc}/{pid}/ns/net")
            ns_of[pid] = inode
            used.add(inode)
        watch.ns_of = ns_of
        for inode in set(watch.failed) - used:
            del watch.failed[inode]  # no member there any more: tried again if one returns
        self._settle(target_id, watch, used)

    def _spec(self, nft_path: str, level: int) -> Spec:
        """The rules of cgroup ``nft_path``: those of another target on the same cgroup
        where there is one (a cgroup is counted once, however many targets read it)."""
        for other in self._watches.values():
            if other.spec.path == nft_path:
                return other.spec
        return Spec(next(self._names), nft_path, level)

    def sample(self) -> dict[str, Counts]:
        """Each watched target's traffic, cumulative."""
        counts = self._tables.read_all()
        result = {}
        for target_id, watch in self._watches.items():
            broken = [why for why in map(self._tables.problem, watch.namespaces) if why]
            if watch.failed or broken:
                continue  # absent, never a part: problem() says why
            for inode in watch.namespaces:
                if inode in watch.interfaces:
                    found = self._interfaces_now(watch, inode)
                else:
                    found = counts.get(inode, {}).get(watch.spec.name)
                    if found is not None:
                        found = found.since(watch.base.get(inode, Counts()))
                if found is not None:
                    watch.last[inode] = found
            total = watch.carried
            for part in watch.last.values():
                total += part
            result[target_id] = total
        return result

    def problem(self, target_id: str) -> str | None:
        """Why the target's traffic is not counted now (None: it is)."""
        watch = self._watches.get(target_id)
        if watch is None:
            return None
        why = set(watch.failed.values())
        for inode in watch.namespaces:
            problem = self._tables.problem(inode)
            if problem:
                why.add(problem)
        return "; ".join(sorted(why)) or None

    def kind(self, target_id: str) -> str:
        """What the target's figures count: IP_BYTES, INTERFACE_BYTES, or both."""
        watch = self._watches.get(target_id)
        if watch is None or not watch.counted_by_interfaces:
            return IP_BYTES
        by_rules = any(inode not in watch.interfaces for inode in watch.namespaces)
        return f"{IP_BYTES}+{INTERFACE_BYTES}" if by_rules else INTERFACE_BYTES

    def _interfaces_now(self, watch: _Watch, inode: int) -> Counts | None:
        """The namespace's interface counts since the target first saw it, read through
        a member in it (None: none could be read this pass)."""
        for pid, member_inode in watch.ns_of.items():
            if member_inode != inode:
                continue
            try:
                return interface_counts(f"{self._proc}/{pid}/net/dev").since(
                    watch.interfaces[inode]
                )
            except OSError:
                continue  # exited meanwhile: another member, or the next pass
        return None

    def forget(self, target_id: str) -> None:
        watch = self._watches.pop(target_id, None)
        if watch is None:
            return
        for inode in list(watch.namespaces):
            self._uninstall(target_id, watch, inode)

    def _over_bounds(self, watch: _Watch) -> str | None:
        if len(watch.namespaces) >= MAX_NAMESPACES_PER_TARGET:
            return f"members in more than {MAX_NAMESPACES_PER_TARGET} network namespaces"
        person = self._person(watch.uid)
        users = set()
        for other in self._watches.values():
            if self._person(other.uid) == person:
                users |= other.namespaces
        if len(users) >= MAX_NAMESPACES_PER_USER:
            return (
                f"the targets of uid {watch.uid}'s user (her subordinate uids included) have "
                f"members in more than {MAX_NAMESPACES_PER_USER} network namespaces"
            )
        return None

    def _install(self, target_id: str, watch: _Watch, inode: int, link: str) -> None:
        spec = watch.spec
        over = self._over_bounds(watch)
        if over is not None:
            self._fail(target_id, watch, inode, over)
            return
        if not self._tables.trusted(inode, link):
            why = "belongs to another user namespace (whose root may write the daemon's table)"
            self._count_interfaces(target_id, watch, inode, link, why)
            return
        try:
            base = self._tables.install(inode, link, spec, target_id)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES) and inode != self._tables.own_netns:
                why = "cannot be entered (no CAP_SYS_ADMIN)"
                self._count_interfaces(target_id, watch, inode, link, why)
                return
            self._fail(target_id, watch, inode, str(exc))
            return
        if base is not None:  # another target on the same cgroup: its rules, from now on
            watch.base[inode] = base
        watch.namespaces.add(inode)

    def _fail(self, target_id: str, watch: _Watch, inode: int, why: str) -> None:
        if not watch.failed:  # once while it lasts, not once per member
            log.warning(
                "target %s: cannot count the traffic of cgroup %s in network namespace "
                "%d: %s; its network figures are absent meanwhile",
                target_id,
                watch.spec.path,
                inode,
                why,
            )
        watch.failed[inode] = f"network namespace {inode}: {why}"

    def _count_interfaces(
        self, target_id: str, watch: _Watch, inode: int, link: str, why: str
    ) -> None:
        """A namespace it may not enter, or may not trust its table in: counted by its
        interfaces from now on."""
        net_dev = link[: -len("ns/net")] + "net/dev"
        try:
            start = interface_counts(net_dev)
        except OSError as exc:
            self._fail(target_id, watch, inode, f"cannot read {net_dev}: {exc}")
            return
        log.info(
            "target %s: network namespace %d %s: its interfaces' frames are counted instead",
            target_id,
            inode,
            why,
        )
        watch.interfaces[inode] = start
        watch.namespaces.add(inode)
        watch.counted_by_interfaces = True

    def _settle(self, target_id: str, watch: _Watch, used: set[int]) -> None:
        """Namespaces no member uses any more: their counts are carried, their rules go."""
        for inode in watch.namespaces - used:
            if watch.interfaces.pop(inode, None) is not None:
                watch.namespaces.discard(inode)
                watch.carried += watch.last.pop(inode, Counts())
                continue
            try:
                final = self._tables.read(inode).get(watch.spec.name)
            except NftError:
                final = None
            if final is not None:
                watch.last[inode] = final.since(watch.base.get(inode, Counts()))
            watch.carried += watch.last.pop(inode, Counts())
            watch.base.pop(inode, None)
            self._uninstall(target_id, watch, inode)

    def _uninstall(self, target_id: str, watch: _Watch, inode: int) -> None:
        watch.namespaces.discard(inode)
        self._tables.uninstall(inode, watch.spec, target_id)
