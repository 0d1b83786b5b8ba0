"""Data-parallel training under ``msrun`` with a LiveMonitor (driven by tests/test_callback_dp.py).

Usage: ``msrun --worker_num=2 ... tests/dp_monitor_train.py GLOBAL_LOG PER_RANK_LOG``: the job trains
twice (one msrun start for both cases), logging first to GLOBAL_LOG from rank 0 only, then to
PER_RANK_LOG with ``per_rank=True`` (rank 0's global file plus one file per rank).
"""

from __future__ import annotations

import os
import sys

from mindspore import nn
from mindspore.train import Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.models import MLP, with_loss
from gradmon.monitor.callback import LiveMonitor
from tests.dp_util import classification_data, shard_dataset, start_data_parallel


def train(log_file: str, per_rank: bool, rank: int, world: int) -> None:
    from gradmon.cells import MonitoredTrainStep

    x, y = classification_data(8 * 16 * world)
    data = shard_dataset(x, y, rank, world, batch=16)
    net = MLP(in_dim=16, hidden=32)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    model = Model(MonitoredTrainStep(with_loss(net), opt, history_size=16))
    monitor = LiveMonitor(log_file, log_interval=2, per_rank=per_rank, config={"world": world})
    model.train(1, data, callbacks=[monitor])


def main() -> None:
    global_log, per_rank_log = sys.argv[1:3]
    rank, world = start_data_parallel()
    train(global_log, False, rank, world)
    train(per_rank_log, True, rank, world)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
