"""Spike-defence settings and the on-device ZClip update (see :mod:`gradmon.cells.zclip_reference`).

The device update is branch-free: every quantity is computed and ``select`` picks the right one,
so GRAPH mode compiles it into straight-line kernels without control flow or host reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
from mindspore import Tensor, ops

SPIKE_MODES = ("off", "detect", "clip", "skip")
ZSCORE_EPS = 1e-6


@dataclass(frozen=True)
class SpikeConfig:
    """Settings of the gradient-norm spike detector.

    ``mode``: ``"off"`` (no detector), ``"detect"`` (flag only), ``"clip"`` (scale the step's
    gradients to the reciprocal ZClip target, combined with a fixed ``max_norm`` as the smaller
    target) or ``"skip"`` (do not apply the step's update).
    ``warmup``: finite steps that only gather statistics (ZClip default 25).
    ``alpha``: EMA decay of mean and variance (ZClip default 0.97, an effective window of ~33 steps).
    ``z_threshold``: z-score above which a norm is a spike (ZClip default 2.5).
    """

    mode: str = "off"
    warmup: int = 25
    alpha: float = 0.97
    z_threshold: float = 2.5

    def __post_init__(self) -> None:
        if self.mode not in SPIKE_MODES:
            raise ValueError(f"spike_mode must be one of {SPIKE_MODES}, got {self.mode!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 2:
            raise ValueError(f"spike_warmup must be an int >= 2 (a variance needs two norms), "
                             f"got {self.warmup!r}")
        if not 0.0 < float(self.alpha) < 1.0:
            raise ValueError(f"spike_alpha must be in (0, 1), got {self.alpha!r}")
        if not float(self.z_threshold) > 0.0:
            raise ValueError(f"spike_z must be > 0, got {self.z_threshold!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


def zclip_update(norm: Tensor, finite: Tensor, count: Tensor, mean: Tensor, var: Tensor,
                 warmup: int, alpha: float, z_threshold: float) -> tuple:
    """One detector step on device.

    ``norm`` (float32 scalar) and ``finite`` (bool scalar) describe this step; ``count`` (int32),
    ``mean`` and ``var`` (float32; ``var`` holds Welford's M2 during warm-up) are the state before it.
    Returns ``(zscore, spike, target, new_count, new_mean, new_var)``: ``zscore`` is 0 during warm-up
    and on non-finite steps, ``target`` is the reciprocal clip target on a spike and ``norm``
    otherwise. Non-finite steps leave the state unchanged.
    """
    zero = ops.zeros_like(norm)
    one = ops.ones_like(norm)
    in_warmup = count < warmup
    active = ops.logical_and(finite, ops.logical_not(in_warmup))
    std = ops.sqrt(ops.maximum(var, zero))
    z_raw = (norm - mean) / (std + ZSCORE_EPS)
    zscore = ops.select(active, z_raw, zero)
    spike = ops.logical_and(active, zscore > z_threshold)
    z_safe = ops.select(spike, zscore, one)
    target = ops.select(spike, mean + (z_threshold * z_threshold / z_safe) * std, norm)
    # Warm-up: Welford's running mean and M2; at the last warm-up step M2 becomes the variance.
    n_new = ops.cast(count + 1, ms.float32)
    delta = target - mean
    mean_w = mean + delta / n_new
    m2_w = var + delta * (target - mean_w)
    var_w = ops.select(count + 1 == warmup, m2_w / n_new, m2_w)
    # After warm-up: exponential moving averages fed with the effective (clipped) norm.
    mean_e = alpha * mean + (1.0 - alpha) * target
    var_e = alpha * var + (1.0 - alpha) * ops.square(target - mean_e)
    new_mean = ops.select(finite, ops.select(in_warmup, mean_w, mean_e), mean)
    new_var = ops.select(finite, ops.select(in_warmup, var_w, var_e), var)
    new_count = count + ops.cast(finite, ms.int32)
    return zscore, spike, target, new_count, new_mean, new_var
