"""Data-parallel training with one poisoned sample, for the forensics test (tests/test_forensics_dp.py).

Usage: ``msrun --worker_num=2 ... tests/dp_forensics_train.py OUT_DIR``

Rank ``r`` trains on the global rows ``r, r + world, ...`` (its own slice, no sampler), with an
``index`` column of their global ids. At step ``FAULT_STEP`` one sample of rank ``FAULT_RANK``'s
micro-batch has its inputs multiplied by 1000. Rank 0 writes OUT_DIR/metrics.jsonl and, before the
faulty step, the weights (OUT_DIR/weights_before_fault.npz) for the test's reference.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mindspore import nn
from mindspore.train import Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.models import MLP
from gradmon.monitor.callback import LiveMonitor
from tests.dp_util import SaveWeightsAt, indexed_rank_dataset, poisoned_regression_data, start_data_parallel

BATCH, STEPS, IN_DIM, OUT_DIM = 8, 28, 32, 4
FAULT_STEP, FAULT_RANK, FAULT_POS = 24, 1, 5


def fault_id(world: int) -> int:
    """Global id of the poisoned sample: rank FAULT_RANK's FAULT_POS-th sample of step FAULT_STEP."""
    return world * ((FAULT_STEP - 1) * BATCH + FAULT_POS) + FAULT_RANK


def global_data(world: int) -> tuple[np.ndarray, np.ndarray]:
    return poisoned_regression_data(STEPS * BATCH * world, IN_DIM, OUT_DIM, fault_id(world))


def main() -> None:
    out = sys.argv[1]
    rank, world = start_data_parallel()
    x, y = global_data(world)
    data = indexed_rank_dataset(x, y, rank, world, BATCH)
    net = MLP(in_dim=IN_DIM, hidden=16, classes=OUT_DIM)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), learning_rate=0.02)
    from gradmon.cells import MonitoredTrainStep

    cell = MonitoredTrainStep(loss_net, opt, max_norm=5.0, history_size=16, forensics=8, forensics_ids=BATCH)
    monitor = LiveMonitor(os.path.join(out, "metrics.jsonl"), log_interval=4, config={"world": world})
    save = SaveWeightsAt(os.path.join(out, "weights_before_fault.npz"), FAULT_STEP - 1)
    callbacks = [monitor] + ([save] if rank == 0 else [])
    Model(cell).train(1, data, callbacks=callbacks)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
