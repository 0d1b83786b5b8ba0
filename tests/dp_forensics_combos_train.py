"""Forensics in combination, on 2 msrun CPU ranks (driven by tests/test_forensics_combos_dp.py).

One job, two parts, so the test pays for one msrun start:

1. **Data parallel with gradient accumulation** (``grad_accum_steps=ACCUM``, ``forensics``,
   ``forensics_ids``, ``Model.train`` with a ``LiveMonitor``). Rank ``r`` trains on the global rows
   ``r, r + world, ...`` with an ``index`` column of their global ids; one sample of rank
   ``FAULT_RANK``'s micro-batch ``FAULT_MICRO`` (from 0) of optimizer step ``FAULT_STEP`` has its inputs
   multiplied by 1000. Rank 0 writes OUT/accum/metrics.jsonl and the weights before that optimizer
   step (OUT/accum/weights_before_fault.npz).
2. **Hand-sharded parameters** (the column/row-split MLP of tests/tp_train.py,
   ``Parameter(layerwise_parallel=True)``, ``shard_group``): ``TP_STEPS`` steps with ``forensics``,
   in stand-alone mode with the explicit communication (``flat``) and inside ``DATA_PARALLEL``
   (``auto``: the fused kernel's per-tensor pass where built). Each rank writes what its rings hold
   for every kept step and its weight slices before each step to OUT/tp.rank<N>.json; inside data
   parallel each optimizer step accumulates ``ACCUM`` micro-batches.

Usage: ``msrun --worker_num=2 --local_worker_num=2 ... tests/dp_forensics_combos_train.py OUT``
"""

from __future__ import annotations

import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradmon.cells import MonitoredTrainStep

from examples.models import MLP
from gradmon.monitor.callback import LiveMonitor
from tests import tp_train
from tests.dp_util import SaveWeightsAt, indexed_rank_dataset, poisoned_regression_data, start_data_parallel

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
    return poisoned_regression_data(STEPS * ACCUM * BATCH * world, IN_DIM, OUT_DIM, fault_id(world))


def accumulated_alarm(out: str, rank: int, world: int) -> None:
    x, y = global_data(world)
    data = indexed_rank_dataset(x, y, rank, world, BATCH)
    net = MLP(in_dim=IN_DIM, hidden=16, classes=OUT_DIM)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    cell = MonitoredTrainStep(loss_net, nn.SGD(net.trainable_params(), learning_rate=0.02), max_norm=5.0,
                              history_size=16, grad_accum_steps=ACCUM, forensics=4, forensics_ids=BATCH)
    os.makedirs(os.path.join(out, "accum"), exist_ok=True)
    monitor = LiveMonitor(os.path.join(out, "accum", "metrics.jsonl"), log_interval=2,
                          alarm_config={"min_history": 5}, config={"world": world})
    callbacks = [monitor]
    if rank == 0:
        # The weights after the optimizer step before FAULT_STEP (Model counts micro-steps).
        path = os.path.join(out, "accum", "weights_before_fault.npz")
        callbacks.append(SaveWeightsAt(path, (FAULT_STEP - 1) * ACCUM))
    Model(cell).train(1, data, callbacks=callbacks, dataset_sink_mode=False)


def tp_batches(count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of inputs and labels of the split MLP, the same on every rank."""
    rng = np.random.default_rng(11)
    return [(rng.normal(size=(tp_train.BATCH, tp_train.D_IN)).astype(np.float32),
             rng.integers(0, tp_train.CLASSES, tp_train.BATCH).astype(np.int32)) for _ in range(count)]


def sharded_forensics(rank: int, world: int, strategy: str, accum: int = 1) -> dict:
    """TP_STEPS optimizer steps of ``accum`` micro-batches of the split MLP (no fault): the rings'
    view of each kept step, newest first, and this rank's weight slices before each step, oldest
    first."""
    net = tp_train.TPNet(rank, world, poison_rank=1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    cell = MonitoredTrainStep(net, opt, max_norm=tp_train.MAX_NORM, history_size=8,
                              shard_group=tp_train.GROUP, norm_strategy=strategy, forensics=TP_STEPS,
                              grad_accum_steps=accum)
    weights = []
    for i, (x, y) in enumerate(tp_batches(TP_STEPS * accum)):
        if i % accum == 0:
            weights.append({p.name: p.asnumpy().astype(float).tolist() for p in net.trainable_params()})
        cell(Tensor(x), Tensor(y), Tensor(np.float32(0.0)))
    return {"strategy": cell.gradmon_config()["norm_strategy"], "accum": accum, "weights_before": weights,
            "norms": cell.gradmon_read_history().column("grad_norm").tolist(),
            "forensics": [cell.gradmon_forensics(back) for back in range(TP_STEPS)]}


def main() -> None:
    from mindspore.communication import create_group

    out = sys.argv[1]
    rank, world = start_data_parallel()
    accumulated_alarm(out, rank, world)
    ms.reset_auto_parallel_context()
    create_group(tp_train.GROUP, list(range(world)))
    result = {"rank": rank, "world": world, "standalone": sharded_forensics(rank, world, "flat")}
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    result["data_parallel"] = sharded_forensics(rank, world, "auto", accum=ACCUM)
    ms.reset_auto_parallel_context()
    with open(os.path.join(out, f"tp.rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
