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

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import Callback, Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.models import MLP
from gradmon.monitor.callback import LiveMonitor

BATCH, STEPS, IN_DIM, OUT_DIM = 8, 28, 32, 4
FAULT_STEP, FAULT_RANK, FAULT_POS = 24, 1, 5


def fault_id(world: int) -> int:
    """Global id of the poisoned sample: rank FAULT_RANK's FAULT_POS-th sample of step FAULT_STEP."""
    return world * ((FAULT_STEP - 1) * BATCH + FAULT_POS) + FAULT_RANK


def global_data(world: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = STEPS * BATCH * world
    x = rng.random((n, IN_DIM), dtype=np.float32)
    y = rng.standard_normal((n, OUT_DIM)).astype(np.float32)
    x[fault_id(world)] *= 1000.0
    return x, y


class SaveBeforeFault(Callback):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        if cb.cur_step_num == FAULT_STEP - 1:
            cell = cb.train_network
            np.savez(self.path, **{p.name: p.asnumpy() for p in cell.weights})


def main() -> None:
    out = sys.argv[1]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    rank, world = get_rank(), get_group_size()
    x, y = global_data(world)
    ids = np.arange(len(x), dtype=np.int32)
    mine = slice(rank, None, world)
    data = ds.NumpySlicesDataset({"x": x[mine], "y": y[mine], "index": ids[mine]}, shuffle=False)
    data = data.batch(BATCH, drop_remainder=True)
    net = MLP(in_dim=IN_DIM, hidden=16, classes=OUT_DIM)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), learning_rate=0.02)
    from gradmon.cells import MonitoredTrainStep

    cell = MonitoredTrainStep(loss_net, opt, max_norm=5.0, history_size=16, forensics=8, forensics_ids=BATCH)
    monitor = LiveMonitor(os.path.join(out, "metrics.jsonl"), log_interval=4, config={"world": world})
    save = SaveBeforeFault(os.path.join(out, "weights_before_fault.npz"))
    callbacks = [monitor] + ([save] if rank == 0 else [])
    Model(cell).train(1, data, callbacks=callbacks)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
