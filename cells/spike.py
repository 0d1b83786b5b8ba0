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
    ``warmup``: finite steps that only gather statistics (50; ZClip's paper: 25).
    ``alpha``: EMA decay of mean and variance (0.99, a ~100-step memory; ZClip: 0.97).
    ``z_threshold``: z-score above which a norm is a spike (5.0; ZClip: 2.5).

    The defaults are measured (docs/cells.md, "Why these defaults"): ZClip's own flag 3-6 % of the
    ordinary steps of small-data CPU runs; these flag at most 0.6 % after the warm-up.
    """

    mode: str = "off"
    warmup: int = 50
    alpha: float = 0.99
    z_threshold: float = 5.0

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


def zclip_update(norm: Tensor, finite: Tensor, state: Tensor, warmup: int, alpha: float,
                 z_threshold: float) -> tuple:
    """One detector step on device.

    ``norm`` (float32 scalar) and ``finite`` (bool scalar) describe this step; ``state`` is the
    float32 vector ``[count, mean, var]`` before it (``count``: finite steps seen; float32 is exact
    far beyond any warm-up length, and past 2**24 only the comparison with ``warmup`` matters).
    Returns ``(zscore, spike, target, new_state)``: ``zscore`` is 0 during warm-up and on
    non-finite steps, ``target`` is the reciprocal clip target on a spike and ``norm`` otherwise.
    Non-finite steps leave the state unchanged.

    Warm-up and EMA share one recursion, ``mean += w * (g - mean)`` and
    ``var += w * (e * d - var)`` with ``e = g - mean_new``: during warm-up ``w = 1 / n`` and
    ``d = g - mean_old`` (Welford's population mean and variance, so ``var`` is already the
    warm-up variance when the EMA takes over); afterwards ``w = 1 - alpha`` and ``d = e`` (ZClip's
    EMA). About 30 scalar kernels, no branches.
    """
    count, mean, var = state[0], state[1], state[2]
    in_warmup = count < warmup
    active = ops.logical_and(finite, count >= warmup)
    std = ops.sqrt(var)
    z_raw = (norm - mean) / (std + ZSCORE_EPS)
    spike = ops.logical_and(active, z_raw > z_threshold)
    zscore = ops.select(active, z_raw, ops.zeros_like(norm))
    # On a spike z_raw > z_threshold > 0; elsewhere the quotient is discarded by select.
    target = ops.select(spike, mean + (z_threshold * z_threshold) * std / z_raw, norm)
    weight = ops.select(in_warmup, 1.0 / (count + 1.0), ops.fill(ms.float32, (), 1.0 - alpha))
    delta = target - mean
    new_mean = mean + weight * delta
    err = target - new_mean
    new_var = var + weight * (err * ops.select(in_warmup, delta, err) - var)
    new_state = ops.select(ops.broadcast_to(finite, (3,)), ops.stack((count + 1.0, new_mean, new_var)), state)
    return zscore, spike, target, new_state
