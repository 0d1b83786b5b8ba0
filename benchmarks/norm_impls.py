"""Alternative graph implementations of the global gradient norm, clipping and the history write.

Used by the ``norm`` section to find which form is cheapest in MindSpore GRAPH mode, so the cell
(``cells/``) can adopt it. ``ProbeStep(net, opt, norm=..., clip=..., ring=...)`` is a
``TrainOneStepCell`` whose extra work is chosen by string constants that the graph compiler folds,
so each variant compiles to exactly its own ops.

Norms (``grads`` is the tuple of gradients):

- ``none``: no norm (returns 1.0): a separately built copy of the plain step, the noise reference
- ``addn``: per tensor ``reduce_sum(square(g))``, ``addn``, ``sqrt`` (MindSpore's own clip does this)
- ``stack``: per-tensor square sums, ``stack``, one ``reduce_sum``, ``sqrt``
- ``l2loss``: per tensor ``L2Loss`` (one kernel, no squared temporary), ``addn``, ``2*``, ``sqrt``
- ``norm_each``: per tensor ``ops.norm``, ``stack``, ``ops.norm``
- ``concat``: flatten and ``concat`` everything, then one ``reduce_sum(square)``, ``sqrt``
- ``concat_l2loss``: ``concat`` then one ``L2Loss``
- ``concat_dot``: ``concat`` then ``matmul(flat[None], flat[:, None])`` (BLAS dot, no temporary)
- ``fused``: gradmon's fused kernel (``FusedSquaredNorm``: one pass, in place, float64), then ``sqrt``
- ``fused_root``: the same kernel returning the norm itself (``FusedGlobalNorm``): one launch in all
- ``floor_read`` (not a norm): a kernel that reads every gradient byte once in the fused kernel's
  chunks and threads with the cheapest arithmetic (an OR of the words) -- the floor of any norm
- ``floor_touch`` (not a norm): a kernel that takes every gradient and reads none -- one launch

Clips (coefficient ``c = min(1, max_norm / (norm + 1e-6))`` applied to every gradient):

- ``none``; ``minimum`` (``ops.minimum``); ``select`` (``ops.select(norm > max_norm, ...)``);
  (probe ``clip_l2loss_minimum``: ``minimum`` on the ``l2loss`` norm, the other clips use ``addn``);
  ``stock`` (``ops.clip_by_global_norm``, computing its own norm); ``flat`` (one multiply on the
  concatenated buffer, ``split`` back; requires a ``concat*`` norm);
  ``fused_coef`` (the fused kernel also returns ``c``: no scalar kernels; per-tensor multiply);
  ``fused_scale`` (``c`` from scalar kernels, all multiplies in one launch of a multi-output kernel);
  ``fused_coef_scale`` (both). The ``fused*`` clips need a ``fused*`` norm.

Ring (device history): ``none``; ``scatter`` (``ops.scatter_update`` of one row of a
``[1024, 8]`` Parameter at ``step % 1024``, plus ``assign_add`` of the step counter).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import operations as P

NORMS = ("addn", "stack", "l2loss", "norm_each", "concat", "concat_l2loss", "concat_dot", "fused",
         "fused_root", "floor_read", "floor_touch")
PROBE_NORMS = ("none", *NORMS)
KERNEL_NORMS = ("fused", "fused_root", "floor_read", "floor_touch")
FLOORS = ("floor_read", "floor_touch")
CLIPS = ("none", "minimum", "select", "stock", "flat", "fused_coef", "fused_scale", "fused_coef_scale")
RINGS = ("none", "scatter")

_square_sum = C.MultitypeFuncGraph("bench_square_sum")
_l2loss = C.MultitypeFuncGraph("bench_l2loss")
_norm = C.MultitypeFuncGraph("bench_norm")
_flatten = C.MultitypeFuncGraph("bench_flatten")
_scale = C.MultitypeFuncGraph("bench_scale")
_L2Loss = P.L2Loss()


@_square_sum.register("Tensor")
def _square_sum_t(g):
    return ops.reduce_sum(ops.square(g))


@_l2loss.register("Tensor")
def _l2loss_t(g):
    return _L2Loss(g)


@_norm.register("Tensor")
def _norm_t(g):
    return ops.norm(g)


@_flatten.register("Tensor")
def _flatten_t(g):
    return ops.reshape(g, (-1,))


@_scale.register("Tensor", "Tensor")
def _scale_t(coef, g):
    return g * ops.cast(coef, g.dtype)


class KernelForms(nn.Cell):
    """The fused-kernel forms of a probe: built only when the probe uses one (the kernel library is
    compiled at first use, and building raises where it is not available)."""

    def __init__(self, norm: str, clip: str) -> None:
        super().__init__()
        self.norm_kind = norm
        self.one = Tensor(1.0, ms.float32)
        self.hyper_map = C.HyperMap()
        self.scale_all = clip in ("fused_scale", "fused_coef_scale")
        if norm not in KERNEL_NORMS:
            return
        from gradmon.cells import fused_norm as F

        from benchmarks import kernel_probes as K

        self.norm_op = {"fused": F.FusedSquaredNorm, "fused_root": F.FusedGlobalNorm,
                        "floor_read": K.ReadFloor, "floor_touch": K.TouchFloor}[norm]()
        if clip.startswith("fused_coef"):
            self.coef_op = K.NormClipCoef()
        if self.scale_all:
            self.scale_op = K.ScaleAll()

    def norm(self, grads):
        if self.norm_kind == "fused":
            return ops.sqrt(self.norm_op(self.one, *grads))
        if self.norm_kind == "fused_root":
            return self.norm_op(self.one, *grads)
        return self.norm_op(*grads)

    def norm_and_coef(self, max_norm, grads):
        return self.coef_op(self.one, max_norm, *grads)

    def scaled(self, coef, grads):
        if not self.scale_all:
            return self.hyper_map(ops.partial(_scale, coef), grads)
        return tuple(self.scale_op(coef, *grads))


class ProbeStep(nn.TrainOneStepCell):
    """A ``TrainOneStepCell`` that also computes the global norm one way, clips one way and writes
    the history ring one way; returns ``(loss, norm)`` (``norm`` is 1.0 when ``norm="none"``)."""

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        *,
        norm: str = "addn",
        clip: str = "none",
        ring: str = "none",
        max_norm: float = 1.0,
    ) -> None:
        super().__init__(network, optimizer)
        if norm not in PROBE_NORMS or clip not in CLIPS or ring not in RINGS:
            raise ValueError(f"unknown probe variant norm={norm} clip={clip} ring={ring}")
        if clip == "flat" and not norm.startswith("concat"):
            raise ValueError("clip='flat' needs a concat norm")
        if clip.startswith("fused") and not norm.startswith("fused"):
            raise ValueError(f"clip={clip!r} needs a fused norm")
        self.kernels = KernelForms(norm, clip)
        self.norm_kind = norm
        self.clip_kind = clip
        self.ring_kind = ring
        self.max_norm = Tensor(max_norm, ms.float32)
        self.max_norm_f = float(max_norm)
        self.one = Tensor(1.0, ms.float32)
        self.eps = Tensor(1e-6, ms.float32)
        self.hyper_map = C.HyperMap()
        self.split_sizes = tuple(int(np.prod(p.shape)) for p in self.weights)
        self.shapes = tuple(tuple(p.shape) for p in self.weights)
        self.ring = Parameter(Tensor(np.zeros((1024, 8), np.float32)), name="bench_ring", requires_grad=False)
        self.step = Parameter(Tensor(0, ms.int32), name="bench_step", requires_grad=False)
        self.ring_size = Tensor(1024, ms.int32)

    def _global_norm(self, grads, flat):
        kind = self.norm_kind
        if kind in KERNEL_NORMS:
            return self.kernels.norm(grads)
        if kind == "none":
            return self.one
        if kind == "addn":
            return ops.sqrt(ops.addn(self.hyper_map(_square_sum, grads)))
        if kind == "stack":
            return ops.sqrt(ops.reduce_sum(ops.stack(self.hyper_map(_square_sum, grads))))
        if kind == "l2loss":
            return ops.sqrt(ops.addn(self.hyper_map(_l2loss, grads)) * 2.0)
        if kind == "norm_each":
            return ops.norm(ops.stack(self.hyper_map(_norm, grads)))
        if kind == "concat":
            return ops.sqrt(ops.reduce_sum(ops.square(flat)))
        if kind == "concat_l2loss":
            return ops.sqrt(_L2Loss(flat) * 2.0)
        # concat_dot
        return ops.sqrt(ops.reshape(ops.matmul(ops.reshape(flat, (1, -1)), ops.reshape(flat, (-1, 1))), ()))

    def _unflatten(self, flat):
        parts = ops.split(flat, self.split_sizes)
        out = ()
        for i in range(len(self.shapes)):
            out = (*out, ops.reshape(parts[i], self.shapes[i]))
        return out

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        flat = grads[0]
        if self.norm_kind.startswith("concat"):
            flat = ops.concat(self.hyper_map(_flatten, grads))
        coef = self.one
        if self.clip_kind.startswith("fused_coef"):
            norm, coef = self.kernels.norm_and_coef(self.max_norm, grads)
        else:
            norm = self._global_norm(grads, flat)
        if self.clip_kind.startswith("fused"):
            if self.clip_kind == "fused_scale":
                coef = ops.minimum(self.one, self.max_norm / (norm + self.eps))
            grads = self.kernels.scaled(coef, grads)
        elif self.clip_kind == "minimum":
            coef = ops.minimum(self.one, self.max_norm / (norm + self.eps))
            grads = self.hyper_map(ops.partial(_scale, coef), grads)
        elif self.clip_kind == "select":
            coef = ops.select(norm > self.max_norm, self.max_norm / (norm + self.eps), self.one)
            grads = self.hyper_map(ops.partial(_scale, coef), grads)
        elif self.clip_kind == "stock":
            grads = ops.clip_by_global_norm(grads, self.max_norm_f)
        elif self.clip_kind == "flat":
            coef = ops.minimum(self.one, self.max_norm / (norm + self.eps))
            grads = self._unflatten(flat * coef)
        if self.ring_kind == "scatter":
            row = ops.stack((loss, norm, coef, norm, coef, loss, norm, coef)).reshape(1, 8)
            idx = ops.reshape(ops.floor_mod(self.step, self.ring_size), (1,))
            loss = ops.depend(loss, ops.scatter_update(self.ring, idx, row))
            loss = ops.depend(loss, ops.assign_add(self.step, Tensor(1, ms.int32)))
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, norm


# Named probe variants of the section: (norm, clip, ring).
PROBES: dict[str, tuple[str, str, str]] = {
    **{f"norm_{n}": (n, "none", "none") for n in NORMS},
    "plain_copy": ("none", "none", "none"),
    "clip_minimum": ("addn", "minimum", "none"),
    "clip_select": ("addn", "select", "none"),
    "clip_stock": ("addn", "stock", "none"),
    "clip_flat": ("concat", "flat", "none"),
    "clip_l2loss_minimum": ("l2loss", "minimum", "none"),
    "clip_fused_minimum": ("fused_root", "minimum", "none"),
    "clip_fused_coef": ("fused_root", "fused_coef", "none"),
    "clip_fused_scale": ("fused_root", "fused_scale", "none"),
    "clip_fused_coef_scale": ("fused_root", "fused_coef_scale", "none"),
    "ring_scatter": ("addn", "none", "scatter"),
}


class NormOnly(nn.Cell):
    """Just the global norm of a tuple of tensors, for timing the norm apart from any training."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in NORMS:
            raise ValueError(f"unknown norm {kind!r}")
        self.kind = kind
        self.hyper_map = C.HyperMap()
        self.kernels = KernelForms(kind, "none")

    def construct(self, tensors):
        kind = self.kind
        if kind in KERNEL_NORMS:
            return self.kernels.norm(tensors)
        if kind == "addn":
            return ops.sqrt(ops.addn(self.hyper_map(_square_sum, tensors)))
        if kind == "stack":
            return ops.sqrt(ops.reduce_sum(ops.stack(self.hyper_map(_square_sum, tensors))))
        if kind == "l2loss":
            return ops.sqrt(ops.addn(self.hyper_map(_l2loss, tensors)) * 2.0)
        if kind == "norm_each":
            return ops.norm(ops.stack(self.hyper_map(_norm, tensors)))
        flat = ops.concat(self.hyper_map(_flatten, tensors))
        if kind == "concat":
            return ops.sqrt(ops.reduce_sum(ops.square(flat)))
        if kind == "concat_l2loss":
            return ops.sqrt(_L2Loss(flat) * 2.0)
        return ops.sqrt(ops.reshape(ops.matmul(ops.reshape(flat, (1, -1)), ops.reshape(flat, (-1, 1))), ()))
