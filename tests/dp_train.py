"""Data-parallel training of a MonitoredTrainStep (driven by tests/test_cells_dp.py).

Under ``msrun`` every rank trains ``--steps`` steps on its own shard of each global batch and
writes what its cell reported to ``OUT.rank<N>.json``. With ``--reference`` (no msrun) one
process trains the same steps on the full global batches and writes ``OUT.reference.json``:
with mean-reduced gradients the two must agree.

Usage: ``msrun --worker_num=2 --local_worker_num=2 ... tests/dp_train.py OUT [--steps N]
[--log-dir DIR] [--accum N]`` or ``python tests/dp_train.py OUT --reference``. ``--accum N``:
each step is N micro-batches (``grad_accum_steps=N``); the norms are those of the optimizer steps.
``--log-dir`` attaches ``gradmon.monitor.callback.LiveMonitor`` (writing ``DIR/metrics.jsonl``) when it
is importable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradmon.cells import MonitoredTrainStep
from gradmon.cells.spike import norm_state_size

from examples.models import MLP, with_loss
from tests.dp_util import start_data_parallel

GLOBAL_BATCH = 16


def global_batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1234)
    x = rng.random((steps, GLOBAL_BATCH, 16), dtype=np.float32)
    x[steps - 1] *= 30.0  # a large last batch: the clip at max_norm must engage identically everywhere
    y = rng.integers(0, 10, (steps, GLOBAL_BATCH)).astype(np.int32)
    return [(x[i], y[i]) for i in range(steps)]


def build(accum: int = 1) -> MonitoredTrainStep:
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=32)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    options = {"grad_accum_steps": accum} if accum > 1 else {}
    return MonitoredTrainStep(with_loss(net), opt, max_norm=2.0, history_size=8, local_norm=True, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--accum", type=int, default=1)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    rank, world = 0, 1
    if not args.reference:
        rank, world = start_data_parallel()
    step = build(args.accum)
    monitor = None
    if args.log_dir:
        try:
            from gradmon.monitor.callback import LiveMonitor
        except ImportError:
            LiveMonitor = None
        if LiveMonitor is not None:
            monitor = LiveMonitor(os.path.join(args.log_dir, "metrics.jsonl"), log_interval=2).attach(step)
    shard = GLOBAL_BATCH // world
    norms, losses = [], []
    for i, (x, y) in enumerate(global_batches(args.steps * args.accum)):
        xs, ys = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        loss, norm = step(Tensor(xs), Tensor(ys))
        if (i + 1) % args.accum:
            continue  # a micro-step: no norm yet
        norms.append(float(norm.asnumpy()))
        losses.append(float(loss.asnumpy()))
        if monitor is not None:
            monitor.after_step((loss, norm))
    if monitor is not None:
        monitor.close()
    snap = step.gradmon_read_history()
    # The detector's loss test judges the ranks' mean loss: the same ring on every rank.
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=32)
    spiker = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), 0.05), spike_mode="detect",
                                history_size=8)
    for x, y in global_batches(args.steps):
        spiker(Tensor(x[rank * shard:(rank + 1) * shard]), Tensor(y[rank * shard:(rank + 1) * shard]))
    detector_state = spiker.spike_state.asnumpy()
    loss_ring_start = norm_state_size(spiker.spike.early_window) + 2  # after [loss_count, loss_scale]
    result = {
        "loss_ring": detector_state[loss_ring_start:loss_ring_start + 16][:args.steps].astype(float).tolist(),
        "rank_losses": spiker.gradmon_read_history().column("loss").tolist(),
        "rank": rank,
        "world": world,
        "norms": norms,
        "losses": losses,
        "history_norms": snap.column("grad_norm").tolist(),
        "local_norms": snap.column("grad_norm_local").tolist(),
        "clipped": snap.column("clipped").tolist(),
        "weights": [p.asnumpy().astype(float).ravel()[:8].tolist() for p in step.network.trainable_params()],
    }
    name = f"{args.out}.reference.json" if args.reference else f"{args.out}.rank{rank}.json"
    with open(name, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    print(f"rank {rank}/{world} wrote {name}", flush=True)


if __name__ == "__main__":
    main()
