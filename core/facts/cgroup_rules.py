"""The nftables commands behind cgroup traffic counting (traffic_tables.py runs them,
cgroup_traffic.py keeps the books): one table per daemon and namespace; per cgroup
level in use, a verdict map keyed by cgroup on each hook; per counted cgroup, two
chains, four named counters and two sets of the loopback flows its sockets send (IPv4,
IPv6).

    output:  socket cgroupv2 level L vmap @out_L   -> o_NAME
             o_NAME: not loopback: counter tx; loopback: add the flow to @f4/f6_NAME
    input:   loopback, a flow some target sent (@any4/any6) -> lo4/lo6:
                 in @f4/f6_NAME: counter lotx   (one rule per counted cgroup)
             socket cgroupv2 level L vmap @in_L    -> i_NAME
             i_NAME: loopback, in @f4/f6_NAME: counter internal; counter rx

No packet's mark is read or written: the sender of a loopback packet is known at the
input hook by its flow (addresses, ports, protocol), which the output hook put in its
cgroup's set. A cgroup inside another is in both's sets, so nested targets count as if
each were alone. A flow stays in a set FLOW_TIMEOUT after its last packet, at most
FLOW_SET_SIZE flows per set: a packet of a flow beyond that is not counted as its
sender's (docs/reference.md, "Cgroup targets").

Counters are read alone each pass, by a netlink dump of the table's counter objects
(nftables.py, Nft.counters): listing through libnftables would fetch every flow set's
elements first, and listing rules would make nft print each cgroup's path, which it
finds by walking all of /sys/fs/cgroup.
"""

from __future__ import annotations

from dataclasses import dataclass

# Output counts late (after other tables' verdicts: what really left), input early.
OUTPUT_PRIORITY = 300
INPUT_PRIORITY = -300
KINDS = ("tx", "lotx", "rx", "internal")
# A flow is forgotten this long after its last packet: far longer than a packet takes
# from the output hook to the input hook on loopback, shorter than the second after
# which TCP may give a closed connection's port to a new socket (tcp_tw_reuse): a port
# reused by another cgroup's socket must not still be in the first one's set.
FLOW_TIMEOUT = "500ms"
FLOW_SET_SIZE = 16384
_FLOW = {
    "4": ("ipv4_addr", "ip saddr . th sport . ip daddr . th dport . meta l4proto"),
    "6": ("ipv6_addr", "ip6 saddr . th sport . ip6 daddr . th dport . meta l4proto"),
}


@dataclass(frozen=True)
class Spec:
    """One counted cgroup's part of a table: ``name`` is nft-safe and unique in it."""

    name: str
    path: str  # as nftables resolves it: relative to /sys/fs/cgroup
    level: int


def _flow_set(table: str, name: str, v: str) -> str:
    address = _FLOW[v][0]
    return (
        f"add set {table} {name} {{ type {address} . inet_service . {address} . "
        f"inet_service . inet_proto; flags dynamic,timeout; timeout {FLOW_TIMEOUT}; "
        f"size {FLOW_SET_SIZE}; }}"
    )


def table(table: str) -> list[str]:
    commands = [
        f"add table {table}",
        f"add chain {table} output {{ type filter hook output priority {OUTPUT_PRIORITY}; "
        "policy accept; }",
        f"add chain {table} input {{ type filter hook input priority {INPUT_PRIORITY}; "
        "policy accept; }",
    ]
    for v, family in (("4", "ipv4"), ("6", "ipv6")):
        commands += [
            _flow_set(table, f"any{v}", v),
            f"add chain {table} lo{v}",
            f'add rule {table} input iif "lo" meta nfproto {family} {_FLOW[v][1]} @any{v} '
            f"jump lo{v}",
        ]
    return commands


