"""The ServerApp: FedAvg over every node, training only; edgewatt's collector writes
each client's figures per round to the run config's "fl-log"."""

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from edgewatt.client.flower import collect

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    floats = int(context.run_config["model-floats"])
    strategy = collect(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=2),
        str(context.run_config["fl-log"]),
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord([np.zeros(floats, dtype=np.float32)]),
        num_rounds=int(context.run_config["num-server-rounds"]),
    )
