"""Data-parallel training under ``msrun`` with recovery on (driven by tests/test_recovery_dp.py): a user
rule fires on rank 1 only, and both ranks must roll back together.

Usage: ``msrun --worker_num=2 ... tests/dp_recovery_train.py RUN_DIR``
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from mindspore import nn
from mindspore.train import Model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.models import MLP, with_loss
from gradmon.monitor.callback import LiveMonitor
from tests.dp_util import classification_data, shard_dataset, start_data_parallel


def main() -> None:
    run_dir = sys.argv[1]
    rank, world = start_data_parallel()
    x, y = classification_data(16 * 16 * world)
    data = shard_dataset(x, y, rank, world, batch=16)
    net = MLP(in_dim=16, hidden=32)
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    from gradmon.cells import MonitoredTrainStep

    fired = []

    def rank1_rule(record):
        # Only rank 1 sees it (its own loss, say), once: every rank must still roll back.
        if rank == 1 and record["step"] == 12 and not fired:
            fired.append(record["step"])
            return "rank 1's rule"
        return None

    model = Model(MonitoredTrainStep(with_loss(net), opt, max_norm=1.0, history_size=16))
    monitor = LiveMonitor(os.path.join(run_dir, "metrics.jsonl"), log_interval=3, per_rank=True,
                          recovery={"every": 5, "skip_batches": 1, "rule": rank1_rule})
    model.train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    digest = hashlib.sha256(b"".join(p.asnumpy().tobytes() for p in net.trainable_params())).hexdigest()
    with open(os.path.join(run_dir, f"result.rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "rollbacks": monitor.rollbacks, "step": monitor.step, "weights": digest}, f)
    print(f"rank {rank}/{world} done", flush=True)


if __name__ == "__main__":
    main()
