"""Every byte a cgroup's sockets send and receive, short connections and UDP included,
from nftables counters in a table of the daemon's own (``inet edgewatt_PID``) in each
network namespace the cgroup's members use (docs/reference.md, "Cgroup targets").

Per target, in each such namespace (``socket cgroupv2 level L "PATH"`` is "a socket
of the cgroup's"):

- output, not loopback: a counter (sent out of the host);
- output, loopback: a tag in the packet mark (bits 0x00ff0000) naming the target;
- input: a counter of tagged packets (sent by a member over loopback), of tagged
  packets reaching one of its sockets (between two members: not the target's, taken
  off both directions), and of packets reaching its sockets (received). The tag is
  cleared there, before any other table sees the packet.

Loopback is counted on the way in because segmentation offload splits a packet after
the output hook: a 64 KB batch leaves as one packet and arrives as many, each with its
headers, and only figures taken on the same side subtract exactly.

The figures are IP bytes: payload plus IP and TCP/UDP headers, one set per packet as
the hook sees it (sent out of the host with offload: one per batch). A context holds its
namespace open, so a stopped container's last counts are still read; the namespace
is let go once no member uses it. Rules go with their target, the table with the
daemon; a table left by a daemon killed with -9 (its pid is gone) is removed at the
next start, and a live daemon's (tests run several) is left alone.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edgewatt.core.sampling.nftables import Nft, NftError

log = logging.getLogger(__name__)

FAMILY = "inet"
PREFIX = "edgewatt_"
MARK_MASK = 0x00FF0000
MARK_SHIFT = 16
MAX_TAGS = 255
# Output counts late (after other tables' verdicts: what really left), input early,
# so the loopback tag is cleared before other tables look at the mark.
OUTPUT_PRIORITY = 300
INPUT_PRIORITY = -300
COUNTS = "IP bytes: payload plus IP and TCP/UDP headers, every protocol, every connection"


@dataclass(frozen=True)
class Counts:
    """A target's traffic: IP bytes and packets each way, as the hooks saw them."""

    sent_bytes: int = 0
    received_bytes: int = 0
    sent_packets: int = 0
    received_packets: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.sent_bytes + other.sent_bytes,
            self.received_bytes + other.received_bytes,
            self.sent_packets + other.sent_packets,
            self.received_packets + other.received_packets,
        )


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
    last: dict[int, Counts] = field(default_factory=dict)  # per namespace inode
    carried: Counts = Counts()  # from namespaces no member uses any more
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
        self.table = f"{FAMILY} {PREFIX}{os.getpid()}"

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
                for table in _stale_tables(nft, self._proc):
                    nft.run(f"delete table {FAMILY} {table}")
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

    def sample(self) -> dict[str, Counts]:
        """Each watched target's traffic, cumulative."""
        counts: dict[int, dict[str, Counts]] = {}
        for inode, namespace in list(self._namespaces.items()):
            try:
                counts[inode] = _counters(namespace.nft, self.table)
            except NftError as exc:
                log.warning("reading nftables counters failed: %s", exc)
        result = {}
        for target_id, watch in self._watches.items():
            for inode in watch.namespaces:
                if target_id in counts.get(inode, {}):
                    watch.last[inode] = counts[inode][target_id]
            total = watch.carried
            for part in watch.last.values():
                total += part
            result[target_id] = total
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
                _create_table(nft, self.table)
                self._namespaces[inode] = namespace
            namespace.nft.run("\n".join(_rules_for(self.table, target_id, watch)))
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
                    final = _counters(namespace.nft, self.table).get(target_id)
                except NftError:
                    final = None
                if final is not None:
                    watch.last[inode] = final
            watch.carried += watch.last.pop(inode, Counts())
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
            handles = _rule_handles(namespace.nft, self.table, target_id)
            namespace.nft.run(
                "\n".join(f"delete rule {self.table} {c} handle {h}" for c, h in handles)
            )
        except NftError as exc:
            log.warning("removing target %s's nftables rules failed: %s", target_id, exc)

    def _drop_namespace(self, namespace: _Namespace) -> None:
        self._namespaces.pop(namespace.inode, None)
        try:
            if self.table.split()[1] in _tables(namespace.nft):
                namespace.nft.run(f"delete table {self.table}")
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


