"""Graph-safe global gradient norm and clipping.

Both functions work eagerly (PYNATIVE), inside ``@mindspore.jit`` and inside a ``Cell.construct``
compiled in GRAPH mode. They avoid per-tensor reductions on purpose: on MindSpore's kernel-by-kernel
backends each op is a launch (tens of microseconds on CPU), so the norm is one concatenation of
flat views, one square and one sum — three kernels however many tensors — instead of two per tensor.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

CLIP_EPS = 1e-6  # same guard as torch.nn.utils.clip_grad_norm_


def flat_fp32(grads: Any) -> Tensor:
    """All of ``grads`` as one float32 vector (fp16/bf16 are cast before anything is squared)."""
    parts = [g.reshape(-1) if g.dtype == ms.float32 else ops.cast(g.reshape(-1), ms.float32) for g in grads]
    return ops.concat(parts)


def global_norm(grads: Any) -> Tensor:
    """L2 norm over every element of a tuple/list of tensors, as a float32 scalar tensor.

    Equals ``sqrt(sum_i sum(g_i ** 2))`` computed in float32. Non-finite inputs give a non-finite
    norm. (A sum of squares beyond float32 range, i.e. norms above ~1.8e19, also reads as ``inf``.)
    """
    if len(grads) == 0:
        raise ValueError("global_norm needs at least one tensor")
    return ops.sqrt(ops.reduce_sum(ops.square(flat_fp32(grads))))


def unscaled_global_norm(grads: Any, inv_scale: Tensor) -> Tensor:
    """:func:`global_norm` of ``grads * inv_scale``, scaling before squaring.

    For loss-scaled gradients: squaring first would overflow float32 once ``norm * scale``
    passes ~1.8e19, long before the gradients themselves overflow. One extra kernel on the flat view.
    """
    return ops.sqrt(ops.reduce_sum(ops.square(flat_fp32(grads) * inv_scale)))


def squared_norms(grads: Any, segment_ids: Tensor, inv_scale: Any = None) -> Tensor:
    """Per-tensor squared L2 norms, float32 ``[len(grads)]``, in one segment-sum kernel.

    ``segment_ids`` is the int32 vector built by :func:`segment_ids_for` for the same shapes;
    ``inv_scale`` (optional float32 scalar) multiplies the gradients before squaring.
    """
    flat = flat_fp32(grads)
    if inv_scale is not None:
        flat = flat * inv_scale
    return ops.unsorted_segment_sum(ops.square(flat), segment_ids, len(grads))


def segment_ids_for(shapes: Any) -> Tensor:
    """int32 vector mapping each element of the flattened tensors of ``shapes`` to its tensor index."""
    import numpy as np

    sizes = [int(np.prod(s)) for s in shapes]
    return Tensor(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes), ms.int32)


def scale_grads(grads: Any, factor: Tensor) -> tuple:
    """Every gradient times ``factor`` (a float32 scalar), keeping each gradient's dtype."""
    return tuple(g * factor if g.dtype == ms.float32 else g * ops.cast(factor, g.dtype) for g in grads)


def clip_coefficient(norm: Tensor, max_norm: Any) -> Tensor:
    """``min(1, max_norm / (norm + 1e-6))`` as float32; ``max_norm`` may be a number or a tensor."""
    return ops.minimum(ops.cast(max_norm / (norm + CLIP_EPS), ms.float32), 1.0)


def clip_by_global_norm(grads: Any, max_norm: Any) -> tuple:
    """Scale ``grads`` so their global L2 norm is at most ``max_norm``.

    Returns ``(clipped_grads, norm)`` where ``norm`` is the float32 global norm before clipping and
    ``clipped_grads[i] = grads[i] * min(1, max_norm / (norm + 1e-6))`` (the rule of
    ``torch.nn.utils.clip_grad_norm_``). A non-finite norm yields non-finite gradients; the
    monitored train step skips such steps instead of applying them.
    """
    norm = global_norm(grads)
    return scale_grads(grads, clip_coefficient(norm, max_norm)), norm
