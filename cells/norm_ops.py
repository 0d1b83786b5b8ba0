"""Graph-safe global gradient norm and clipping.

Both functions work eagerly (PYNATIVE), inside ``@mindspore.jit`` and inside a ``Cell.construct``
compiled in GRAPH mode. They avoid per-tensor reductions on purpose: on MindSpore's kernel-by-kernel
backends each op is a launch (tens of microseconds on CPU), so the norm is one concatenation of
flat views, one square and one sum — three kernels however many tensors — instead of two per tensor.
Under semi_auto/auto parallel they switch to the per-tensor ``grad_scale`` form the parallel
compiler completes (see :mod:`gradmon.cells.norm_strategies`); hand-sharded tensors are named
with ``shard_group`` and ``sharded``; HyperParallel DTensor parameters with ``layout=``
(:class:`gradmon.cells.DTensorLayout`) or ``params=``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

from .dtensor_layout import DTensorLayout, is_dtensor
from .dtensor_norm import dtensor_square_sum, local_tensors
from .norm_plan import plan_groups
from .norm_strategies import (
    REPLICATED,
    SHARDED,
    bucketed_square_sums,
    flat_fp32,
    flat_square_sum,
    grad_scale_square_sums,
    scale_grads,
    segment_ids_for,
)
from .parallel import COMPILER_MODES

__all__ = ["clip_by_global_norm", "clip_coefficient", "flat_fp32", "global_norm", "scale_grads",
           "segment_ids_for", "squared_norms", "unscaled_global_norm"]

CLIP_EPS = 1e-6  # same guard as torch.nn.utils.clip_grad_norm_


@ops.constexpr
def _compiler_completes() -> bool:
    # Read when the function is traced (a constant in GRAPH mode), like the cells read it when built.
    return str(ms.get_auto_parallel_context("parallel_mode")) in COMPILER_MODES


@ops.constexpr
def _shard_plan(shapes: tuple, sharded: tuple) -> tuple:
    # Concatenated runs of replicated / sharded tensors (a constant plan, built when traced).
    sizes = [int(math.prod(s)) for s in shapes]
    return plan_groups(sizes, max(1, sum(sizes)), False, [SHARDED if s else REPLICATED for s in sharded])


def _check_shard_args(count: int, shard_group: Any, sharded: Any) -> None:
    if shard_group is None and sharded is None:
        return
    if shard_group is None:
        raise ValueError("sharded= marks hand-sharded tensors, which need shard_group='<the communication "
                         "group they are split across>' to be all-reduced")
    if not isinstance(shard_group, str) or not shard_group:
        raise TypeError(f"shard_group must be a communication group name (str), got {shard_group!r}")
    if sharded is None:
        raise ValueError(f"shard_group={shard_group!r} needs sharded=(True/False per tensor) saying which "
                         "tensors are split across the group")
    if len(sharded) != count:
        raise ValueError(f"sharded has {len(sharded)} entries for {count} tensors")
    if not any(sharded):
        raise ValueError(f"shard_group={shard_group!r} is given but sharded marks no tensor")


def _layout_for(grads: Any, layout: DTensorLayout | None, params: Sequence[Any] | None,
                shard_group: Any) -> DTensorLayout | None:
    count = len(grads)
    if params is not None:
        if layout is not None:
            raise ValueError("pass layout= or params=, not both (params= builds the layout each call)")
        layout = DTensorLayout.from_params(params)
    if layout is None:
        if shard_group is None and any(is_dtensor(g) for g in grads):
            # DTensor gradients carry their own layout: never a silent per-rank norm.
            return DTensorLayout.from_params(grads)
        return None
    if not isinstance(layout, DTensorLayout):
        raise TypeError(f"layout must be a DTensorLayout (DTensorLayout.from_params(params)), got "
                        f"{type(layout).__name__}")
    if shard_group is not None:
        raise ValueError("shard_group/sharded are for layerwise_parallel parameters; a DTensorLayout "
                         "already names every parameter's mesh groups")
    if len(layout.plans) != count:
        raise ValueError(f"the layout has {len(layout.plans)} parameters for {count} gradients (build it "
                         "from the parameters the gradients are of, in the same order)")
    return layout


def global_norm(grads: Any, shard_group: str | None = None, sharded: Sequence[bool] | None = None, *,
                layout: DTensorLayout | None = None, params: Sequence[Any] | None = None) -> Tensor:
    """L2 norm over every element of a tuple/list of tensors, as a float32 scalar tensor.

    Equals ``sqrt(sum_i sum(g_i ** 2))`` computed in float32. Non-finite inputs give a non-finite
    norm. (A sum of squares beyond float32 range, i.e. norms above ~1.8e19, also reads as ``inf``.)

    Hand-sharded tensors (each rank holds a slice, e.g. Megatron-style tensor parallel): pass
    ``shard_group`` (the communication group they are split across) and ``sharded`` (one bool per
    tensor, a constant). Their squares are all-reduced over the group and added to the other
    tensors' squares, which count once (they are the same on every rank of the group): every rank
    gets the norm of the whole, unsharded gradients. Under semi_auto/auto parallel the per-tensor
    ``grad_scale`` form is used, which the parallel compiler completes.

    HyperParallel DTensor parameters (``shard_module``, FSDP placements): pass ``layout`` (a
    :class:`~gradmon.cells.DTensorLayout` built once from the parameters, the form for a training
    loop and for ``@mindspore.jit``) or ``params`` (the parameters, in the gradients' order; the
    layout is read on each call and it refuses replicated mesh dims, which need
    ``DTensorLayout.from_params(params, replicate_grads=...)``). Each gradient's local sum of squares is
    then all-reduced over the mesh groups of the dims it is sharded on, partial sums are summed before
    squaring, and every rank gets the norm of the whole gradients (:mod:`gradmon.cells.dtensor_norm`).
    DTensor gradients are read through their local tensors; given without ``layout``/``params``,
    their own placements are the layout.
    """
    if len(grads) == 0:
        raise ValueError("global_norm needs at least one tensor")
    layout = _layout_for(grads, layout, params, shard_group)
    if layout is not None:
        return ops.sqrt(dtensor_square_sum(local_tensors(grads), layout))
    _check_shard_args(len(grads), shard_group, sharded)
    if _compiler_completes():
        if shard_group is not None:
            # ValueError (UnsupportedParallelError's base): GRAPH mode raises standard exceptions only.
            raise ValueError("shard_group/sharded are for hand-written sharding in stand_alone or "
                             "data_parallel mode; semi_auto/auto parallel completes the norm itself")
        return ops.sqrt(ops.addn(grad_scale_square_sums(grads)).reshape(()))
    if shard_group is None:
        return ops.sqrt(flat_square_sum(grads))
    replicated, shards = bucketed_square_sums(grads, None, _shard_plan(tuple(g.shape for g in grads),
                                                                       tuple(sharded)))
    total = ops.AllReduce(ops.ReduceOp.SUM, shard_group)(shards)
    if replicated is not None:
        total = total + replicated
    return ops.sqrt(total)


def unscaled_global_norm(grads: Any, inv_scale: Tensor) -> Tensor:
    """:func:`global_norm` of ``grads * inv_scale``, scaling before squaring.

    For loss-scaled gradients: squaring first would overflow float32 once ``norm * scale``
    passes ~1.8e19, long before the gradients themselves overflow. One extra kernel on the flat view.
    """
    return ops.sqrt(flat_square_sum(grads, inv_scale))


def squared_norms(grads: Any, segment_ids: Tensor, inv_scale: Any = None) -> Tensor:
    """Per-tensor squared L2 norms, float32 ``[len(grads)]``, in one segment-sum kernel.

    ``segment_ids`` is the int32 vector built by :func:`segment_ids_for` for the same shapes;
    ``inv_scale`` (optional float32 scalar) multiplies the gradients before squaring.
    """
    return flat_square_sum(grads, inv_scale, segment_ids)


def clip_coefficient(norm: Tensor, max_norm: Any) -> Tensor:
    """``min(1, max_norm / (norm + 1e-6))`` as float32; ``max_norm`` may be a number or a tensor."""
    return ops.minimum(ops.cast(max_norm / (norm + CLIP_EPS), ms.float32), 1.0)


def clip_by_global_norm(grads: Any, max_norm: Any, shard_group: str | None = None,
                        sharded: Sequence[bool] | None = None, *, layout: DTensorLayout | None = None,
                        params: Sequence[Any] | None = None) -> tuple:
    """Scale ``grads`` so their global L2 norm is at most ``max_norm``.

    Returns ``(clipped_grads, norm)`` where ``norm`` is the float32 global norm before clipping and
    ``clipped_grads[i] = grads[i] * min(1, max_norm / (norm + 1e-6))`` (the rule of
    ``torch.nn.utils.clip_grad_norm_``). A non-finite norm yields non-finite gradients; the
    monitored train step skips such steps instead of applying them. ``shard_group``/``sharded``:
    as in :func:`global_norm` (every rank then applies the same coefficient); so are ``layout`` /
    ``params`` (each gradient is scaled as it is given: a local shard, or a DTensor).
    """
    norm = global_norm(grads, shard_group, sharded, layout=layout, params=params)
    return scale_grads(grads, clip_coefficient(norm, max_norm)), norm
