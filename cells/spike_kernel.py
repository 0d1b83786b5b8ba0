"""The spike detector's update as one fused CPU kernel, and the cell that picks it or the op path.

:func:`gradmon.cells.spike.zclip_update` builds the update from ~75 small stock kernels (two sorts,
selects, an arange...), which a sub-millisecond step feels. ``cells/csrc/spike_detector.cc`` computes
the same update (EMA z-score, Welford warm-up, the early median/MAD rule, scale and floor, ring write,
the loss test over its ring of recent losses, the learning-rate test) in one
``ops.Custom(func_type="aot")`` launch, in float32 and in the op path's order of operations, with
MindSpore's CPU ``exp`` (its polynomial, not libm's ``expf``): the same bits as the op path. It is
compiled at first use
(:mod:`gradmon.cells.fused_build`) and self-tested against :mod:`gradmon.cells.zclip_reference`
through ctypes before MindSpore ever loads it.

- :class:`SpikeDetector` ``(config)``: a Cell, ``detector(norm, finite, state, loss, lr)`` ->
  ``(zscore, spike, target, new_state, loss_spike, lr_spike)``, exactly :func:`zclip_update`'s contract. It
  runs the kernel where :func:`detector_kernel_available` is True, else :func:`zclip_update` (non-CPU
  targets, no compiler, the switches below). Build it outside the graph (a cell's ``__init__``); it works in a
  ``Cell.construct`` in GRAPH and PYNATIVE mode and inside ``@ms.jit`` functions.
- :class:`FusedSpikeUpdate`: the primitive, ``op(norm, finite, loss, lr, state, params)`` with
  ``params = kernel_params(config)``. Building it raises :class:`DetectorKernelUnavailableError`
  where the kernel is not available.

Every setting reaches the kernel from :class:`SpikeConfig` (and the modules' ``ZSCORE_EPS`` and
``TINY_NORM``) through :func:`kernel_params`, at build time: the C++ holds no constant of the rule.

Environment: ``GRADMON_FUSED_DETECTOR=0`` turns this kernel off; ``GRADMON_FUSED_NORM=0`` turns off
every gradmon kernel, this one included. Neither warns. A build failure warns once per process
(:class:`DetectorKernelFallbackWarning`) and the op path is used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype

from ._compat import mindspore_version
from .fused_build import (
    CXX_FLAGS,
    KernelBuildError,
    KernelLibrary,
    call_aot,
    element_type,
)
from .fused_norm import ENV_SWITCH as NORM_ENV_SWITCH
from .spike import ZSCORE_EPS, SpikeConfig, initial_state, zclip_update
from .zclip_reference import TINY_NORM, zclip_run

ENV_SWITCH = "GRADMON_FUSED_DETECTOR"
SOURCE = Path(__file__).resolve().parent / "csrc" / "spike_detector.cc"
LIBRARY_NAME = "gradmon_spike_detector"
ABI_VERSION = 3
# No fused multiply-add contraction: the kernel rounds each operation as the op path's kernels do.
FLAGS = (*CXX_FLAGS, "-ffp-contract=off")
# The kernel's `params` input, in cells/csrc/spike_detector.cc's order (enum Param).
PARAM_NAMES = ("warmup", "one_minus_alpha", "z", "z_squared", "eps", "tiny", "window", "early_min",
               "early_z", "log_lo", "log_hi", "floor", "loss_window", "loss_min", "loss_ratio", "loss_floor",
               "lr_ratio", "lr_min")


class DetectorKernelUnavailableError(RuntimeError):
    """A :class:`FusedSpikeUpdate` was built where the kernel is not available (the message says why)."""


class DetectorKernelFallbackWarning(RuntimeWarning):
    """The detector kernel could not be built; the op path (:func:`zclip_update`) is used instead."""


def kernel_params(config: SpikeConfig) -> np.ndarray:
    """The kernel's float32 constants for ``config``: the op path's (``1 - alpha`` and ``z * z``
    from :meth:`SpikeConfig.float32_constants`, as :class:`SpikeDetector` passes them to it)."""
    early = config.early_rule()
    window, early_min, early_z, log_lo, log_hi, floor = early if early else (0, 0, 0.0, 0.0, 0.0, 0.0)
    loss_window, loss_min, loss_ratio, loss_floor = config.loss_rule() or (0, 0, 0.0, 0.0)
    lr_min, lr_ratio = config.lr_rule() or (0, 0.0)
    one_minus_alpha, z_squared = config.float32_constants()
    values = {"warmup": config.warmup, "one_minus_alpha": one_minus_alpha, "z": config.z_threshold,
              "z_squared": z_squared,
              "eps": ZSCORE_EPS, "tiny": TINY_NORM, "window": window, "early_min": early_min,
              "early_z": early_z, "log_lo": log_lo, "log_hi": log_hi, "floor": floor,
              "loss_window": loss_window, "loss_min": loss_min, "loss_ratio": loss_ratio,
              "loss_floor": loss_floor, "lr_ratio": lr_ratio, "lr_min": lr_min}
    return np.array([values[name] for name in PARAM_NAMES], np.float32)


def disabled_by_env() -> str | None:
    """The switch that turns the kernel off (``NAME=value``), or ``None``."""
    for name in (ENV_SWITCH, NORM_ENV_SWITCH):
        if os.environ.get(name, "").strip().lower() in ("0", "off", "false", "no"):
            return f"{name}={os.environ[name]}"
    return None


def _run_library(library: Path, config: SpikeConfig, norms: list[float], losses: list[float],
                 lrs: list[float] | None = None) -> list[tuple[float, bool, float, bool, bool]]:
    """The kernel over ``norms``, ``losses`` and ``lrs`` (default: 0, no rate) through ctypes (no
    MindSpore): ``(zscore, spike, target, loss_spike, lr_spike)`` per step."""
    params = kernel_params(config)
    state = initial_state(config)
    lrs = [0.0] * len(norms) if lrs is None else lrs
    out = []
    for value, loss, lr in zip(norms, losses, lrs):
        z, spike, target = np.zeros((), np.float32), np.zeros((), np.bool_), np.zeros((), np.float32)
        loss_spike, lr_spike = np.zeros((), np.bool_), np.zeros((), np.bool_)
        new_state = np.zeros_like(state)
        rc = call_aot(library, "GradmonSpikeUpdate",
                      [np.array(value, np.float32), np.array(np.isfinite(value)), np.array(loss, np.float32),
                       np.array(lr, np.float32), state, params],
                      [z, spike, target, new_state, loss_spike, lr_spike])
        if rc != 0:
            raise KernelBuildError(f"{library}: GradmonSpikeUpdate returned {rc}")
        state = new_state
        out.append((float(z), bool(spike), float(target), bool(loss_spike), bool(lr_spike)))
    return out


# Warm-up of 8 with a ring of 4 judged from the 3rd norm: an early spike (step 5), a non-finite step,
# the ring's wrap-around, the hand-over to ZClip and a ZClip spike (step 12); a loss ring of 3 judged
# from the 3rd loss: a loss-only spike (step 10, a NaN loss before it); rates ramping 2x per step, a
# NaN rate, and x100 at step 8 (an lr spike).
_SELF_TEST_NORMS = [1.0, 1.2, 0.9, 1.1, 50.0, float("nan"), 1.05, 0.95, 1.1, 1.0, 1.02, 40.0, 1.01]
_SELF_TEST_LOSSES = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.5, float("nan"), 1.4, 90.0, 1.3, 1.3, 1.2]
_SELF_TEST_LRS = [1e-4, 2e-4, 4e-4, 8e-4, 1e-3, float("nan"), 1e-3, 0.1, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]
_SELF_TEST_CONFIG = SpikeConfig(mode="detect", warmup=8, alpha=0.9, z_threshold=3.0, early_window=4,
                                early_min=2, loss_window=3, loss_min=2, loss_ratio=20.0)


def _self_test(library: Path) -> None:
    """The library against the numpy reference on a short series: a wrong ABI or a miscompile stops here."""
    abi = call_aot(library, "GradmonSpikeDetectorAbi", None, None)
    if abi != ABI_VERSION:
        raise KernelBuildError(f"{library} has kernel ABI {abi}, expected {ABI_VERSION}")
    config = _SELF_TEST_CONFIG
    got = _run_library(library, config, _SELF_TEST_NORMS, _SELF_TEST_LOSSES, _SELF_TEST_LRS)
    ref, _ = zclip_run(_SELF_TEST_NORMS, warmup=config.warmup, alpha=config.alpha,
                       z_threshold=config.z_threshold, early=config.reference_rule(),
                       losses=_SELF_TEST_LOSSES, loss_rule=config.reference_loss_rule(), lrs=_SELF_TEST_LRS,
                       lr_rule=config.reference_lr_rule())
    flags = [(spike, loss_spike, lr_spike) for _, spike, _, loss_spike, lr_spike in got]
    expected = [(step.spike, step.loss_spike, step.lr_spike) for step in ref]
    close = all(np.isclose(z, r.zscore, rtol=1e-4, atol=1e-5) and
                (np.isclose(t, r.target, rtol=1e-4) or (np.isnan(t) and np.isnan(r.target)))
                for (z, _, t, _, _), r in zip(got, ref))
    if flags != expected or not close or flags[4] != (True, False, False) \
            or flags[11] != (True, False, False) or flags[9] != (True, True, False) \
            or flags[7] != (False, False, True):
        raise KernelBuildError(f"{library} failed its self-test (spikes {flags}, expected {expected}; "
                               f"values close: {close})")


_LIBRARY = KernelLibrary(SOURCE, LIBRARY_NAME, _self_test, "the fused spike-detector kernel is not "
                         "available, using the stock-op detector instead", DetectorKernelFallbackWarning,
                         FLAGS)


def detector_kernel_unavailable_reason() -> str | None:
    """Why :func:`detector_kernel_available` is False (``None`` when True). May build the library."""
    switch = disabled_by_env()
    if switch:
        return f"{switch} turns the fused detector kernel off"
    target = ms.get_context("device_target")
    if target != "CPU":
        return f"the fused detector kernel runs on CPU only (device_target is {target})"
    return _LIBRARY.unavailable_reason(mindspore_version())


def detector_kernel_available() -> bool:
    """True when the fused detector kernel can be used now (CPU target, library built and self-tested)."""
    return detector_kernel_unavailable_reason() is None


def library_path() -> Path | None:
    """The compiled library in use, or ``None`` when the kernel is not available."""
    return None if detector_kernel_unavailable_reason() else _LIBRARY.path


class FusedSpikeUpdate(ops.Custom):
    """``op(norm, finite, loss, lr, state, params)`` -> ``(zscore, spike, target, new_state, loss_spike,
    lr_spike)``: the detector's whole update in one launch. ``norm``, ``loss`` and ``lr`` float32,
    ``finite`` bool, shape ``()`` or ``(1,)``; ``state`` float32 (:func:`initial_state`); ``params``
    :func:`kernel_params` of the same config. The outputs have the norm's shape (``new_state`` the
    state's); dtypes float32, bool, float32, float32, bool, bool."""

    def __new__(cls, *args: Any, **kwargs: Any) -> FusedSpikeUpdate:
        # Refused before the object exists: a half-built Primitive crashes when printed (a traceback).
        reason = detector_kernel_unavailable_reason()
        if reason is not None:
            raise DetectorKernelUnavailableError(f"the fused detector kernel is not available: {reason}")
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__(f"{_LIBRARY.path}:GradmonSpikeUpdate", out_shape=self._infer_shape,
                         out_dtype=self._infer_dtype, func_type="aot")

    def __deepcopy__(self, memo: dict) -> FusedSpikeUpdate:
        # Primitive's deepcopy re-calls __init__ with its init_attrs ({"name": "Custom"}); ours takes none.
        return type(self)()

    @staticmethod
    def _infer_shape(norm, finite, loss, lr, state, params):
        for what, shape in (("norm", norm), ("finite", finite), ("loss", loss), ("lr", lr)):
            if tuple(shape) not in ((), (1,)):
                raise TypeError(f"FusedSpikeUpdate: {what} must have shape () or (1,), got {tuple(shape)}")
        if len(state) != 1 or len(params) != 1 or params[0] != len(PARAM_NAMES):
            raise TypeError(f"FusedSpikeUpdate: state must be a vector and params kernel_params(config) "
                            f"({len(PARAM_NAMES)},), got {tuple(state)} and {tuple(params)}")
        scalar = list(norm)
        return [scalar, scalar, scalar, list(state), scalar, scalar]

    @staticmethod
    def _infer_dtype(norm, finite, loss, lr, state, params):
        expected = (ms.float32, ms.bool_, ms.float32, ms.float32, ms.float32, ms.float32)
        for what, dtype, want in zip(("norm", "finite", "loss", "lr", "state", "params"),
                                     (norm, finite, loss, lr, state, params), expected):
            if element_type(dtype) != want:
                raise TypeError(f"FusedSpikeUpdate: {what} must be {want}, got {dtype}")
        # TensorTypes, not bare dtypes: a bare dtype of shape () would make GRAPH mode infer a Python scalar.
        return [mstype.TensorType(d) for d in (ms.float32, ms.bool_, ms.float32, ms.float32, ms.bool_,
                                               ms.bool_)]