def level(table: str, n: int) -> list[str]:
    """The maps and lookups of cgroups at depth ``n``."""
    return [
        f"add map {table} out_{n} {{ type cgroupsv2 : verdict; }}",
        f"add map {table} in_{n} {{ type cgroupsv2 : verdict; }}",
        f"add rule {table} output socket cgroupv2 level {n} vmap @out_{n}",
        f"add rule {table} input socket cgroupv2 level {n} vmap @in_{n}",
    ]


def install(table: str, spec: Spec) -> list[str]:
    name = spec.name
    commands = [f"add counter {table} {kind}_{name}" for kind in KINDS]
    commands += [f"add chain {table} {chain}_{name}" for chain in "oi"]
    commands.append(f'add rule {table} o_{name} oif != "lo" counter name "tx_{name}"')
    for v, family in (("4", "ipv4"), ("6", "ipv6")):
        flow = _FLOW[v][1]
        commands += [
            _flow_set(table, f"f{v}_{name}", v),
            f'add rule {table} o_{name} oif "lo" meta nfproto {family} '
            f"update @f{v}_{name} {{ {flow} }} update @any{v} {{ {flow} }}",
            f'add rule {table} i_{name} iif "lo" meta nfproto {family} {flow} @f{v}_{name} '
            f'counter name "internal_{name}"',
        ]
    commands.append(f'add rule {table} i_{name} counter name "rx_{name}"')
    return commands + _loopback(table, spec) + elements(table, spec)


def _loopback(table: str, spec: Spec) -> list[str]:
    """Its rules in lo4 and lo6: what its sockets sent over loopback."""
    return [
        f'add rule {table} lo{v} {_FLOW[v][1]} @f{v}_{spec.name} counter name "lotx_{spec.name}"'
        for v in "46"
    ]


def elements(table: str, spec: Spec) -> list[str]:
    """Its entries in its level's maps (the path is resolved to the cgroup's id here)."""
    n, path, name = spec.level, spec.path, spec.name
    return [
        f'add element {table} out_{n} {{ "{path}" : jump o_{name} }}',
        f'add element {table} in_{n} {{ "{path}" : jump i_{name} }}',
    ]


def uninstall(table: str, spec: Spec, others: list[Spec], staying: list[Spec]) -> list[str]:
    """Remove it. A map entry is named by its cgroup's path, which is gone once the
    cgroup is: its level's maps are emptied and refilled with the ``staying`` cgroups
    at that level instead (those whose cgroup is still there), and the loopback
    chains with the rules of the ``others`` in the table."""
    n, name = spec.level, spec.name
    commands = [f"flush map {table} out_{n}", f"flush map {table} in_{n}"]
    for other in staying:
        commands += elements(table, other)
    commands += [f"flush chain {table} lo{v}" for v in "46"]
    for other in others:
        commands += _loopback(table, other)
    for chain in "oi":
        commands += [f"flush chain {table} {chain}_{name}", f"delete chain {table} {chain}_{name}"]
    commands += [f"delete set {table} f{v}_{name}" for v in "46"]
    return commands + [f"delete counter {table} {kind}_{name}" for kind in KINDS]


def counts(counters: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int, int, int]]:
    """The table's counters (name -> bytes, packets): per cgroup name, (sent bytes,
    received bytes, sent packets, received packets), traffic between its members taken
    off: sent is what left by another interface (tx) plus what its sockets sent over
    loopback (lotx), received what reached its sockets (rx), less what went from one of
    its sockets to another over loopback (internal)."""
    slot = {kind: 2 * n for n, kind in enumerate(KINDS)}
    found: dict[str, list[int]] = {}
    for full_name, (n_bytes, n_packets) in counters.items():
        kind, _, name = full_name.partition("_")
        if kind in slot:
            values = found.setdefault(name, [0] * 8)
            values[slot[kind]] += n_bytes
            values[slot[kind] + 1] += n_packets
    return {
        name: (tx + lo - inner, rx - inner, tx_n + lo_n - inner_n, rx_n - inner_n)
        for name, (tx, tx_n, lo, lo_n, rx, rx_n, inner, inner_n) in found.items()
    }
