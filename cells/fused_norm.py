"""The fused global-norm kernel: one pass over the gradients, in place, float64 accumulation (CPU).

MindSpore's stock CPU kernels compute a global norm as concat (a copy of every gradient) + square (a
second copy) + sum, each a launch. ``cells/csrc/fused_norm.cc`` does it in one ``ops.Custom`` aot
kernel that reads every gradient tensor once where it lies, squares each element exactly in float64,
sums in float64 over fixed chunks spread across threads, and combines the chunks in a fixed order (the
same bits for any thread count). It is compiled at first use (:mod:`gradmon.cells.fused_build`).

Interface (what ``norm_strategy="fused"`` builds on)
----------------------------------------------------

- :func:`fused_norm_available` ``() -> bool``: True when the device target is CPU and the kernel
  library is built (compiling it on first call) and passed its self-test. When it is False,
  :func:`fused_norm_unavailable_reason` says why; use the flat path of :mod:`gradmon.cells.norm_ops`.
  A build failure (no compiler, compile error, unwritable cache) warns once per process
  (:class:`FusedNormFallbackWarning`); ``GRADMON_FUSED_NORM=0`` turns the kernel off without a warning.
- :class:`FusedSquaredNorm` ``()``: a Primitive, ``op(scale, *grads)`` -> float32 scalar
  ``scale**2 * sum_i sum(g_i**2)``, accumulated in float64 (so ``scale`` = 1 / loss scale unscales
  without any overflow of the squares). ``scale`` is a float32 Tensor of shape ``()`` or ``(1,)``;
  ``grads`` any number (zero included) of float32 / float16 / bfloat16 / float64 tensors of any
  shape, 0 and 1 elements included.
- :class:`FusedSquaredNorms` ``()``: ``op(scale, *grads)`` -> float32 ``[len(grads)]``, the same
  per tensor (``layer_stats``), from the same single pass.
- :class:`FusedGlobalNorm` ``()``: ``op(scale, *grads)`` -> float32 ``|scale| * sqrt(sum)``: the norm
  in one launch (no separate sqrt kernel).
- :class:`FusedNormRecord` ``(width)``: ``op(scale, loss, config, counts, *grads)`` -> the norm, whether
  it is finite, and the step's history row, ring slot and counters for a ``MonitoredTrainStep`` with
  its defaults (no clipping, detector or loss scale), where all of them follow from the norm.

The primitives are built where the cell is built (``__init__``) and then are ordinary cell attributes:
they work in a ``Cell.construct`` in GRAPH and PYNATIVE mode and inside ``@ms.jit`` functions.
Building one raises :class:`FusedNormUnavailableError` when :func:`fused_norm_available` is False.
Non-finite gradients give a non-finite result; a sum beyond float32 range reads as ``inf`` (as the
flat path). This module is a leaf: it imports no other norm module. The choice between the kernel and
the stock-op paths is :class:`gradmon.cells.norm_strategies.GlobalNorm`'s (``norm_strategy``).

Environment: ``GRADMON_FUSED_NORM=0`` forces the fallback; ``GRADMON_CXX`` names the compiler;
``GRADMON_FUSED_NORM_THREADS`` caps the kernel's threads (default: the CPUs this process may use,
at most 16); ``XDG_CACHE_HOME`` moves the build cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import mindspore as ms
from mindspore import ops
from mindspore.common import dtype as mstype

from ._compat import mindspore_version
from .fused_build import KernelBuildError, KernelLibrary, call_aot, element_type

ENV_SWITCH = "GRADMON_FUSED_NORM"
SOURCE = Path(__file__).resolve().parent / "csrc" / "fused_norm.cc"
LIBRARY_NAME = "gradmon_fused_norm"
ABI_VERSION = 2
GRAD_DTYPES = (ms.float32, ms.float16, ms.bfloat16, ms.float64)


class FusedNormUnavailableError(RuntimeError):
    """A fused-norm primitive was built where the kernel is not available (the message says why)."""


class FusedNormFallbackWarning(RuntimeWarning):
    """The fused kernel could not be built; the flat norm is used instead."""


def disabled_by_env() -> bool:
    """``GRADMON_FUSED_NORM`` is 0/off/false/no: the kernel is off (no warning, no build)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "off", "false", "no")