class SpikeDetector(nn.Cell):
    """``detector(norm, finite, state, loss, lr=None)`` -> ``(zscore, spike, target, new_state,
    loss_spike, lr_spike)`` for ``config`` (:func:`zclip_update`'s contract; ``loss``: the step's
    float32 scalar loss, read only with the loss test; ``lr``: the rate this step's update uses, a
    float32 scalar, needed with the learning-rate test): the fused kernel when available, else the
    op path.

    ``fused``: ``None`` (default) picks; ``True`` requires the kernel
    (:class:`DetectorKernelUnavailableError` otherwise); ``False`` is the op path. ``self.fused`` says
    which runs. The caller assigns ``new_state`` (one ``ops.assign``)."""

    def __init__(self, config: SpikeConfig, fused: bool | None = None) -> None:
        super().__init__()
        self.config = config
        if fused is None:
            fused = detector_kernel_available()
        self.fused = bool(fused)
        # Plain Python numbers and tuples are constants in GRAPH mode.
        self.warmup, self.alpha, self.z_threshold = config.warmup, config.alpha, config.z_threshold
        self.early = config.early_rule()
        self.loss_rule = config.loss_rule()
        self.lr_rule = config.lr_rule()
        self.constants = config.float32_constants()
        self._no_lr = Tensor(0.0, ms.float32)  # the kernel's lr input when the lr test is off
        if self.fused:
            self.kernel = FusedSpikeUpdate()
            self.params = Tensor(kernel_params(config))

    def construct(self, norm, finite, state, loss, lr=None):
        if lr is None:
            if self.lr_rule:
                raise ValueError("SpikeDetector: the learning-rate test (spike_lr_ratio > 0) needs the "
                                 "step's learning rate (lr=...)")
            lr = self._no_lr
        if self.fused:
            return self.kernel(norm, finite, loss, lr, state, self.params)
        return zclip_update(norm, finite, state, self.warmup, self.alpha, self.z_threshold, self.early, loss,
                            self.loss_rule, self.constants, lr, self.lr_rule)


__all__ = ["DetectorKernelFallbackWarning", "DetectorKernelUnavailableError", "FusedSpikeUpdate",
           "SpikeDetector", "detector_kernel_available", "detector_kernel_unavailable_reason",
           "kernel_params", "library_path"]
