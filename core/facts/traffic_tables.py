"""The daemon's nftables table (``inet edgewatt_PID``) in each network namespace it
counts cgroup traffic in, and the cgroup rules in it (the commands: cgroup_rules.py;
what they count, per target: cgroup_traffic.py).

A namespace's table is made when a target first needs it and dropped with the last
rules in it; one cgroup's rules are shared by every target on that cgroup and go with
the last of them. A context (one netlink socket, libnftables' caches) holds its
namespace open, so a stopped container's last counts are still read; it is let go
with the table. A table left by a daemon killed with -9 (its pid is gone) is removed
at the next start (:meth:`TrafficTables.clean_stale`), and a live daemon's is left
alone. A namespace another user namespace owns is never trusted with a table: its
maker is root there, and could add counters or forge them.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from edgewatt.core.facts import cgroup_rules
from edgewatt.core.facts.cgroup_rules import Spec
from edgewatt.core.facts.traffic_counts import Counts
from edgewatt.core.kernel.nftables import Nft, NftError

log = logging.getLogger(__name__)

FAMILY = "inet"
PREFIX = "edgewatt_"
NS_GET_USERNS = 0xB701  # ioctl on a namespace file: its owning user namespace


@dataclass
class _Namespace:
    inode: int
    nft: Nft
    specs: dict[str, Spec] = field(default_factory=dict)  # rules here, by name
    holders: dict[str, set[str]] = field(default_factory=dict)  # rules' name -> target ids
    levels: set[int] = field(default_factory=set)  # cgroup depths with maps here
    problem: str | None = None  # its counters could not be read at the last pass


class TrafficTables:
    """The tables and rules of one daemon, by network namespace inode. Raises NftError
    saying why where this process may not use nftables."""

    def __init__(self, proc: str = "/proc", open_nft: Callable[[str | None], Nft] = Nft) -> None:
        self._proc = proc
        self._open = open_nft
        self.own_netns = os.stat(f"{proc}/self/ns/net").st_ino
        self._own_users = os.stat(f"{proc}/self/ns/user").st_ino
        _probe(open_nft)
        self._namespaces: dict[int, _Namespace] = {}
        self.table = f"{FAMILY} {PREFIX}{os.getpid()}"

    def clean_stale(self) -> int:
        """Remove tables left by an earlier daemon (killed before it could), in every
        namespace a process is in that the daemon's user namespace owns; returns how
        many."""
        removed = 0
        seen = set()
        for link in [f"{self._proc}/self/ns/net", *glob.glob(f"{self._proc}/[0-9]*/ns/net")]:
            try:
                inode = os.stat(link).st_ino
            except OSError:
                continue
            if inode in seen:
                continue
            seen.add(inode)
            if not self.trusted(inode, link):
                continue  # never a table of ours there
            try:
                nft = self._open(None if inode == self.own_netns else link)
            except OSError:
                continue  # gone meanwhile, or a namespace we may not join
            try:
                for name in _stale_tables(nft, self._proc):
                    nft.run(f"delete table {FAMILY} {name}")
                    removed += 1
            except NftError as exc:
                log.warning("removing a stale nftables table failed: %s", exc)
            finally:
                nft.close()
        return removed

    def trusted(self, inode: int, link: str) -> bool:
        """Whether the daemon's own user namespace owns this network namespace (its
        own network namespace is): else whoever made it is root there, over the
        daemon's table too."""
        if inode == self.own_netns:
            return True
        try:
            fd = os.open(link, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            owner = fcntl.ioctl(fd, NS_GET_USERNS)
        except OSError:
            return False  # a kernel before 4.9 cannot say: not trusted
        finally:
            os.close(fd)
        try:
            return os.fstat(owner).st_ino == self._own_users
        finally:
            os.close(owner)

    def install(self, inode: int, link: str, spec: Spec, holder: str) -> Counts | None:
        """``spec``'s rules in namespace ``inode`` (entered through ``link``; its table
        made on first use), held by ``holder``. Where another holder has them already,
        their counts now (where this holder's start); else None. OSError (NftError
        included) where the namespace cannot be entered or the rules not made."""
        namespace = self._namespaces.get(inode)
        if namespace is None:
            nft = self._open(None if inode == self.own_netns else link)
            try:
                nft.run("\n".join(cgroup_rules.table(self.table)))
            except NftError:
                nft.close()
                raise
            namespace = self._namespaces[inode] = _Namespace(inode, nft)
        base = None
        if namespace.holders.get(spec.name):  # another target on the same cgroup
            base = self._read(namespace).get(spec.name, Counts())
        else:
            commands = cgroup_rules.install(self.table, spec)
            if spec.level not in namespace.levels:
                commands = cgroup_rules.level(self.table, spec.level) + commands
            namespace.nft.run("\n".join(commands))
            namespace.levels.add(spec.level)
        namespace.specs[spec.name] = spec
        namespace.holders.setdefault(spec.name, set()).add(holder)
        return base

    def uninstall(self, inode: int, spec: Spec, holder: str) -> None:
        """``holder`` lets go of ``spec``'s rules in namespace ``inode``: they go with
        their last holder, the table with the namespace's last rules."""
        namespace = self._namespaces.get(inode)
        if namespace is None:
            return
        holders = namespace.holders.get(spec.name, set())
        holders.discard(holder)
        if holders:
            return  # another target on the same cgroup still reads them
        namespace.holders.pop(spec.name, None)
        namespace.specs.pop(spec.name, None)
        if not namespace.holders:
            self._drop(namespace)
            return
        others = list(namespace.specs.values())
        staying = [
            o for o in others if o.level == spec.level and os.path.isdir(f"/sys/fs/cgroup/{o.path}")
        ]  # else it goes next
        try:
            namespace.nft.run("\n".join(cgroup_rules.uninstall(self.table, spec, others, staying)))
        except NftError as exc:
            log.warning("removing cgroup %s's nftables rules failed: %s", spec.path, exc)

    def read(self, inode: int) -> dict[str, Counts]:
        """Per cgroup's rules in namespace ``inode`` (none where no table is there): its
        traffic there, members' own taken off. NftError where they cannot be read."""
        namespace = self._namespaces.get(inode)
        return {} if namespace is None else self._read(namespace)

    def read_all(self) -> dict[int, dict[str, Counts]]:
        """:meth:`read` of every namespace whose counters can be read; the others have
        a :meth:`problem` until they can."""
        counts: dict[int, dict[str, Counts]] = {}
        for inode, namespace in list(self._namespaces.items()):
            try:
                counts[inode] = self._read(namespace)
            except NftError as exc:
                if namespace.problem is None:  # once, not every pass
                    log.warning(
                        "reading nftables counters in network namespace %d failed: %s; "
                        "network figures of targets with members there are absent until "
                        "they can be read",
                        inode,
                        exc,
                    )
                namespace.problem = f"network namespace {inode}: counters unreadable: {exc}"
                continue
            namespace.problem = None
        return counts

    def problem(self, inode: int) -> str | None:
        """Why namespace ``inode``'s counters were not read at the last :meth:`read_all`."""
        namespace = self._namespaces.get(inode)
        return None if namespace is None else namespace.problem

    def close(self) -> None:
        for namespace in list(self._namespaces.values()):
            self._drop(namespace)

    def _read(self, namespace: _Namespace) -> dict[str, Counts]:
        found = namespace.nft.counters(FAMILY, self.table.split()[1])
        if any(f"tx_{name}" not in found for name in namespace.specs):
            raise NftError(f"table {self.table} or its counters are gone (deleted by root?)")
        return {name: Counts(*net) for name, net in cgroup_rules.counts(found).items()}

    def _drop(self, namespace: _Namespace) -> None:
        self._namespaces.pop(namespace.inode, None)
        try:
            if self.table.split()[1] in _tables(namespace.nft):
                namespace.nft.run(f"delete table {self.table}")
        except NftError as exc:
            log.warning("removing the nftables table failed: %s", exc)
        finally:
            namespace.nft.close()


def _probe(open_nft: Callable[[str | None], Nft]) -> None:
    """NftError saying why, where this process may not use nftables (netlink refuses
    every nftables request without CAP_NET_ADMIN, a listing included)."""
    nft = open_nft(None)
    try:
        nft.run("list tables")
    except NftError as exc:
        raise NftError(f"{exc} (counting needs CAP_NET_ADMIN)") from None
    finally:
        nft.close()


def _tables(nft: Nft) -> list[str]:
    answer = nft.run("list tables") or {}
    return [
        item["table"]["name"]
        for item in answer.get("nftables", [])
        if "table" in item and item["table"].get("family") == FAMILY
    ]


def _stale_tables(nft: Nft, proc: str) -> list[str]:
    """edgewatt tables whose daemon is gone (named by its pid)."""
    stale = []
    for name in _tables(nft):
        pid = name[len(PREFIX) :]
        mine_or_dead = pid.isdigit() and (
            int(pid) == os.getpid() or not os.path.exists(f"{proc}/{pid}")
        )
        if name.startswith(PREFIX) and mine_or_dead:
            stale.append(name)
    return stale