def _self_test(library: Path) -> None:
    """Run the library once through ctypes on a known input: a wrong ABI or a miscompile stops here."""
    import numpy as np

    abi = call_aot(library, "GradmonFusedNormAbi", None, None)
    if abi != ABI_VERSION:
        raise KernelBuildError(f"{library} has kernel ABI {abi}, expected {ABI_VERSION}")
    grads = [np.arange(-3, 5, dtype=np.float32).reshape(2, 4), np.array([3.0], np.float16),
             np.zeros(0, np.float32)]
    out = np.zeros((), np.float32)
    rc = call_aot(library, "GradmonSquaredNorm", [np.array(0.5, np.float32), *grads], [out])
    expected = 0.25 * sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)
    if rc != 0 or float(out) != np.float32(expected):
        raise KernelBuildError(f"{library} failed its self-test (rc={rc}, {float(out)} != {expected})")


_LIBRARY = KernelLibrary(SOURCE, LIBRARY_NAME, _self_test, "the fused global-norm kernel is not "
                         "available, using the flat norm instead", FusedNormFallbackWarning)


def fused_norm_unavailable_reason() -> str | None:
    """Why :func:`fused_norm_available` is False (``None`` when it is True). May build the library."""
    if disabled_by_env():
        return f"{ENV_SWITCH}={os.environ[ENV_SWITCH]} turns the fused kernel off"
    target = ms.get_context("device_target")
    if target != "CPU":
        return f"the fused kernel runs on CPU only (device_target is {target})"
    return _LIBRARY.unavailable_reason(mindspore_version())


def fused_norm_available() -> bool:
    """True when the fused kernel can be used now (CPU target, library built and self-tested)."""
    return fused_norm_unavailable_reason() is None


def library_path() -> Path | None:
    """The compiled library in use, or ``None`` when the kernel is not available."""
    return None if fused_norm_unavailable_reason() else _LIBRARY.path


# ------------------------------------------------------------------------------------ primitives
class KernelOp(ops.Custom):
    """An aot ``ops.Custom`` calling ``func`` of the kernel library: ``scalars`` float32 scalars first,
    then any number of tensors. Subclasses say what comes out (``output_shape`` / ``output_dtype`` of
    the tensors' shapes / dtypes). Checks its inputs at graph build time with a clear ``TypeError``.
    """

    func: ClassVar[str] = ""
    scalars: ClassVar[int] = 1
    tensor_dtypes: ClassVar[tuple] = GRAD_DTYPES

    def __init__(self) -> None:
        reason = fused_norm_unavailable_reason()
        if reason is not None:
            raise FusedNormUnavailableError(f"the fused norm kernel is not available: {reason}")
        super().__init__(f"{_LIBRARY.path}:{self.func}", out_shape=self._infer_shape,
                         out_dtype=self._infer_dtype, func_type="aot")

    def __deepcopy__(self, memo: dict) -> KernelOp:
        # Primitive's deepcopy re-calls __init__ with its init_attrs ({"name": "Custom"}); ours take none.
        return type(self)()

    def output_shape(self, shapes: tuple) -> Any:
        return ()

    def output_dtype(self, dtypes: tuple) -> Any:
        return ms.float32

    def _infer_shape(self, *shapes):
        name = type(self).__name__
        if len(shapes) < self.scalars:
            raise TypeError(f"{name} takes {self.scalars} float32 scalar(s) first, then the tensors; "
                            f"got {len(shapes)} inputs")
        for i in range(self.scalars):
            if tuple(shapes[i]) not in ((), (1,)):
                raise TypeError(f"{name}: input {i} must have shape () or (1,), got {tuple(shapes[i])}")
        return self.output_shape(tuple(tuple(s) for s in shapes[self.scalars:]))

    def _infer_dtype(self, *dtypes):
        name = type(self).__name__
        for i in range(self.scalars):
            if element_type(dtypes[i]) != ms.float32:
                raise TypeError(f"{name}: input {i} must be a float32 scalar, got {dtypes[i]}")
        for i in range(self.scalars, len(dtypes)):
            if element_type(dtypes[i]) not in self.tensor_dtypes:
                allowed = ", ".join(str(t) for t in self.tensor_dtypes)
                raise TypeError(f"{name}: tensor {i - self.scalars} has dtype {dtypes[i]}; "
                                f"it reads {allowed}")
        out = self.output_dtype(tuple(element_type(d) for d in dtypes[self.scalars:]))
        # A bare dtype with shape () would make GRAPH mode infer a Python scalar, not a 0-d tensor.
        if isinstance(out, (list, tuple)):
            return [mstype.TensorType(d) for d in out]
        return mstype.TensorType(out)


