"""Every byte a cgroup's sockets send and receive, short connections and UDP included,
from nftables counters in a table of the daemon's own (``inet edgewatt``) in each
network namespace the cgroup's members use (docs/reference.md, "Cgroup targets").

Per target, in each such namespace:

- output: ``socket cgroupv2 level L "PATH" counter`` (sent), and on loopback a tag in
  the packet mark (bits 0x00ff0000) naming the target;
- input: ``socket cgroupv2 level L "PATH" counter`` (received), and a counter of
  loopback packets that carry the target's own tag and reach one of its sockets:
  traffic between two members, which is not the target's and is taken off both
  directions. The tag is cleared there, before any other table sees the packet.

The figures are IP bytes: payload plus IP and TCP/UDP headers, one set per segment
the stack hands over (with segmentation offload, one per batch). A context holds its
namespace open, so a stopped container's last counts are still read; the namespace
is let go once no member uses it. Rules go with their target, the table with the
daemon; a table left by a daemon killed with -9 is removed at the next start.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edgewatt.core.sampling.nftables import Nft, NftError

log = logging.getLogger(__name__)

TABLE = "inet edgewatt"
MARK_MASK = 0x00FF0000
MARK_SHIFT = 16
MAX_TAGS = 255
# Output counts late (after other tables' verdicts: what really left), input early,
# so the loopback tag is cleared before other tables look at the mark.
OUTPUT_PRIORITY = 300
INPUT_PRIORITY = -300
COUNTS = "IP bytes: payload plus IP and TCP/UDP headers, every protocol, every connection"


@dataclass
class _Namespace:
    inode: int
    nft: Nft
    users: set[str] = field(default_factory=set)


@dataclass
class _Watch:
    path: str  # as nftables resolves it: relative to /sys/fs/cgroup
    level: int
    tag: int | None
    namespaces: set[int] = field(default_factory=set)
    last: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # ns -> tx, rx, internal
    carried: tuple[int, int] = (0, 0)  # from namespaces no member uses any more
    ns_of: dict[int, int] = field(default_factory=dict)  # member pid -> namespace inode


class CgroupTraffic:
    """``v2_mount``: where cgroup v2 is mounted; nftables names cgroups by their path
    under /sys/fs/cgroup."""

    counts = COUNTS

    def __init__(
        self,
        v2_mount: str,
        proc: str = "/proc",
        open_nft: Callable[[str | None], Nft] = Nft,
    ) -> None:
        relative = os.path.relpath(v2_mount, "/sys/fs/cgroup")
        if relative.startswith(".."):
            raise NftError(
                f"cgroup v2 is mounted at {v2_mount}; nftables looks under /sys/fs/cgroup"
            )
        self._prefix = "" if relative == "." else relative
        self._proc = proc
        self._open = open_nft
        self._own = os.stat(f"{proc}/self/ns/net").st_ino
        self._namespaces: dict[int, _Namespace] = {}
        self._watches: dict[str, _Watch] = {}

    # -- lifecycle ----------------------------------------------------------------

    def clean_stale(self) -> int:
        """Remove tables left by an earlier daemon (killed before it could), in every
        namespace a process is in; returns how many."""
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
            try:
                nft = self._open(None if inode == self._own else link)
            except OSError:
                continue  # gone meanwhile, or a namespace we may not join
            try:
                if _has_table(nft):
                    nft.run(f"delete table {TABLE}")
                    removed += 1
            except NftError as exc:
                log.warning("removing a stale nftables table failed: %s", exc)
            finally:
                nft.close()
        return removed

    def close(self) -> None:
        for namespace in list(self._namespaces.values()):
            self._drop_namespace(namespace)
        self._watches.clear()

    # -- targets ------------------------------------------------------------------

    def watch(self, target_id: str, path: str, level: int, pids: Iterable[int]) -> None:
        """Count the traffic of cgroup ``path`` (v2, absolute) in every namespace its
        members ``pids`` use; a new path (a restarted container) starts new rules."""
        nft_path = (self._prefix + path).strip("/") if self._prefix else path.strip("/")
        current = self._watches.get(target_id)
        if current is not None and current.path != nft_path:
            self._settle(target_id, current, set())  # its earlier cgroup's counts stay
            current = self._watches.pop(target_id)
            self._watches[target_id] = _Watch(nft_path, level, current.tag, carried=current.carried)
        elif current is None:
            self._watches[target_id] = _Watch(nft_path, level, self._free_tag())
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
                if inode not in watch.namespaces:
                    self._install(target_id, watch, inode, f"{self._proc}/{pid}/ns/net")
            ns_of[pid] = inode
            used.add(inode)
        watch.ns_of = ns_of
        self._settle(target_id, watch, used)

    def sample(self) -> dict[str, tuple[int, int]]:
        """(sent, received) IP bytes per watched target, cumulative."""
        counts: dict[int, dict[str, tuple[int, int, int]]] = {}
        for inode, namespace in list(self._namespaces.items()):
            try:
                counts[inode] = _counters(namespace.nft)
            except NftError as exc:
                log.warning("reading nftables counters failed: %s", exc)
        result = {}
        for target_id, watch in self._watches.items():
            for inode in watch.namespaces:
                if target_id in counts.get(inode, {}):
                    watch.last[inode] = counts[inode][target_id]
            tx, rx = watch.carried
            for sent, received, internal in watch.last.values():
                tx += sent - internal
                rx += received - internal
            result[target_id] = (tx, rx)
        return result

    def forget(self, target_id: str) -> None:
        watch = self._watches.pop(target_id, None)
        if watch is None:
            return
        for inode in list(watch.namespaces):
            self._uninstall(target_id, inode)

    # -- rules --------------------------------------------------------------------

    def _install(self, target_id: str, watch: _Watch, inode: int, link: str) -> None:
        namespace = self._namespaces.get(inode)
        try:
            if namespace is None:
                nft = self._open(None if inode == self._own else link)
                namespace = _Namespace(inode, nft)
                _create_table(nft)
                self._namespaces[inode] = namespace
            match = f'socket cgroupv2 level {watch.level} "{watch.path}"'
            rules = [
                f'add rule {TABLE} output {match} counter comment "{target_id} tx"',
                f'insert rule {TABLE} input {match} counter comment "{target_id} rx"',
            ]
            if watch.tag is not None:
                tag = watch.tag << MARK_SHIFT
                keep = 0xFFFFFFFF ^ MARK_MASK
                rules += [
                    f'add rule {TABLE} output oif "lo" {match} '
                    f'meta mark set meta mark & {keep:#x} | {tag:#x} comment "{target_id} tag"',
                    f'insert rule {TABLE} input iif "lo" meta mark & {MARK_MASK:#x} == {tag:#x} '
                    f'{match} counter comment "{target_id} internal"',
                ]
            namespace.nft.run("\n".join(rules))
        except OSError as exc:
            log.warning(
                "target %s: cannot count the traffic of cgroup %s in network namespace %d: %s",
                target_id,
                watch.path,
                inode,
                exc,
            )
            return
        namespace.users.add(target_id)
        watch.namespaces.add(inode)

    def _settle(self, target_id: str, watch: _Watch, used: set[int]) -> None:
        """Namespaces no member uses any more: their counts are carried, their rules go."""
        for inode in watch.namespaces - used:
            namespace = self._namespaces.get(inode)
            if namespace is not None:
                try:
                    final = _counters(namespace.nft).get(target_id)
                except NftError:
                    final = None
                if final is not None:
                    watch.last[inode] = final
            sent, received, internal = watch.last.pop(inode, (0, 0, 0))
            tx, rx = watch.carried
            watch.carried = (tx + sent - internal, rx + received - internal)
            self._uninstall(target_id, inode)
            watch.namespaces.discard(inode)

    def _uninstall(self, target_id: str, inode: int) -> None:
        namespace = self._namespaces.get(inode)
        if namespace is None:
            return
        namespace.users.discard(target_id)
        if not namespace.users:
            self._drop_namespace(namespace)
            return
        try:
            handles = _rule_handles(namespace.nft, target_id)
            namespace.nft.run("\n".join(f"delete rule {TABLE} {c} handle {h}" for c, h in handles))
        except NftError as exc:
            log.warning("removing target %s's nftables rules failed: %s", target_id, exc)

    def _drop_namespace(self, namespace: _Namespace) -> None:
        self._namespaces.pop(namespace.inode, None)
        try:
            if _has_table(namespace.nft):
                namespace.nft.run(f"delete table {TABLE}")
        except NftError as exc:
            log.warning("removing the nftables table failed: %s", exc)
        finally:
            namespace.nft.close()

    def _free_tag(self) -> int | None:
        taken = {w.tag for w in self._watches.values()}
        for tag in range(1, MAX_TAGS + 1):
            if tag not in taken:
                return tag
        log.warning(
            "more than %d cgroup targets: traffic between members of the newest is counted "
            "as the target's",
            MAX_TAGS,
        )
        return None


def _create_table(nft: Nft) -> None:
    nft.run(
        "\n".join(
            (
                f"add table {TABLE}",
                f"add chain {TABLE} output {{ type filter hook output priority "
                f"{OUTPUT_PRIORITY}; policy accept; }}",
                f"add chain {TABLE} input {{ type filter hook input priority "
                f"{INPUT_PRIORITY}; policy accept; }}",
                f'add rule {TABLE} input iif "lo" meta mark & {MARK_MASK:#x} != 0 '
                f"meta mark set meta mark & {0xFFFFFFFF ^ MARK_MASK:#x}",
            )
        )
    )


def _has_table(nft: Nft) -> bool:
    answer = nft.run("list tables") or {}
    return any(
        item.get("table", {}).get("family") == "inet"
        and item.get("table", {}).get("name") == "edgewatt"
        for item in answer.get("nftables", [])
    )


def _rules(nft: Nft) -> list[dict]:
    answer = nft.run(f"list table {TABLE}") or {}
    return [item["rule"] for item in answer.get("nftables", []) if "rule" in item]


def _counters(nft: Nft) -> dict[str, tuple[int, int, int]]:
    """Per target id: (sent, received, internal) bytes."""
    found: dict[str, list[int]] = {}
    slot = {"tx": 0, "rx": 1, "internal": 2}
    for rule in _rules(nft):
        target_id, _, kind = str(rule.get("comment", "")).rpartition(" ")
        if kind not in slot:
            continue
        for expression in rule.get("expr", []):
            counter = expression.get("counter") if isinstance(expression, dict) else None
            if counter is not None:
                found.setdefault(target_id, [0, 0, 0])[slot[kind]] += int(counter["bytes"])
    return {k: (v[0], v[1], v[2]) for k, v in found.items()}


def _rule_handles(nft: Nft, target_id: str) -> list[tuple[str, int]]:
    return [
        (rule["chain"], rule["handle"])
        for rule in _rules(nft)
        if str(rule.get("comment", "")).rpartition(" ")[0] == target_id
    ]
