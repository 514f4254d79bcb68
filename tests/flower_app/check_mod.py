"""Run in Flower's own venv by tests/test_flower.py: the mod on a message-API ClientApp
and on a legacy client_fn + NumPyClient app, both called as Flower calls them; the
round from `server-round` and from `group_id` alone; and FedAvg's aggregation of the
replies with the mod's record and without it. Prints one JSON object."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import FitIns
from flwr.compat.common.parameter import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common.recorddict_compat import fitins_to_recorddict, recorddict_to_fitres
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from edgewatt.client import Registration
from edgewatt.client.flower import RECORD, collect, edgewatt_mod, round_of

MODEL = [np.ones(131072, dtype=np.float64)]  # 1 MiB
SPANS: list[float] = []  # each train() call's own span, seconds


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class Legacy(NumPyClient):
    def fit(self, parameters, config):
        burn(0.2)
        return [p + 1 for p in parameters], 10, {"loss": 0.5}


def client_fn(context: Context):
    return Legacy().to_client()


legacy = ClientApp(client_fn=client_fn, mods=[edgewatt_mod])
native = ClientApp(mods=[edgewatt_mod])


@native.train()
def train(msg: Message, context: Context) -> Message:
    started = time.monotonic()
    burn(0.2)
    arrays = [a + 1 for a in msg.content["arrays"].to_numpy_ndarrays()]
    metrics = MetricRecord({"num-examples": 10, "loss": 0.5})
    reply = Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}), reply_to=msg)
    SPANS.append(time.monotonic() - started)
    return reply


def message(server_round: int | None, group_id: str, node: int) -> Message:
    content = RecordDict({"arrays": ArrayRecord(MODEL)})
    if server_round is not None:
        content["config"] = ConfigRecord({"server-round": server_round, "lr": 0.1})
    return Message(content, dst_node_id=node, message_type="train", group_id=group_id)


def legacy_message(server_round: int, node: int) -> Message:
    """As Flower's legacy server sends a fit: FitIns in its compat layout, the round in
    the group id alone (the default fit config is empty)."""
    content = fitins_to_recorddict(FitIns(ndarrays_to_parameters(MODEL), {}), keep_input=True)
    return Message(content, dst_node_id=node, message_type="train", group_id=str(server_round))


def context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def figures(reply: Message) -> dict:
    return dict(reply.content[RECORD])


def main() -> None:
    TaskIdentity.run_id = 1  # as a ServerApp process has it, to make messages
    TaskIdentity.task_id = 1
    TaskIdentity.node_id = 0
    out: dict = {
        "round_from_config": round_of(message(3, "7", 1)),
        "round_from_group_id": round_of(message(None, "7", 1)),
    }
    for name, app, sent in (
        ("native", native, message(2, "2", 1)),
        ("legacy", legacy, legacy_message(2, 1)),
    ):
        reply = app(sent, context(1))
        assert not reply.has_error(), reply.error
        out[name] = {"record": figures(reply), "arrays": sorted(reply.content.array_records)}
        if name == "legacy":  # what the legacy strategy reads: the FitRes, untouched
            fitres = recorddict_to_fitres(reply.content, keep_input=True)
            out[name]["fitres"] = {
                "num_examples": fitres.num_examples,
                "metrics": dict(fitres.metrics),
                "sum": float(parameters_to_ndarrays(fitres.parameters)[0].sum()),
            }
    # FedAvg over two nodes' replies, with the mod's record and with it removed.
    with_record = [native(message(1, "1", n), context(n)) for n in (1, 2)]
    without = []
    for reply in with_record:
        content = RecordDict({k: v for k, v in reply.content.items() if k != RECORD})
        without.append(Message(content, reply_to=message(1, "1", 1)))
    plain = FedAvg().aggregate_train(1, without)
    wrapped = collect(FedAvg(), sys.argv[1]).aggregate_train(1, with_record)
    out["aggregate"] = {
        "metrics_plain": dict(plain[1]),
        "metrics_with_mod": dict(wrapped[1]),
        "arrays_equal": all(
            np.array_equal(a, b)
            for a, b in zip(plain[0].to_numpy_ndarrays(), wrapped[0].to_numpy_ndarrays())
        ),
    }
    # The mod's request to open the phase, made slow (a daemon that answers late): the
    # record's duration is the ClientApp's own call all the same.
    phase = Registration.phase

    def slow_phase(self, name):
        time.sleep(0.5)
        return phase(self, name)

    Registration.phase = slow_phase
    try:
        reply = native(message(4, "4", 1), context(1))
    finally:
        Registration.phase = phase
    out["slow_open"] = {"record": figures(reply), "own_s": SPANS[-1]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