class FusedSquaredNorm(KernelOp):
    """``op(scale, *grads)`` -> float32 scalar ``scale**2 * sum_i sum(g_i**2)``, float64 accumulation."""

    func = "GradmonSquaredNorm"


class FusedGlobalNorm(KernelOp):
    """``op(scale, *grads)`` -> float32 scalar ``|scale| * sqrt(sum_i sum(g_i**2))``: the norm, one launch."""

    func = "GradmonNorm"


class FusedSquaredNorms(KernelOp):
    """``op(scale, *grads)`` -> float32 ``[len(grads)]``: ``scale**2 * sum(g_i**2)`` per tensor."""

    func = "GradmonSquaredNorms"

    def output_shape(self, shapes: tuple) -> Any:
        return (len(shapes),)


class FusedNormRecord(KernelOp):
    """``op(scale, loss, config, counts, *grads)`` -> ``(norm, finite, row, slot, counts_after)``: the
    norm (float32 scalar; the bits of :class:`FusedSquaredNorm` then a float32 sqrt), whether it is
    finite (bool scalar), and a history row with its counters for a step with no clipping, detector
    or loss scale, in one launch.

    ``loss``: float32 scalar; ``config``: int32 ``[2]`` = (ring rows, 1 when a non-finite step is
    skipped else 0); ``counts``: int32 ``[5]`` (steps, clipped, spikes, skipped, nonfinite). ``row`` is
    float32 ``[1, width]``: loss, norm, clip_coef 1, zscore 0, clipped 0, spike 0, skipped,
    nonfinite, then zeros; ``slot`` int32 ``[1]`` = steps mod ring rows; ``counts_after`` the counters
    with this step added. The caller writes ``row`` at ``slot`` and stores ``counts_after``.
    """

    func = "GradmonNormRecord"
    scalars = 2
    WIDTH_MIN = 8

    def __init__(self, width: int) -> None:
        if int(width) < self.WIDTH_MIN:
            raise ValueError(f"FusedNormRecord: a row has at least {self.WIDTH_MIN} columns, got {width}")
        self.width = int(width)
        super().__init__()

    def __deepcopy__(self, memo: dict) -> FusedNormRecord:
        return type(self)(self.width)

    def _infer_shape(self, *shapes):
        name = type(self).__name__
        if len(shapes) < 4:
            raise TypeError(f"{name} takes scale, loss, config, counts, then the tensors; "
                            f"got {len(shapes)} inputs")
        for i, want in ((2, (2,)), (3, (5,))):
            if tuple(shapes[i]) != want:
                raise TypeError(f"{name}: input {i} must have shape {want}, got {tuple(shapes[i])}")
        super()._infer_shape(*shapes[:2], *shapes[4:])
        return [(), (), (1, self.width), (1,), (5,)]

    def _infer_dtype(self, *dtypes):
        name = type(self).__name__
        for i in (2, 3):
            if element_type(dtypes[i]) != ms.int32:
                raise TypeError(f"{name}: input {i} must be int32, got {dtypes[i]}")
        super()._infer_dtype(*dtypes[:2], *dtypes[4:])
        return [mstype.TensorType(d) for d in (ms.float32, ms.bool_, ms.float32, ms.int32, ms.int32)]
