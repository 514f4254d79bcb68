"""Run in Flower's own venv by tests/test_flower.py: the collector over FedAvg, fed
replies as a SuperLink hands them to the ServerApp, where one client's ``edgewatt``
record is hostile (argv[1]: the file to write). Prints the warnings it logged, as JSON."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from edgewatt.client.flower import RECORD, collect

HONEST = {
    "round": 1, "kind": "train", "phase": "round-1/train", "duration_s": 3.25,
    "bytes_received": 4000128, "bytes_sent": 4000128,
    "bytes_source": "flower payload: the message's arrays as serialised, down and up",
    "host_name": "jetson-1", "source": "daemon", "target": "t-1", "exact": True,
    "cpu_s": 2.5, "energy_j": 12.5, "device_energy_j": 30.0,
    "shorter_than_sensor_period": False, "rss_peak_bytes": 104857600,
}  # fmt: skip
# Node 2's record, round by round: what the issue found, and the other bad values.
HOSTILE = {
    1: {**HONEST, "node_id": 1, "type": "sample", "round": 99, "kind": "evaluate",
        "evil": "x"},
    2: {**HONEST, "host_name": b"\x1b]0;owned\x07", "cpu_s": [1.0, 2.0],
        "duration_s": float("nan"), "phase": "x" * 1_000_000, "energy_j": 1e300,
        "device_energy_j": float("inf"), "bytes_sent": -5, "exact": "yes",
        "bytes_received": 1 << 62, "rss_peak_bytes": 1.5, "target": ["a", "b"]},
    3: {**HONEST, "node_id": 1, "type": "sample"},  # again: logged once per client
}  # fmt: skip


def reply(node: int, server_round: int, record: dict) -> Message:
    sent = Message(
        RecordDict({"config": ConfigRecord({"server-round": server_round})}),
        dst_node_id=node, message_type="train", group_id=str(server_round),
    )  # fmt: skip
    content = RecordDict({
        "arrays": ArrayRecord([np.ones(4)]),
        "metrics": MetricRecord({"num-examples": 10, "loss": 0.5}),
        RECORD: ConfigRecord(record),
    })  # fmt: skip
    return Message(content, reply_to=sent)


def main() -> None:
    TaskIdentity.run_id = 1  # as a ServerApp process has it, to make messages
    TaskIdentity.task_id = 1
    TaskIdentity.node_id = 0
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda entry: warnings.append(entry.getMessage())  # type: ignore[method-assign]
    logging.getLogger("edgewatt.client.flower").addHandler(handler)
    strategy = collect(FedAvg(), sys.argv[1])
    for server_round, hostile in HOSTILE.items():
        honest = {**HONEST, "round": server_round, "phase": f"round-{server_round}/train"}
        replies = [reply(1, server_round, honest), reply(2, server_round, hostile)]
        _, metrics = strategy.aggregate_train(server_round, replies)
        assert dict(metrics) == {"loss": 0.5}, metrics  # the aggregation untouched
    print(json.dumps({"warnings": warnings}))


if __name__ == "__main__":
    main()
