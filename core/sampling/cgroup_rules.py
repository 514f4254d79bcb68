"""The nftables commands behind cgroup traffic counting (cgroup_traffic.py keeps the
books): one table per daemon and namespace; per cgroup level in use, a verdict map
keyed by cgroup on each hook; per target, three chains and four named counters.

A packet costs one cgroup lookup per level in use and one map lookup by tag, however
many targets there are (a rule per target would cost a socket lookup per target on
every incoming packet: +34 % CPU for the senders with 20 targets, benchmarks/cgroups.py).

    output:  socket cgroupv2 level L vmap @out_L   -> o_NAME
             o_NAME: not loopback: counter tx; loopback: tag the mark (bits 0x00ff0000)
    input:   socket cgroupv2 level L vmap @in_L    -> i_NAME
             i_NAME: counter rx; tagged with its own tag: counter internal
             loopback, tagged: meta mark vmap @tags -> l_NAME: counter lotx
             loopback, tagged: clear the tag (other tables never see it)

Counters are listed alone each pass: listing rules would make nft print each
cgroup's path, which it finds by walking all of /sys/fs/cgroup.
"""

from __future__ import annotations

from dataclasses import dataclass

MARK_MASK = 0x00FF0000
MARK_SHIFT = 16
MAX_TAGS = 255
_KEEP = 0xFFFFFFFF ^ MARK_MASK
# Output counts late (after other tables' verdicts: what really left), input early,
# so the loopback tag is cleared before other tables look at the mark.
OUTPUT_PRIORITY = 300
INPUT_PRIORITY = -300
KINDS = ("tx", "lotx", "rx", "internal")


@dataclass(frozen=True)
class Spec:
    """One target's part of a table: ``name`` is nft-safe and unique in the table."""

    name: str
    path: str  # as nftables resolves it: relative to /sys/fs/cgroup
    level: int
    tag: int | None  # None: no tag left, loopback counted as sent (members' included)


def table(table: str) -> list[str]:
    tagged = f'iif "lo" meta mark & {MARK_MASK:#x}'
    return [
        f"add table {table}",
        f"add chain {table} output {{ type filter hook output priority {OUTPUT_PRIORITY}; "
        "policy accept; }",
        f"add chain {table} input {{ type filter hook input priority {INPUT_PRIORITY}; "
        "policy accept; }",
        f"add map {table} tags {{ type mark : verdict; }}",
        f"add rule {table} input {tagged} vmap @tags",
        f"add rule {table} input {tagged} != 0 meta mark set meta mark & {_KEEP:#x}",
    ]


def level(table: str, n: int) -> list[str]:
    """The maps and lookups of cgroups at depth ``n`` (input's before the tag rules)."""
    return [
        f"add map {table} out_{n} {{ type cgroupsv2 : verdict; }}",
        f"add map {table} in_{n} {{ type cgroupsv2 : verdict; }}",
        f"add rule {table} output socket cgroupv2 level {n} vmap @out_{n}",
        f"insert rule {table} input socket cgroupv2 level {n} vmap @in_{n}",
    ]


def install(table: str, spec: Spec) -> list[str]:
    name = spec.name
    commands = [f"add counter {table} {kind}_{name}" for kind in KINDS]
    commands += [f"add chain {table} {chain}_{name}" for chain in "oil"]
    if spec.tag is None:
        commands.append(f'add rule {table} o_{name} counter name "tx_{name}"')
    else:
        tag = spec.tag << MARK_SHIFT
        commands += [
            f'add rule {table} o_{name} oif != "lo" counter name "tx_{name}"',
            f'add rule {table} o_{name} oif "lo" meta mark set meta mark & {_KEEP:#x} | {tag:#x}',
            f'add rule {table} i_{name} iif "lo" meta mark & {MARK_MASK:#x} == {tag:#x} '
            f'counter name "internal_{name}"',
            f'add rule {table} l_{name} counter name "lotx_{name}"',
            f"add element {table} tags {{ {tag:#x} : jump l_{name} }}",
        ]
    commands.append(f'add rule {table} i_{name} counter name "rx_{name}"')
    return commands + elements(table, spec)


def elements(table: str, spec: Spec) -> list[str]:
    """Its entries in its level's maps (the path is resolved to the cgroup's id here)."""
    n, path, name = spec.level, spec.path, spec.name
    return [
        f'add element {table} out_{n} {{ "{path}" : jump o_{name} }}',
        f'add element {table} in_{n} {{ "{path}" : jump i_{name} }}',
    ]


def uninstall(table: str, spec: Spec, staying: list[Spec]) -> list[str]:
    """Remove it. A map entry is named by its cgroup's path, which is gone once the
    cgroup is: its level's maps are emptied and refilled with the ``staying`` targets
    at that level instead."""
    n, name = spec.level, spec.name
    commands = [f"flush map {table} out_{n}", f"flush map {table} in_{n}"]
    for other in staying:
        commands += elements(table, other)
    if spec.tag is not None:
        commands.append(f"delete element {table} tags {{ {spec.tag << MARK_SHIFT:#x} }}")
    for chain in "oil":
        commands += [f"flush chain {table} {chain}_{name}", f"delete chain {table} {chain}_{name}"]
    return commands + [f"delete counter {table} {kind}_{name}" for kind in KINDS]


def counts(answer: dict | None) -> dict[str, tuple[int, int, int, int]]:
    """A `list counters` answer: per target name, (sent bytes, received bytes, sent
    packets, received packets), traffic between its members taken off: sent is what
    left by another interface (tx) plus what its tagged packets brought over loopback
    (lotx), received what reached its sockets (rx), less the tagged packets that
    reached them (internal)."""
    slot = {kind: 2 * n for n, kind in enumerate(KINDS)}
    found: dict[str, list[int]] = {}
    for item in (answer or {}).get("nftables", []):
        counter = item.get("counter")
        if counter is None:
            continue
        kind, _, name = str(counter.get("name", "")).partition("_")
        if kind in slot:
            values = found.setdefault(name, [0] * 8)
            values[slot[kind]] += int(counter["bytes"])
            values[slot[kind] + 1] += int(counter["packets"])
    return {
        name: (tx + lo - inner, rx - inner, tx_n + lo_n - inner_n, rx_n - inner_n)
        for name, (tx, tx_n, lo, lo_n, rx, rx_n, inner, inner_n) in found.items()
    }
