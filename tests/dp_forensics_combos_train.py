"""Forensics in combination, on 2 msrun CPU ranks (driven by tests/test_forensics_combos_dp.py).

One job, two parts, so the test pays for one msrun start:

1. **Data parallel with gradient accumulation** (``grad_accum_steps=ACCUM``, ``forensics``,
   ``forensics_ids``, ``Model.train`` with a ``LiveMonitor``). Rank ``r`` trains on the global rows
   ``r, r + world, ...`` with an ``index`` column of their global ids; one sample of rank
   ``FAULT_RANK``'s ``FAULT_MICRO``-th micro-batch of optimizer step ``FAULT_STEP`` has its inputs
   multiplied by 1000. Rank 0 writes OUT/accum/metrics.jsonl and the weights before that optimizer
   step (OUT/accum/weights_before_fault.npz).
2. **Hand-sharded parameters** (the column/row-split MLP of tests/tp_train.py,
   ``Parameter(layerwise_parallel=True)``, ``shard_group``): ``TP_STEPS`` steps with ``forensics``,
   in stand-alone mode with the explicit communication (``flat``) and inside ``DATA_PARALLEL``
   (``auto``: the fused kernel's per-tensor pass where built). Each rank writes what its rings hold
   for every kept step and its weight slices before each step to OUT/tp.rank<N>.json.

Usage: ``msrun --worker_num=2 --local_worker_num=2 ... tests/dp_forensics_combos_train.py OUT``
"""

from __future__ import annotations

import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore import dataset as ds
from mindspore.train import Callback, Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradmon.cells import MonitoredTrainStep

from examples.models import MLP
from gradmon.monitor.callback import LiveMonitor
from tests import tp_train

# Part 1: optimizer steps of ACCUM micro-batches of BATCH samples per rank.
BATCH, ACCUM, STEPS, IN_DIM, OUT_DIM = 4, 2, 12, 32, 4
FAULT_STEP, FAULT_RANK, FAULT_MICRO, FAULT_POS = 10, 1, 1, 2  # the 2nd micro-batch's 3rd sample
# Part 2.
TP_STEPS = 3


def fault_id(world: int) -> int:
    """Global id of the poisoned sample (rank FAULT_RANK's own row j is global row world * j + rank)."""
    local_row = ((FAULT_STEP - 1) * ACCUM + FAULT_MICRO) * BATCH + FAULT_POS
    return world * local_row + FAULT_RANK


def global_data(world: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = STEPS * ACCUM * BATCH * world
    x = rng.random((n, IN_DIM), dtype=np.float32)
    y = rng.standard_normal((n, OUT_DIM)).astype(np.float32)
    x[fault_id(world)] *= 1000.0
    return x, y


class SaveBeforeFault(Callback):
    """The weights after the optimizer step before FAULT_STEP (Model counts micro-steps)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        if cb.cur_step_num == (FAULT_STEP - 1) * ACCUM:
            np.savez(self.path, **{p.name: p.asnumpy() for p in cb.train_network.weights})


def accumulated_alarm(out: str, rank: int, world: int) -> None:
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    x, y = global_data(world)
    ids = np.arange(len(x), dtype=np.int32)
    mine = slice(rank, None, world)
    data = ds.NumpySlicesDataset({"x": x[mine], "y": y[mine], "index": ids[mine]}, shuffle=False)
    data = data.batch(BATCH, drop_remainder=True)
    net = MLP(in_dim=IN_DIM, hidden=16, classes=OUT_DIM)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    cell = MonitoredTrainStep(loss_net, nn.SGD(net.trainable_params(), learning_rate=0.02), max_norm=5.0,
                              history_size=16, grad_accum_steps=ACCUM, forensics=4, forensics_ids=BATCH)
    os.makedirs(os.path.join(out, "accum"), exist_ok=True)
    monitor = LiveMonitor(os.path.join(out, "accum", "metrics.jsonl"), log_interval=2,
                          alarm_config={"min_history": 5}, config={"world": world})
    callbacks = [monitor]
    if rank == 0:
        callbacks.append(SaveBeforeFault(os.path.join(out, "accum", "weights_before_fault.npz")))
    Model(cell).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    ms.reset_auto_parallel_context()


def sharded_forensics(rank: int, world: int, strategy: str) -> dict:
    """TP_STEPS steps of the split MLP (no fault); the rings' view of each kept step, newest first,
    and this rank's weight slices before each step, oldest first."""
    net = tp_train.TPNet(rank, world, poison_rank=1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    cell = MonitoredTrainStep(net, opt, max_norm=tp_train.MAX_NORM, history_size=8,
                              shard_group=tp_train.GROUP,
                              norm_strategy=strategy, forensics=TP_STEPS)
    weights = []
    for x, y, _ in tp_train.batches()[:TP_STEPS]:
        weights.append({p.name: p.asnumpy().astype(float).tolist() for p in net.trainable_params()})
        cell(Tensor(x), Tensor(y), Tensor(np.float32(0.0)))
    return {"strategy": cell.gradmon_config()["norm_strategy"], "weights_before": weights,
            "norms": cell.gradmon_read_history().column("grad_norm").tolist(),
            "forensics": [cell.gradmon_forensics(back) for back in range(TP_STEPS)]}


def main() -> None:
    out = sys.argv[1]
    ms.set_context(mode=ms.GRAPH_MODE)
    from mindspore.communication import create_group, get_group_size, get_rank, init

    init()
    rank, world = get_rank(), get_group_size()
    accumulated_alarm(out, rank, world)
    create_group(tp_train.GROUP, list(range(world)))
    result = {"rank": rank, "world": world, "standalone": sharded_forensics(rank, world, "flat")}
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    result["data_parallel"] = sharded_forensics(rank, world, "auto")
    ms.reset_auto_parallel_context()
    with open(os.path.join(out, f"tp.rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
