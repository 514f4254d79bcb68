"""The ClientApp: adds one to the model (and its node's own mark), burns a known CPU
time, and writes what it did (the model bytes it received and returned, its own CPU
time and wall time) as one JSON line to the file named by the node's config "log".
edgewatt's mod measures every message it handles."""

import json
import os
import resource
import time

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgewatt.client.flower import edgewatt_mod

app = ClientApp(mods=[edgewatt_mod])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@app.train()
def train(msg: Message, context: Context) -> Message:
    started, cpu = time.monotonic(), _cpu()  # as the mod's window opens
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    received = sum(a.nbytes for a in arrays)
    end = time.process_time() + 0.3
    while time.process_time() < end:  # the local training
        pass
    updated = [a + 1 for a in arrays]
    # Each node's update its own: Flower stores objects by content, and a node whose
    # reply equals one the SuperLink already holds does not send it at all.
    updated[0].flat[0] += context.node_id % 997 + 1
    reply = RecordDict(
        {
            "arrays": ArrayRecord(updated),
            "metrics": MetricRecord({"num-examples": 10, "loss": float(updated[0][0])}),
        }
    )
    with open(context.node_config["log"], "a") as log:
        record = {
            "pid": os.getpid(),
            "round": msg.content["config"]["server-round"],
            "received_bytes": received,
            "sent_bytes": sum(a.nbytes for a in updated),
            "cpu_s": _cpu() - cpu,
            "wall_s": time.monotonic() - started,
        }
        log.write(json.dumps(record) + "\n")
    return Message(content=reply, reply_to=msg)
