"""Data-parallel training under ``msrun`` with a LiveMonitor (driven by tests/test_callback_dp.py).

Usage: ``msrun --worker_num=2 ... tests/dp_monitor_train.py LOG_FILE [--per-rank]``
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


def main() -> None:
    log_file = sys.argv[1]
    per_rank = "--per-rank" in sys.argv[2:]
    rank, world = start_data_parallel()
    x, y = classification_data(8 * 16 * world)
    data = shard_dataset(x, y, rank, world, batch=16)
    net = MLP(in_dim=16, hidden=32)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    from gradmon.cells import MonitoredTrainStep

    model = Model(MonitoredTrainStep(with_loss(net), opt, history_size=16))
    monitor = LiveMonitor(log_file, log_interval=2, per_rank=per_rank, config={"world": world})
    model.train(1, data, callbacks=[monitor])
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
