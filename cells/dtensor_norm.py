"""The global norm of gradients laid out as HyperParallel DTensors: runs a :class:`DTensorLayout`.

Per bucket of the layout (:attr:`DTensorLayout.buckets`, a constant schedule): the gradients that
share their reductions are concatenated into one float32 vector; where they are partial sums it is
all-reduced over those mesh groups (``avg`` then divided by the group size) before squaring; its sum
of squares is added to the others with the same sharded groups, and that scalar is all-reduced over
each of them (mesh dims are orthogonal, so one all-reduce per dim sums over their product). The
result is the same on every rank: the norm of the whole, unsharded gradient. The gradients themselves
are not changed (the partial sums are reduced in a float32 copy, for the norm only).

Works eagerly (PYNATIVE, where gradients may also be DTensors: their local tensors are read) and under
``@mindspore.jit`` (the schedule is made of Python constants, unrolled when traced).
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

from .dtensor_layout import DTensorLayout, is_dtensor

__all__ = ["dtensor_square_sum", "local_tensors"]


def local_tensors(grads: Any) -> tuple:
    """``grads`` with each DTensor replaced by its local tensor (``to_local()``); others as they are."""
    return tuple(g.to_local() if is_dtensor(g) and callable(getattr(g, "to_local", None)) else g
                 for g in grads)


def _flat(grads: Any, indices: tuple) -> Tensor:
    parts = [ops.reshape(ops.cast(grads[i], ms.float32), (-1,)) for i in indices]
    return parts[0] if len(parts) == 1 else ops.concat(parts)


def dtensor_square_sum(grads: Any, layout: DTensorLayout) -> Tensor:
    """The global sum of squares (float32 scalar) of local gradients ``grads`` under ``layout``."""
    total = None
    for over, inner in layout.buckets:
        local = None
        for before, indices in inner:
            flat = _flat(grads, indices)
            for group, op, size in before:
                flat = ops.AllReduce(ops.ReduceOp.SUM, group)(flat)
                if op == "avg":
                    flat = flat / size
            sq = ops.reduce_sum(ops.square(flat))
            local = sq if local is None else local + sq
        for group in over:
            local = ops.AllReduce(ops.ReduceOp.SUM, group)(ops.reshape(local, (1,))).reshape(())
        total = local if total is None else total + local
    return total
