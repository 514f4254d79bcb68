"""A cgroup target's traffic as counted: the value type ``cgroup_traffic.py`` reports
and ``traffic_tables.py`` reads out of nftables, and the count from outside a network
namespace (its interfaces), where the daemon may not count by rules."""

from __future__ import annotations

from dataclasses import dataclass

from edgewatt.core.facts.system import net_dev_rows

# Why cgroup targets have no network figures where no nftables counters are read.
NOT_COUNTED = "cgroup traffic is not counted"


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

    def since(self, start: Counts) -> Counts:
        """What was counted after ``start`` (never negative: a counter that went back
        restarted, its interface recreated)."""
        return Counts(
            max(0, self.sent_bytes - start.sent_bytes),
            max(0, self.received_bytes - start.received_bytes),
            max(0, self.sent_packets - start.sent_packets),
            max(0, self.received_packets - start.received_packets),
        )


def interface_counts(net_dev: str) -> Counts:
    """A network namespace's traffic on every interface but loopback, from a member's
    ``/proc/PID/net/dev`` (bytes and packets, transmit as sent)."""
    sent = received = sent_packets = received_packets = 0
    with open(net_dev, "rb") as f:
        text = f.read()
    for name, fields in net_dev_rows(text):
        if name != "lo":
            received += int(fields[0])
            received_packets += int(fields[1])
            sent += int(fields[8])
            sent_packets += int(fields[9])
    return Counts(sent, received, sent_packets, received_packets)
