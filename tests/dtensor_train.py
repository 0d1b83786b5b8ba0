"""DTensor-laid-out gradients on 2 ranks (driven by tests/test_cells_dtensor.py), one msrun job.

Each rank holds stand-in DTensor parameters (real MindSpore Parameters with the local shard, and
``placements``/``device_mesh`` attached, tests/dtensor_standins.py) in two layouts, and reports what
``global_norm``/``clip_by_global_norm`` give with ``layout=DTensorLayout.from_params(...)``, eagerly
and under ``@ms.jit``, next to the per-rank norm without it. Real gradients (MindSpore backward, PyNative)
and real collectives (``ops.AllReduce`` over groups made with ``create_group``):

- ``tp``: tensor parallel as HyperParallel's ``shard_module`` leaves it, on a 1-dim mesh ``tp`` of 2:
  a replicated input layer (R), a column-split layer (weight Shard(1), bias Shard(0)), a row-split
  layer (weight Shard(0)) whose partial outputs are all-reduced, a replicated head. Like
  HyperParallel, each rank seeds its copy of the (replicated) loss with ``1/world`` and the forward
  all-reduce's backward all-reduces, so the split weights' gradients are exact and the replicated
  ones come back as per-rank partial sums (``replicate_grads="partial"``).
- ``fsdp``: every parameter Shard(0) on a 1-dim mesh ``dp`` of 2. Each rank runs the whole model
  (the gathered weights) on its half of the batch; the gradients are summed over the ranks, scaled
  by ``GRAD_SCALE`` (0.5, hsdp's ``grad_scale``; without it they are summed) and each rank keeps its
  dim-0 shard (a reduce-scatter, done as all-reduce + slice).
- ``hsdp``: the same gradients, the parameters plain as ``hyper_parallel.hsdp`` leaves them (sliced on
  dim 0, ``hsdp_effective_shard_size``), the group read from a stand-in hsdp cell (``network=``).

The reference is the same model unsharded in float64 numpy on the whole batch. Writes
``OUT.rank<N>.json``. Usage: ``msrun --worker_num=2 --local_worker_num=2 ... tests/dtensor_train.py OUT``.
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

from gradmon.cells import DTensorLayout, clip_by_global_norm, global_norm

from tests.dtensor_standins import HsdpCell, Mesh, Replicate, Shard, dtensor_param

D_IN, D_HID, D_WIDE, CLASSES, BATCH = 16, 16, 32, 10, 8
MAX_NORM = 5.0
GRAD_SCALE = 0.5
NAMES = ("w_in", "b_in", "w_col", "b_col", "w_row", "b_row", "w_out", "b_out")
TP_PLACEMENTS = {"w_in": Replicate(), "b_in": Replicate(), "w_col": Shard(1), "b_col": Shard(0),
                 "w_row": Shard(0), "b_row": Replicate(), "w_out": Replicate(), "b_out": Replicate()}


def full_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = {"w_in": (D_IN, D_HID), "b_in": (D_HID,), "w_col": (D_HID, D_WIDE), "b_col": (D_WIDE,),
              "w_row": (D_WIDE, D_HID), "b_row": (D_HID,), "w_out": (D_HID, CLASSES), "b_out": (CLASSES,)}
    return {k: rng.normal(0, 0.3, shapes[k]).astype(np.float32) for k in NAMES}


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """Three batches; the third is large (the clip at MAX_NORM engages)."""
    rng = np.random.default_rng(11)
    out = []
    for step in range(3):
        x = rng.normal(size=(BATCH, D_IN)).astype(np.float32)
        out.append((x * (10.0 if step == 2 else 1.0), rng.integers(0, CLASSES, BATCH).astype(np.int32)))
    return out


def unsharded_norms() -> list[float]:
    """The unsharded model's gradient norm per batch: MindSpore float32 gradients, summed in float64."""
    full = {k: Parameter(Tensor(v), name=k) for k, v in full_weights().items()}
    net = MLP(full, nn.Identity(), 1.0)
    norms = []
    for x, y in batches():
        grads = ms.grad(net, grad_position=None, weights=[full[k] for k in NAMES])(Tensor(x), Tensor(y))
        norms.append(float(np.sqrt(sum((g.asnumpy().astype(np.float64) ** 2).sum() for g in grads))))
    return norms


def reference_norms() -> list[float]:
    """The unsharded model's gradient norm per batch in float64 numpy (backprop written out: an
    implementation independent of MindSpore's)."""
    w = {k: v.astype(np.float64) for k, v in full_weights().items()}
    norms = []
    for x, y in batches():
        x = x.astype(np.float64)
        z0 = x @ w["w_in"] + w["b_in"]
        h0 = np.maximum(z0, 0)
        z1 = h0 @ w["w_col"] + w["b_col"]
        a1 = np.maximum(z1, 0)
        h2 = a1 @ w["w_row"] + w["b_row"]
        logits = h2 @ w["w_out"] + w["b_out"]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dlogits = (p - np.eye(CLASSES)[y]) / len(y)  # mean cross-entropy
        dh2 = dlogits @ w["w_out"].T
        dz1 = (dh2 @ w["w_row"].T) * (z1 > 0)
        dz0 = (dz1 @ w["w_col"].T) * (z0 > 0)
        grads = [x.T @ dz0, dz0.sum(0), h0.T @ dz1, dz1.sum(0), a1.T @ dh2, dh2.sum(0), h2.T @ dlogits,
                 dlogits.sum(0)]
        norms.append(float(np.sqrt(sum((g ** 2).sum() for g in grads))))
    return norms