def _rules_for(table: str, target_id: str, watch: _Watch) -> list[str]:
    """The target's rules (input ones inserted: before the rule that clears tags)."""
    mine = f'socket cgroupv2 level {watch.level} "{watch.path}"'
    if watch.tag is None:  # no tag left: loopback counted as sent, members' included
        return [
            f'add rule {table} output {mine} counter comment "{target_id} tx"',
            f'insert rule {table} input {mine} counter comment "{target_id} rx"',
        ]
    tag = watch.tag << MARK_SHIFT
    tagged = f"meta mark & {MARK_MASK:#x} == {tag:#x}"
    return [
        f'add rule {table} output oif != "lo" {mine} counter comment "{target_id} tx"',
        f'add rule {table} output oif "lo" {mine} meta mark set meta mark & '
        f'{0xFFFFFFFF ^ MARK_MASK:#x} | {tag:#x} comment "{target_id} tag"',
        f'insert rule {table} input {mine} counter comment "{target_id} rx"',
        f'insert rule {table} input iif "lo" {tagged} counter comment "{target_id} lo-tx"',
        f'insert rule {table} input iif "lo" {tagged} {mine} counter '
        f'comment "{target_id} internal"',
    ]


def _create_table(nft: Nft, table: str) -> None:
    nft.run(
        "\n".join(
            (
                f"add table {table}",
                f"add chain {table} output {{ type filter hook output priority "
                f"{OUTPUT_PRIORITY}; policy accept; }}",
                f"add chain {table} input {{ type filter hook input priority "
                f"{INPUT_PRIORITY}; policy accept; }}",
                f'add rule {table} input iif "lo" meta mark & {MARK_MASK:#x} != 0 '
                f"meta mark set meta mark & {0xFFFFFFFF ^ MARK_MASK:#x}",
            )
        )
    )


def _tables(nft: Nft) -> list[str]:
    answer = nft.run("list tables") or {}
    return [
        item["table"]["name"]
        for item in answer.get("nftables", [])
        if "table" in item and item["table"].get("family") == FAMILY
    ]


def _stale_tables(nft: Nft, proc: str) -> list[str]:
    """edgewatt tables whose daemon is gone (named by its pid)."""
    return [
        name
        for name in _tables(nft)
        if name.startswith(PREFIX)
        and name[len(PREFIX) :].isdigit()
        and (
            int(name[len(PREFIX) :]) == os.getpid()
            or not os.path.exists(f"{proc}/{name[len(PREFIX) :]}")
        )
    ]


def _rules(nft: Nft, table: str) -> list[dict]:
    answer = nft.run(f"list table {table}") or {}
    return [item["rule"] for item in answer.get("nftables", []) if "rule" in item]


def _counters(nft: Nft, table: str) -> dict[str, Counts]:
    """Per target id, traffic between members taken off."""
    found: dict[str, list[int]] = {}
    slot = {"tx": 0, "lo-tx": 2, "rx": 4, "internal": 6}  # bytes, then packets
    for rule in _rules(nft, table):
        target_id, _, kind = str(rule.get("comment", "")).rpartition(" ")
        if kind not in slot:
            continue
        for expression in rule.get("expr", []):
            counter = expression.get("counter") if isinstance(expression, dict) else None
            if counter is not None:
                values = found.setdefault(target_id, [0] * 8)
                values[slot[kind]] += int(counter["bytes"])
                values[slot[kind] + 1] += int(counter["packets"])
    return {k: _net(*v) for k, v in found.items()}


def _net(
    tx: int, tx_n: int, lo: int, lo_n: int, rx: int, rx_n: int, inner: int, inner_n: int
) -> Counts:
    return Counts(tx + lo - inner, rx - inner, tx_n + lo_n - inner_n, rx_n - inner_n)


def _rule_handles(nft: Nft, table: str, target_id: str) -> list[tuple[str, int]]:
    return [
        (rule["chain"], rule["handle"])
        for rule in _rules(nft, table)
        if str(rule.get("comment", "")).rpartition(" ")[0] == target_id
    ]
