"""The global norm's graph code: one function per strategy, and the cell that combines them.

Every function works eagerly (PYNATIVE), inside ``@mindspore.jit`` and inside a ``construct``
compiled in GRAPH mode; the plan (:mod:`gradmon.cells.norm_plan`) and every switch are Python
constants, so GRAPH mode unrolls them into straight-line kernels. Gradients are cast to float32
and, under loss scaling, multiplied by ``inv_scale`` *before* squaring (a scaled square would
overflow float32 long before the gradients do).
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import operations as P

from .fused_norm import FusedSquaredNorm, FusedSquaredNorms, fused_norm_available
from .norm_plan import BUCKET_BYTES, choose_strategy, memory_bound, plan_groups
from .parallel import ParallelSetup

# The marker MindSpore's parallel compiler looks for (as ops.clip_by_global_norm does): it divides
# each marked per-tensor square sum by the parameter's replica count, and all-reduces the input
# of the Sqrt the marked values flow into, within the pipeline stage and between stages.
_grad_scale_expand = P.ExpandDims().add_prim_attr("grad_scale", True)


def flat_fp32(grads: Any) -> Tensor:
    """All of ``grads`` as one float32 vector (fp16/bf16 are cast before anything is squared)."""
    return _concat(_hyper_map(_flat_f32, grads))


def segment_ids_for(shapes: Any) -> Tensor:
    """int32 vector mapping each element of the flattened tensors of ``shapes`` to its tensor index."""
    sizes = [int(np.prod(s)) for s in shapes]
    return Tensor(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes), ms.int32)


def flat_square_sum(grads: Any, inv_scale: Any = None, segment_ids: Any = None) -> Tensor:
    """Sum of squares over one concatenated float32 view: three kernels however many tensors.

    With ``segment_ids`` (see :func:`segment_ids_for`) returns the
    per-tensor vector ``[len(grads)]`` instead of the scalar.
    """
    flat = flat_fp32(grads)
    if inv_scale is not None:
        flat = flat * inv_scale
    if segment_ids is not None:
        return ops.unsorted_segment_sum(ops.square(flat), segment_ids, len(grads))
    return ops.reduce_sum(ops.square(flat))


# Classes of gradients in a plan: replicated (counted once), hand-sharded (all-reduced over the
# shard group), not counted on this rank (a tied copy on a later pipeline stage).
REPLICATED, SHARDED, UNCOUNTED = 0, 1, 2

# Graph code over the gradients maps functions over the tuple (HyperMap) or slices it, and never builds
# a Python list or tuple one element at a time: GRAPH mode keeps every intermediate sequence of such a
# loop (or of a comprehension) in the compiled graph, measured ~0.3 MiB of resident host memory per
# gradient for a loop of appends and ~1.4 MiB for a comprehension at 100 gradients, growing faster
# than the count (docs/cells.md, "Compiled graph memory"); a HyperMap or a slice costs ~0.
# The chained bucket loop calls primitives, not the functional ops: each piece's input waits for
# the previous piece, and GRAPH mode's analysis nests a level per piece for every function call
# on that chain (it stops at a depth of 1000).
_square = P.Square()
_reduce_sum = P.ReduceSum(keep_dims=False)
_depend = P.Depend()
_cast = P.Cast()
_reshape = P.Reshape()
_mul = P.Mul()
_add = P.Add()
_concat = P.Concat(0)
_slice = P.Slice()
_hyper_map = ops.HyperMap()
_ONE = Tensor(1.0, ms.float32)

_marked_square_sum = ops.MultitypeFuncGraph("gradmon_marked_square_sum")
_square_sum = ops.MultitypeFuncGraph("gradmon_square_sum")
_flat_f32 = ops.MultitypeFuncGraph("gradmon_flat_f32")
_scaled = ops.MultitypeFuncGraph("gradmon_scaled")


@_flat_f32.register("Tensor")
def _flat_f32_of(g):
    g = _reshape(g, (-1,))
    return g if g.dtype == ms.float32 else _cast(g, ms.float32)


@_scaled.register("Tensor", "Tensor")
def _scaled_by(factor, g):
    return _mul(g, factor) if g.dtype == ms.float32 else _mul(g, _cast(factor, g.dtype))


def scale_grads(grads: Any, factor: Tensor) -> tuple:
    """Every gradient times ``factor`` (a float32 scalar), keeping each gradient's dtype: one multiply
    per tensor, mapped over the tuple (a comprehension would keep ~1 MiB of graph per gradient)."""
    return _hyper_map(ops.partial(_scaled, factor), grads)


@_flat_f32.register("Tensor", "Tensor")
def _flat_f32_after(prev, g):
    # The previous piece's sum first: its buffers are free before this piece's are built.
    return _flat_f32_of(_depend(g, prev))


def _sum_of_squares(x: Tensor) -> Tensor:
    """``sum(x**2)`` as a float32 scalar: the last axis first, then the rest.

    Measured on MindSpore's CPU kernels, reducing a [2048, 512] tensor over all axes at once takes
    3.7 ms, over the last axis and then the rest 0.5 ms. Only Square and ReduceSum: still the
    pattern the parallel compiler follows.
    """
    sq = _square(x)
    if len(sq.shape) > 1:
        sq = _reduce_sum(sq, -1)
    return _reduce_sum(sq, ())


@_marked_square_sum.register("Tensor")
def _marked_square_sum_of(g):
    return _grad_scale_expand(_sum_of_squares(g if g.dtype == ms.float32 else _cast(g, ms.float32)), 0)


@_marked_square_sum.register("Tensor", "Tensor")
def _marked_scaled_square_sum_of(inv_scale, g):
    x = _mul(g if g.dtype == ms.float32 else _cast(g, ms.float32), inv_scale)
    return _grad_scale_expand(_sum_of_squares(x), 0)


@_square_sum.register("Tensor")
def _square_sum_of(g):
    return _sum_of_squares(g if g.dtype == ms.float32 else _cast(g, ms.float32))


@_square_sum.register("Tensor", "Tensor")
def _scaled_square_sum_of(inv_scale, g):
    return _sum_of_squares(_mul(g if g.dtype == ms.float32 else _cast(g, ms.float32), inv_scale))


def grad_scale_square_sums(grads: Any, inv_scale: Any = None) -> tuple:
    """Per tensor ``ExpandDims[grad_scale](ReduceSum(Square(Cast(g) [* inv_scale])))``, shape ``(1,)``.

    Nothing reshapes, slices or concatenates a gradient before its square: the pattern MindSpore's
    parallel compiler recognises (only Cast, Mul, Square, ReduceSum on the way), mapped over the
    tuple like ``ops.clip_by_global_norm`` does.
    """
    if inv_scale is None:
        return _hyper_map(_marked_square_sum, grads)
    return _hyper_map(ops.partial(_marked_square_sum, inv_scale), grads)


def tensor_square_sums(grads: Any, inv_scale: Any = None) -> tuple:
    """Per tensor ``ReduceSum(Square(Cast(g) [* inv_scale]))``, float32 scalars (no marker)."""
    if inv_scale is None:
        return _hyper_map(_square_sum, grads)
    return _hyper_map(ops.partial(_square_sum, inv_scale), grads)


def bucketed_square_sums(grads: Any, inv_scale: Any, plan: Any, fused_op: Any = None) -> tuple:
    """Run a plan of ``(class, pieces)`` groups (:func:`gradmon.cells.norm_plan.plan_groups`).

    Returns ``(replicated, sharded)``: the float32 squared sums of the replicated and of the
    sharded groups (``None`` when a class has no group; uncounted groups are left out). Each
    piece's inputs wait (``depend``) for the previous piece's sum, so one piece's buffers (its
    float32 copy and its square) are alive at a time. ``fused_op``: run each piece through the fused
    kernel instead (it reads the tensors in place, so its pieces are not chained).
    """
    replicated, sharded = None, None
    prev = None
    for cls, pieces in plan:
        for first, stop, lo, hi in pieces:
            if fused_op is not None:
                # In place, no buffers: nothing to chain. A slice of the tuple, not a loop (see above).
                prev = fused_op(_ONE if inv_scale is None else inv_scale, *grads[first:stop])
            else:
                if stop - first == 1:  # one tensor, or a slice of it (cut before the cast: a bounded copy)
                    x = _reshape(grads[first] if prev is None else _depend(grads[first], prev), (-1,))
                    if lo >= 0:
                        x = _slice(x, (lo,), (hi - lo,))
                    if x.dtype != ms.float32:
                        x = _cast(x, ms.float32)
                elif prev is None:
                    x = _concat(_hyper_map(_flat_f32, grads[first:stop]))
                else:
                    x = _concat(_hyper_map(ops.partial(_flat_f32, prev), grads[first:stop]))
                if inv_scale is not None:
                    x = _mul(x, inv_scale)
                prev = _reduce_sum(_square(x), ())
            if cls == REPLICATED:
                replicated = prev if replicated is None else _add(replicated, prev)
            elif cls == SHARDED:
                sharded = prev if sharded is None else _add(sharded, prev)
    return replicated, sharded


def fused_available() -> bool:
    """Whether the fused single-pass kernel (``gradmon.cells.fused_norm``) is built and loads here
    (the first call may build it)."""
    return bool(fused_norm_available())


def fused_ops() -> tuple:
    """The fused kernel's primitives (``gradmon.cells.fused_norm``): ``op(scale, *grads)`` giving
    ``scale**2 * sum(g**2)`` as a float32 scalar, and the same per tensor ``[len(grads)]``, both
    accumulated in float64 in one pass."""
    return FusedSquaredNorm(), FusedSquaredNorms()


class GlobalNorm(nn.Cell):
    """The global L2 norm of a step's gradients under its parallel setup.

    ``construct(grads, inv_scale) -> (norm, per_tensor_sq)``: ``norm`` is the float32 scalar norm
    of ``grads * inv_scale`` (``inv_scale`` is used only with ``scaled=True``); ``per_tensor_sq``
    the per-tensor squared norms ``[len(grads)]`` when ``per_tensor=True`` (else ``norm`` again).
    Hand-sharded tensors (``setup.sharded``) are summed apart and all-reduced over
    ``setup.shard_group``; replicated ones count once, and so do tied copies across pipeline
    stages (``setup.counted``). With ``local=True`` nothing is reduced across ranks: this rank's
    own norm. :meth:`build` chooses the strategy.

    Forms: ``flat`` (one concatenation), ``bucketed``/``fused`` (chained pieces of the plan),
    ``per_tensor`` (the ``grad_scale`` form). Per-tensor sums (``per_tensor=True``, for
    layer_stats) are one reduction per tensor, except under ``flat`` (one segment sum).
    """

    def __init__(self, shapes: list, setup: ParallelSetup, strategy: str, per_tensor: bool, scaled: bool,
                 local: bool = False, bucket_bytes: int | None = None) -> None:
        super().__init__(auto_prefix=False)
        n = len(shapes)
        sharded = setup.sharded if (setup.sharded and not local) else (False,) * n
        counted = setup.counted if setup.counted else (True,) * n
        classes = [SHARDED if sharded[i] else (REPLICATED if counted[i] else UNCOUNTED) for i in range(n)]
        sizes = [int(np.prod(s)) for s in shapes]
        self.strategy = strategy
        self.n_tensors = n
        self.per_tensor = per_tensor
        self.scaled = scaled
        self.has_shard = SHARDED in classes
        self.has_replicated = REPLICATED in classes
        self.all_replicated = classes == [REPLICATED] * n
        self.all_counted = UNCOUNTED not in classes
        # One concatenation when every tensor is alike; otherwise runs of one class.
        self.flat = strategy == "flat" and self.all_replicated
        self.segment_ids = segment_ids_for(shapes) if self.flat and per_tensor else None
        # Per-tensor sums: the grad_scale form, or layer_stats with any form but flat.
        self.each_tensor = strategy == "per_tensor" or (per_tensor and not self.flat)
        # A rank's own norm must not carry the grad_scale marker, or the compiler would complete it.
        self.marked = strategy == "per_tensor" and not local
        self.fused_op, self.fused_each = fused_ops() if strategy == "fused" else (None, None)
        if bucket_bytes is None:
            bucket_bytes = bucket_bytes_for(sum(sizes) * 4)
        bucket = max(1, bucket_bytes // 4) if strategy == "bucketed" else max(1, sum(sizes))
        self.plan = () if (self.flat or self.each_tensor) else plan_groups(sizes, bucket, False, classes)
        if self.has_shard:
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, setup.shard_group)
            self.shard_mask = Tensor(np.array([c == SHARDED for c in classes], np.float32))
            self.rep_mask = Tensor(np.array([c != SHARDED for c in classes], np.float32))
        self.count_mask = Tensor(np.array([c != UNCOUNTED for c in classes], np.float32))

    @classmethod
    def build(cls, weights: Any, setup: ParallelSetup, requested: str, per_tensor: bool, scaled: bool,
              local: bool = False) -> GlobalNorm:
        """Choose the strategy for these weights (see :func:`choose_strategy`) and build the cell."""
        shapes = [tuple(w.shape) for w in weights]
        numel = sum(int(np.prod(s)) for s in shapes)
        grad_bytes = sum(int(np.prod(w.shape)) * int(w.itemsize) for w in weights)
        largest = max([0, *(int(np.prod(s)) for s in shapes)])
        # fused_available is asked only when the choice comes to it: it may build the kernel.
        strategy = choose_strategy(requested, setup.compiler_completes, numel, grad_bytes,
                                   True if requested == "fused" else fused_available, per_tensor, largest)
        if strategy == "fused" and not fused_available():
            raise ValueError("norm_strategy='fused' needs the fused norm kernel (gradmon.cells.fused_norm), "
                             "which is not built or does not load here; use 'auto' or 'bucketed'")
        return cls(shapes, setup, strategy, per_tensor, scaled, local)

    def one_fused_pass(self) -> bool:
        """Whether the norm is one fused-kernel launch over every gradient, whole and counted once (then
        the step cell may use :class:`~gradmon.cells.fused_norm.FusedNormRecord`, which reads them so)."""
        return (self.fused_op is not None and self.all_replicated and not self.per_tensor
                and self.plan == ((REPLICATED, ((0, self.n_tensors, -1, -1),)),))

    def construct(self, grads, inv_scale):
        scale = inv_scale if self.scaled else None
        if self.flat:
            total = flat_square_sum(grads, scale, self.segment_ids)
            if not self.per_tensor:
                return ops.sqrt(total), total
            return ops.sqrt(ops.reduce_sum(total)), total
        if not self.each_tensor:
            replicated, sharded = bucketed_square_sums(grads, scale, self.plan, self.fused_op)
            total = replicated if self.has_replicated else ops.zeros((), ms.float32)
            if self.has_shard:
                total = total + self.all_reduce(sharded)
            return ops.sqrt(total), total
        if self.fused_each is not None:  # layer_stats with the fused kernel: one pass, per-tensor sums
            vec = self.fused_each(_ONE if scale is None else scale, *grads)
        else:
            sums = grad_scale_square_sums(grads, scale) if self.marked else tensor_square_sums(grads, scale)
            if self.all_replicated and not self.per_tensor:
                # The pattern of ops.clip_by_global_norm: marked sums -> AddN -> Sqrt (the compiler
                # all-reduces the Sqrt's input).
                total = ops.addn(sums).reshape(())
                return ops.sqrt(total), total
            vec = ops.concat(sums) if self.marked else ops.stack(sums)
        if self.has_shard:
            # One all-reduce of the per-tensor vector: the sharded entries become whole-tensor sums.
            vec = vec * self.rep_mask + self.all_reduce(vec * self.shard_mask)
        counted = vec if self.all_counted else vec * self.count_mask
        return ops.sqrt(ops.reduce_sum(counted)), vec


def bucket_bytes_for(grad_fp32_bytes: int) -> int:
    """Bytes of one bucket: an eighth of the memory bound, at least :data:`BUCKET_BYTES`."""
    return max(BUCKET_BYTES, memory_bound(grad_fp32_bytes) // 8)