class SumOverShards(nn.Cell):
    """All-reduce forward (the row-split partial outputs); all-reduce backward, as HyperParallel's
    Partial -> Replicate redistribution does under a loss seeded 1/world on every rank."""

    def __init__(self, group: str) -> None:
        super().__init__()
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, group)

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class MLP(nn.Cell):
    """The model; ``weights`` are this rank's (local shards for tp); ``reduce`` joins the row split."""

    def __init__(self, weights: dict[str, Parameter], reduce: nn.Cell, loss_weight: float) -> None:
        super().__init__()
        for k in NAMES:
            setattr(self, k, weights[k])
        self.reduce = reduce
        self.loss_weight = loss_weight
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y):
        h = ops.relu(ops.matmul(x, self.w_in) + self.b_in)
        h = ops.relu(ops.matmul(h, self.w_col) + self.b_col)
        h = self.reduce(ops.matmul(h, self.w_row)) + self.b_row
        return self.loss(ops.matmul(h, self.w_out) + self.b_out, y) * self.loss_weight


def tp_layout(rank: int, world: int) -> tuple[list[Parameter], MLP]:
    full = full_weights()
    cols = slice(rank * D_WIDE // world, (rank + 1) * D_WIDE // world)
    local = {"w_col": full["w_col"][:, cols], "b_col": full["b_col"][cols], "w_row": full["w_row"][cols, :]}
    mesh = Mesh((world,), ("tp",), ["tp"])
    params = [dtensor_param(local.get(k, full[k]), k, (TP_PLACEMENTS[k],), mesh) for k in NAMES]
    return params, MLP(dict(zip(NAMES, params)), SumOverShards("tp"), 1.0 / world)


def fsdp_layouts(rank: int, world: int) -> dict[str, tuple[list[Parameter], DTensorLayout]]:
    """The dim-0-sharded parameters: with Shard(0) placements (``fsdp``), and plain as
    ``hyper_parallel.hsdp`` leaves them (``hsdp``: sliced, the group on hsdp's state)."""
    full = full_weights()
    mesh = Mesh((world,), ("dp",), ["dp"])
    shards = {k: full[k][rank * (full[k].shape[0] // world):(rank + 1) * (full[k].shape[0] // world)]
              for k in NAMES}
    fsdp = [dtensor_param(shards[k], k, (Shard(0),), mesh) for k in NAMES]
    hsdp = [dtensor_param(shards[k], k, None, None) for k in NAMES]
    cell = HsdpCell(hsdp, dict.fromkeys(NAMES, (world, "dp")))
    return {"fsdp": (fsdp, DTensorLayout.from_params(fsdp)),
            "hsdp": (hsdp, DTensorLayout.from_params(hsdp, network=cell))}


def fsdp_grads(rank: int, world: int, x: np.ndarray, y: np.ndarray) -> tuple:
    """This rank's gradient shards for one batch (summed over the ranks, scaled by GRAD_SCALE)."""
    full = full_weights()
    gathered = {k: Parameter(Tensor(full[k]), name=f"full_{k}") for k in NAMES}  # what FSDP all-gathers
    net = MLP(gathered, nn.Identity(), 1.0)
    half = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    grads = ms.grad(net, grad_position=None, weights=[gathered[k] for k in NAMES])(Tensor(x[half]),
                                                                                   Tensor(y[half]))
    reduce = ops.AllReduce(ops.ReduceOp.SUM, "dp")
    shards = []
    for g in grads:
        summed = reduce(g) * GRAD_SCALE
        rows = summed.shape[0] // world
        shards.append(summed[rank * rows:(rank + 1) * rows])
    return tuple(shards)


def measure(params: list[Parameter], grads: tuple, layout: DTensorLayout) -> dict:
    @ms.jit
    def jit_norm(g):
        return global_norm(g, layout=layout)

    clipped, norm = clip_by_global_norm(grads, MAX_NORM, layout=layout)
    return {"naive": float(global_norm(grads).asnumpy()),
            "norm": float(global_norm(grads, layout=layout).asnumpy()),
            "norm_jit": float(jit_norm(grads).asnumpy()),
            "clip_norm": float(norm.asnumpy()),
            "clipped_norm": float(global_norm(clipped, layout=layout).asnumpy())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from mindspore.communication import create_group, get_group_size, get_rank, init

    init()
    rank, world = get_rank(), get_group_size()
    create_group("tp", list(range(world)))
    create_group("dp", list(range(world)))
    result: dict = {"rank": rank, "world": world, "reference": reference_norms(),
                    "unsharded_f32": unsharded_norms(), "tp": []}

    params, net = tp_layout(rank, world)
    tp = DTensorLayout.from_params(params, replicate_grads="partial")
    result["tp_config"] = tp.as_config()
    for x, y in batches():
        grads = ms.grad(net, grad_position=None, weights=params)(Tensor(x), Tensor(y))
        result["tp"].append(measure(params, grads, tp))
    layouts = fsdp_layouts(rank, world)
    for kind, (_, layout) in layouts.items():
        result[f"{kind}_config"] = layout.as_config()
        result[kind] = []
    for x, y in batches():
        grads = fsdp_grads(rank, world, x, y)
        for kind, (params, layout) in layouts.items():
            result[kind].append(measure(params, grads, layout))
    with open(f"{args.out}.rank{rank}.json", "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    for kind in ("tp", "fsdp", "hsdp"):
        for step, (ref, got) in enumerate(zip(result["reference"], result[kind])):
            print(f"rank {rank} {kind} step {step}: reference {ref:.6f} dtensor {got['norm']:.6f} "
                  f"jit {got['norm_jit']:.6f} per-rank (no layout) {got['naive']:.6f}", flush=True)


if __name__ == "__main__":
    main()
