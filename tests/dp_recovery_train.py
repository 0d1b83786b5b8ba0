"""Data-parallel training under ``msrun`` with recovery on (driven by tests/test_recovery_dp.py): a user
rule fires on rank 1 only, and both ranks must roll back together.

Usage: ``msrun --worker_num=2 ... tests/dp_recovery_train.py RUN_DIR``
"""

from __future__ import annotations

import hashlib
import json
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
    run_dir = sys.argv[1]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    rank, world = get_rank(), get_group_size()
    rng = np.random.default_rng(0)
    x = rng.random((16 * 16 * world, 16), dtype=np.float32)
    y = rng.integers(0, 10, len(x)).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(16)
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
