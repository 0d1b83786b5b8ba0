"""Benchmark-only entry points of the fused kernel library (``cells/csrc/fused_norm.cc``).

They answer two questions of the ``norm`` section: what is the floor of any norm (one launch, one read
of the gradients), and can the kernel hand back the clip coefficient, or apply it, cheaper than
MindSpore's scalar kernels and per-tensor multiplies. Building one raises
``FusedNormUnavailableError`` where the kernel is not available (the probe is then "not available").
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from gradmon.cells.fused_norm import KernelOp


class ReadFloor(KernelOp):
    """``op(*grads)`` -> float32 scalar (0 or 1, meaningless): every gradient byte read once."""

    func = "GradmonReadFloor"
    scalars = 0


class TouchFloor(KernelOp):
    """``op(*grads)`` -> float32 0: one launch that waits for every gradient and reads none."""

    func = "GradmonTouchFloor"
    scalars = 0


class NormClipCoef(KernelOp):
    """``op(scale, max_norm, *grads)`` -> ``(norm, min(1, max_norm / (norm + 1e-6)))``."""

    func = "GradmonNormClipCoef"
    scalars = 2

    def output_shape(self, shapes: tuple) -> Any:
        return [(), ()]

    def output_dtype(self, dtypes: tuple) -> Any:
        return [ms.float32, ms.float32]


class ScaleAll(KernelOp):
    """``op(coef, *grads)`` -> ``tuple(g * coef for g in grads)`` in one launch (float32 only)."""

    func = "GradmonScale"
    tensor_dtypes = (ms.float32,)

    def output_shape(self, shapes: tuple) -> Any:
        return list(shapes)

    def output_dtype(self, dtypes: tuple) -> Any:
        return list(dtypes)
