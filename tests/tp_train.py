"""Hand-written tensor parallelism on 2 ranks (driven by tests/test_cells_parallel_tp.py).

A small MLP, Megatron style: a replicated input layer, a column-split layer (each rank holds half
of the output columns), a row-split layer (each rank holds half of the input rows; the partial
outputs are summed by an all-reduce), a replicated head. The split weights are
``Parameter(layerwise_parallel=True)``; custom-bprop cells carry the communication (identity
forward / all-reduce backward before the column split, the reverse after the row split).

Under ``msrun`` each rank trains ``STEPS`` steps twice: in stand-alone mode with the explicit
communication, then inside ``DATA_PARALLEL``; it writes what its cell reported to
``OUT.rank<N>.json``. With ``--reference`` (no msrun) one process trains the unsharded model the
same way and writes ``OUT.reference.json``. Step 3 has large inputs (clipping engages), step 4
puts a NaN into rank 1's shard of the row-split gradient only (every rank must skip it).

Usage: ``msrun --worker_num=2 --local_worker_num=2 ... tests/tp_train.py OUT`` or
``python tests/tp_train.py OUT --reference``.
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

from gradmon.cells import MonitoredTrainStep, global_norm

D_IN, D_HID, D_WIDE, CLASSES, BATCH, STEPS = 16, 16, 32, 10, 8, 4
MAX_NORM = 5.0
GROUP = "tp"


def full_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = {"w_in": (D_IN, D_HID), "b_in": (D_HID,), "w_col": (D_HID, D_WIDE), "b_col": (D_WIDE,),
              "w_row": (D_WIDE, D_HID), "b_row": (D_HID,), "w_out": (D_HID, CLASSES), "b_out": (CLASSES,)}
    return {k: (rng.normal(0, 0.3, s)).astype(np.float32) for k, s in shapes.items()}


def batches() -> list[tuple[np.ndarray, np.ndarray, float]]:
    rng = np.random.default_rng(11)
    out = []
    for step in range(STEPS):
        x = rng.normal(size=(BATCH, D_IN)).astype(np.float32)
        if step == 2:
            x *= 40.0  # a large batch: the clip at MAX_NORM engages
        y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        out.append((x, y, float("nan") if step == 3 else 0.0))
    return out


class CopyToShards(nn.Cell):
    """Identity forward; the backward sums the input gradient over the shards."""

    def __init__(self, all_reduce) -> None:
        super().__init__()
        self.all_reduce = all_reduce

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class SumOverShards(nn.Cell):
    """All-reduce forward (the row-split partial outputs); identity backward."""

    def __init__(self, all_reduce) -> None:
        super().__init__()
        self.all_reduce = all_reduce

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class PoisonGrad(nn.Cell):
    """Identity on a weight; the backward adds ``poison`` to its gradient (a fault on one rank)."""

    def construct(self, w, poison):
        return w

    def bprop(self, w, poison, out, dout):
        return dout + poison, ops.zeros_like(poison)


class TPNet(nn.Cell):
    """The MLP with loss; ``rank``/``world`` pick this rank's slices (world 1: the unsharded model)."""

    def __init__(self, rank: int, world: int, poison_rank: int) -> None:
        super().__init__()
        w = full_weights()
        cols = slice(rank * D_WIDE // world, (rank + 1) * D_WIDE // world)
        sharded = world > 1

        def param(name: str, value: np.ndarray, split: bool = False) -> Parameter:
            return Parameter(Tensor(np.ascontiguousarray(value)), name=name,
                             layerwise_parallel=split and sharded)

        self.w_in, self.b_in = param("w_in", w["w_in"]), param("b_in", w["b_in"])
        self.w_col = param("w_col", w["w_col"][:, cols], split=True)
        self.b_col = param("b_col", w["b_col"][cols], split=True)
        self.w_row = param("w_row", w["w_row"][cols, :], split=True)
        self.b_row = param("b_row", w["b_row"])
        self.w_out, self.b_out = param("w_out", w["w_out"]), param("b_out", w["b_out"])
        if sharded:
            all_reduce = ops.AllReduce(ops.ReduceOp.SUM, GROUP)
            self.copy, self.reduce = CopyToShards(all_reduce), SumOverShards(all_reduce)
        else:
            self.copy, self.reduce = nn.Identity(), nn.Identity()
        self.poison = PoisonGrad()
        self.poison_here = rank == poison_rank or not sharded
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y, poison):
        h = ops.tanh(ops.matmul(x, self.w_in) + self.b_in)
        h = ops.relu(ops.matmul(self.copy(h), self.w_col) + self.b_col)
        w_row = self.poison(self.w_row, poison) if self.poison_here else self.w_row
        h = self.reduce(ops.matmul(h, w_row)) + self.b_row
        return self.loss(ops.matmul(h, self.w_out) + self.b_out, y)


