"""semi_auto_parallel with a MonitoredTrainStep on a GPU/Ascend machine (see test_cells_parallel_semi.py).

MindSpore runs semi_auto/auto parallel on Ascend and GPU only (on CPU it stops at compile with
"Invalid communication backend: CPU"), so this script is for a device machine; it runs unchanged:

    msrun --worker_num=N --local_worker_num=N tests/semi_auto_train.py OUT --config tensor
    python tests/semi_auto_train.py OUT --reference          # one device, stand-alone

``--config``: ``tensor`` (matmuls split by ``shard()`` strategies over all N devices),
``optimizer`` (the same plus ``enable_parallel_optimizer``), ``pipeline`` (two stages, the
embedding tied to the output layer across them; N must be even). Every rank feeds the full batch
(``full_batch=True``), so every configuration must report the reference's norm on every rank.
Writes ``OUT.<config>.rank<N>.json`` / ``OUT.reference.json``: norms, clip coefficients and the
cell's config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradmon.cells import MonitoredTrainStep

D_IN, D_HID, D_WIDE, BATCH, STEPS, MAX_NORM, MICRO_BATCHES = 16, 16, 64, 16, 4, 2.0, 2


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    shapes = {"embed": (D_IN, D_HID), "w_col": (D_HID, D_WIDE), "w_row": (D_WIDE, D_HID), "bias": (D_HID,)}
    return {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}


class First(nn.Cell):
    """Stage 0: the embedding and the column-split matmul."""

    def __init__(self, embed: Parameter, w_col: Parameter, split: int) -> None:
        super().__init__()
        self.embed, self.w_col = embed, w_col
        self.mm_in = ops.MatMul()
        self.mm_col = ops.MatMul().shard(((1, 1), (1, split))) if split > 1 else ops.MatMul()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.relu(self.mm_col(self.mm_in(x, self.embed), self.w_col))


class Second(nn.Cell):
    """Stage 1: the row-split matmul and the output projection tied to the embedding, then the loss."""

    def __init__(self, embed: Parameter, w_row: Parameter, bias: Parameter, split: int) -> None:
        super().__init__()
        self.embed, self.w_row, self.bias = embed, w_row, bias  # embed: the same Parameter as stage 0's
        self.mm_row = ops.MatMul().shard(((1, split), (split, 1))) if split > 1 else ops.MatMul()
        self.mm_out = ops.MatMul(transpose_b=True)
        self.loss = nn.MSELoss()

    def construct(self, h, y):
        return self.loss(self.mm_out(self.mm_row(h, self.w_row) + self.bias, self.embed), y)


class Net(nn.Cell):
    def __init__(self, devices: int, pipeline: bool) -> None:
        super().__init__()
        w = _weights()
        params = {k: Parameter(Tensor(v), name=k) for k, v in w.items()}
        split = devices // 2 if pipeline else devices  # devices per stage
        self.first = First(params["embed"], params["w_col"], split)
        self.second = Second(params["embed"], params["w_row"], params["bias"], split)
        if pipeline:
            self.first.pipeline_stage = 0
            self.second.pipeline_stage = 1

    def construct(self, x, y):
        return self.second(self.first(x), y)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(9)
    out = []
    for step in range(STEPS):
        x = rng.normal(size=(BATCH, D_IN)).astype(np.float32) * (10.0 if step == 2 else 1.0)
        out.append((x, rng.normal(size=(BATCH, D_IN)).astype(np.float32)))
    return out


def run(config: str | None, devices: int) -> dict:
    pipeline = config == "pipeline"
    net = Net(devices, pipeline)
    network: nn.Cell = net
    if pipeline:
        # Stage 0 owns the embedding; the output projection on stage 1 uses it again (tied).
        network = nn.PipelineCell(net, MICRO_BATCHES)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    step = MonitoredTrainStep(network, opt, max_norm=MAX_NORM, history_size=8)
    record = {"config": step.gradmon_config(), "norms": []}
    for x, y in batches():
        _, norm = step(Tensor(x), Tensor(y))
        record["norms"].append(float(norm.asnumpy()))
    snap = step.gradmon_read_history()
    record["clip_coef"] = snap.column("clip_coef").tolist()
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--config", choices=["tensor", "optimizer", "pipeline"], default="tensor")
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    if args.reference:
        result = run(None, 1)
        name = f"{args.out}.reference.json"
    else:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, devices = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True,
                                     enable_parallel_optimizer=args.config == "optimizer",
                                     pipeline_stages=2 if args.config == "pipeline" else 1)
        result = {"rank": rank, "devices": devices, **run(args.config, devices)}
        name = f"{args.out}.{args.config}.rank{rank}.json"
    with open(name, "w", encoding="utf-8") as fh:
        json.dump(result, fh, default=str)
    print(f"wrote {name}", flush=True)


if __name__ == "__main__":
    main()
