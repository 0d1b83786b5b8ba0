"""Data-parallel training under ``msrun`` with a LiveMonitor (driven by tests/test_callback_dp.py).

Usage: ``msrun --worker_num=2 ... tests/dp_monitor_train.py LOG_FILE [--per-rank]``
"""

from __future__ import annotations

import os
import sys

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.models import MLP, with_loss
from gradmon.monitor.callback import LiveMonitor


def main() -> None:
    log_file = sys.argv[1]
    per_rank = "--per-rank" in sys.argv[2:]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    rank, world = get_rank(), get_group_size()
    rng = np.random.default_rng(0)
    x = rng.random((8 * 16 * world, 16), dtype=np.float32)
    y = rng.integers(0, 10, len(x)).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(16)
    net = MLP(in_dim=16, hidden=32)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    from gradmon.cells import MonitoredTrainStep

    model = Model(MonitoredTrainStep(with_loss(net), opt, history_size=16))
    monitor = LiveMonitor(log_file, log_interval=2, per_rank=per_rank, config={"world": world})
    model.train(1, data, callbacks=[monitor])
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
