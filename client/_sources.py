"""Where a monitor's readings come from: the daemon when one answers, else this
process's own sampling with the daemon's code; a daemon lost mid-run is replaced by
the local sampler, with one warning."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from edgewatt.client._samples import Reading
from edgewatt.core import transport
from edgewatt.core.carbon import CarbonIntensity

log = logging.getLogger(__name__)


def _network_totals(interfaces: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(sent, received) over every interface but loopback."""
    sent = sum(tx for name, (_, tx) in interfaces.items() if name != "lo")
    recv = sum(rx for name, (rx, _) in interfaces.items() if name != "lo")
    return sent, recv


class DaemonSource:
    """Registers the pid with the daemon and reads its samples over the socket."""

    kind = "daemon"

    def __init__(self, socket_path: str, pid: int, labels: dict[str, str]) -> None:
        self.socket = socket_path
        body = {"labels": labels, "children": True}
        if pid != os.getpid():
            body["pid"] = pid
        self.target = transport.call_ok(socket_path, "POST", "/v1/targets", body)["id"]

    def read(self) -> Reading | None:
        target = transport.call_ok(self.socket, "GET", f"/v1/targets/{self.target}")
        host = transport.call_ok(self.socket, "GET", "/v1/host")
        latest = target.get("latest")
        if not latest or not host.get("memory_total_bytes"):
            return None
        sent, recv = _network_totals(
            {n: (v["receive_bytes"], v["transmit_bytes"]) for n, v in host["network"].items()}
        )
        power = host.get("power") or {}
        carbon = host.get("carbon") or {}  # present only when the daemon has an intensity
        return Reading(
            time=latest["time"],
            cpu_user_s=latest["cpu_user_s"],
            cpu_system_s=latest["cpu_system_s"],
            memory_rss_bytes=latest["memory_rss_bytes"],
            memory_total_bytes=host["memory_total_bytes"],
            net_sent_total=sent,
            net_recv_total=recv,
            power_w=power.get("host_power_w"),
            energy_j=power.get("host_energy_j"),
            rails_w={
                k: v["power_w"]
                for k, v in power.get("rails", {}).items()
                if v["power_w"] is not None
            },
            process_energy_j=latest.get("energy_j"),
            carbon=CarbonIntensity(carbon["intensity_g_per_kwh"], carbon["source"])
            if carbon
            else None,
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            transport.call(self.socket, "DELETE", f"/v1/targets/{self.target}")


class LocalSource:
    """This process samples the pid itself, one pass per read."""

    kind = "local"

    def __init__(self, pid: int, labels: dict[str, str], interval: float, power: bool) -> None:
        from edgewatt.client._local import LocalSampler

        self.local = LocalSampler(pid, labels=labels, interval=interval, power=power)
        # A first pass here, before start() returns to the caller's work: it pays the
        # one-off costs (opening files, finding descendants) while no busy thread
        # competes for the GIL.
        self.local.sampler.sample_once()

    def read(self) -> Reading | None:
        snapshot = self.local.sampler.sample_once()
        if not snapshot.processes or snapshot.host is None:
            return None
        p, host, power = snapshot.processes[0], snapshot.host, snapshot.power
        sent, recv = _network_totals(
            {n: (io.receive, io.transmit) for n, io in host.network.items()}
        )
        return Reading(
            time=p.time,
            cpu_user_s=p.cpu_user_s,
            cpu_system_s=p.cpu_system_s,
            memory_rss_bytes=p.memory_rss_bytes,
            memory_total_bytes=host.memory.total_bytes,
            net_sent_total=sent,
            net_recv_total=recv,
            power_w=power.host_power_w if power else None,
            energy_j=power.host_energy_j if power else None,
            rails_w={r.name: r.power_w for r in power.rails if r.power_w is not None}
            if power
            else {},
            process_energy_j=p.energy_j,
            carbon=snapshot.carbon,
        )

    def close(self) -> None:
        self.local.sampler.close()


class Source:
    """The daemon if it answers, else local; switches once if the daemon is lost."""

    def __init__(
        self, pid: int, labels: dict[str, str], interval: float, power: bool, socket_path: str
    ) -> None:
        self.pid, self.labels, self.interval, self.power = pid, labels, interval, power
        self.current: Any
        try:
            self.current = DaemonSource(socket_path, pid, labels)
        except (OSError, transport.DaemonError) as exc:
            log.warning("edgewatt: no daemon at %s (%s); sampling in-process", socket_path, exc)
            self.current = LocalSource(pid, labels, interval, power)

    @property
    def kind(self) -> str:
        return self.current.kind

    def read(self) -> Reading | None:
        try:
            return self.current.read()
        except (OSError, transport.DaemonError) as exc:
            if self.current.kind != "daemon":
                raise
            log.warning("edgewatt: the daemon stopped answering (%s); sampling in-process", exc)
            self.current = LocalSource(self.pid, self.labels, self.interval, self.power)
            return self.current.read()

    def close(self) -> None:
        self.current.close()