def build(rank: int, world: int, strategy: str) -> tuple[TPNet, MonitoredTrainStep]:
    net = TPNet(rank, world, poison_rank=1)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    step = MonitoredTrainStep(net, opt, max_norm=MAX_NORM, history_size=8, local_norm=True, layer_stats=True,
                              shard_group=GROUP if world > 1 else None, norm_strategy=strategy)
    return net, step


def weights_of(net: TPNet) -> dict[str, list]:
    return {p.name: p.asnumpy().astype(float).tolist() for p in net.trainable_params()}


def train(rank: int, world: int, strategy: str) -> dict:
    net, step = build(rank, world, strategy)
    record: dict = {"config": {k: v for k, v in step.gradmon_config().items()
                               if k in ("parallel_mode", "device_num", "norm_strategy", "shard_group",
                                        "sharded_params")},
                    "norms": [], "weights": []}
    # The functional twin on the first batch's gradients, eagerly and under jit.
    x, y, _ = batches()[0]
    inputs = (Tensor(x), Tensor(y), Tensor(np.float32(0.0)))
    grads = ms.grad(net, grad_position=None, weights=net.trainable_params())(*inputs)
    mask = tuple(bool(p.layerwise_parallel) for p in net.trainable_params())
    group = GROUP if world > 1 else None
    sharded = mask if world > 1 else None

    @ms.jit
    def jit_norm(g):
        return global_norm(g, group, sharded)

    record["functional"] = float(global_norm(grads, group, sharded).asnumpy())
    record["functional_jit"] = float(jit_norm(grads).asnumpy())
    for x, y, poison in batches():
        _, norm = step(Tensor(x), Tensor(y), Tensor(np.float32(poison)))
        record["norms"].append(float(norm.asnumpy()))
        record["weights"].append(weights_of(net))
    snap = step.gradmon_read_history()
    for name in ("grad_norm", "clip_coef", "clipped", "skipped", "nonfinite", "grad_norm_local"):
        record[name] = snap.column(name).tolist()
    record["layers"] = {r["name"]: r["grad_norm"] for r in step.gradmon_layer_stats(top_k=None)}
    return record


def refusals() -> dict[str, str]:
    """The messages of configurations that must be refused (communication is initialised here)."""
    out = {}
    for name, kwargs in (("data_parallel_no_group", {"parallel_mode": ms.ParallelMode.DATA_PARALLEL}),
                         ("hybrid_parallel", {"parallel_mode": ms.ParallelMode.HYBRID_PARALLEL})):
        ms.set_auto_parallel_context(gradients_mean=True, **kwargs)
        net = TPNet(0, 2, poison_rank=1)
        try:
            MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1))
            out[name] = "NOT REFUSED"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
        ms.reset_auto_parallel_context()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    if args.reference:
        result = {"standalone": train(0, 1, "flat")}
        name = f"{args.out}.reference.json"
    else:
        from mindspore.communication import create_group, get_group_size, get_rank, init

        init()
        rank, world = get_rank(), get_group_size()
        create_group(GROUP, list(range(world)))
        # The flat form stand-alone, what "auto" picks (the fused kernel where built) in data parallel.
        result = {"rank": rank, "world": world, "standalone": train(rank, world, "flat")}
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        result["data_parallel"] = train(rank, world, "auto")
        ms.reset_auto_parallel_context()
        result["refused"] = refusals()
        name = f"{args.out}.rank{rank}.json"
    with open(name, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    print(f"wrote {name}", flush=True)


if __name__ == "__main__":
    main()
