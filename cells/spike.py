"""Spike-defence settings and the on-device detector update (see :mod:`gradmon.cells.zclip_reference`):
ZClip's EMA z-score, and during its warm-up an early rule on the median and MAD of a small ring
of log-norms, so the first steps are defended too.

The device update is branch-free: every quantity is computed and ``select`` picks the right one,
so GRAPH mode compiles it into straight-line kernels without control flow or host reads. On CPU the
step cell runs the same update as one fused kernel instead (:mod:`gradmon.cells.spike_kernel`);
:func:`zclip_update` is its fallback elsewhere, and the statement both are tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from .zclip_reference import (
    EARLY_FLOOR,
    EARLY_MAX_RATIO,
    EARLY_MIN,
    EARLY_MIN_RATIO,
    EARLY_WINDOW,
    EARLY_Z,
    LOSS_FLOOR,
    LOSS_MIN,
    LOSS_RATIO,
    LOSS_WINDOW,
    LR_MIN,
    LR_RATIO,
    MAD_SIGMA,
    TINY_NORM,
    EarlyRule,
    LossRule,
    LrRule,
)

SPIKE_MODES = ("off", "detect", "clip", "skip")
ZSCORE_EPS = 1e-6
_BIG = 3.0e38  # an empty ring slot: sorts after every log-norm


@dataclass(frozen=True)
class SpikeConfig:
    """Settings of the gradient-norm spike detector.

    ``mode``: ``"off"`` (no detector), ``"detect"`` (flag only), ``"clip"`` (scale the step's
    gradients to the reciprocal ZClip target, combined with a fixed ``max_norm`` as the smaller
    target) or ``"skip"`` (do not apply the step's update).
    ``warmup``: finite steps that gather the EMA's statistics while the early rule judges (100;
    ZClip's paper: 25, undefended).
    ``alpha``: EMA decay of mean and variance (0.99, a ~100-step memory; ZClip: 0.97).
    ``z_threshold``: z-score above which a norm is a spike (7.5; ZClip: 2.5).
    ``early_window``: log-norms in the ring of the early rule, which judges during the warm-up
    (16; 0: no early rule, the warm-up is undefended as in ZClip). ``early_min``: finite norms
    before it judges (4: from the 5th step on). A norm is an early spike when its log is above
    the ring's median by more than ``early_z`` (3.0) robust sigmas (1.4826 x MAD), bounded to
    ``[log(early_min_ratio), log(early_max_ratio)]`` (4x and 8x the median). ``floor``: a norm
    at most this fraction of the run's scale (the largest median of the ring so far) is never a
    spike, in either rule (needs the early ring). 0 (off) by default: measured, the flags it
    removes at a converged Adam run's noise floor are what kept that run converged.
    ``loss_window``: losses in the ring of the loss test (16; 0: no loss test). From the
    ``loss_min``-th finite loss on (4), a step whose loss is above the ring's median by more than
    ``loss_ratio`` (150) times the median's magnitude and by more than ``loss_floor`` (0.01) times
    the run's loss scale (the largest such magnitude so far) is a spike too, whatever its norm: a
    corrupted batch can leave the norm ordinary (Adam, late in training) and the loss 400x. On such
    a loss-only spike ``clip`` scales the gradients to the norm's running level (the detector's
    mean; never up) and ``skip`` skips the step. The step's loss must be passed
    (``MonitoredTrainStep`` does; it is the unscaled loss, the micro-batches' mean under accumulation).
    ``lr_ratio``: the learning-rate test (10; 0: off). From the ``lr_min + 1``-th step with a finite
    rate > 0 (4: the 5th), a step whose learning rate is more than ``lr_ratio`` times the largest rate
    of the run's earlier steps is a spike, whatever its gradient (one step at lr x100 moves Adam's
    weights 100x). The largest rate takes every finite rate, flagged or not: a deliberate change of
    the schedule is flagged once; warm-up ramps (<= 2x per step) and warm restarts (back to a rate
    already seen) never trip it. ``skip`` skips such a step; ``clip`` and ``detect`` only flag it
    (clipping the gradient cannot bound an Adam step's size). ``MonitoredTrainStep`` passes the rate
    its optimizer uses this step, and turns the test off when it cannot read it.

    The defaults are measured (docs/cells.md, "Why these defaults"): ZClip's own flag 3-6 % of the
    ordinary steps of small-data CPU runs; these flag none of the suite's clean steps after step 10
    and 0.18 % of the steps of a 20k-step run at its noise floor (benchmarks/ALARMS.md).
    """

    mode: str = "off"
    warmup: int = 100
    alpha: float = 0.99
    z_threshold: float = 7.5
    early_window: int = EARLY_WINDOW
    early_min: int = EARLY_MIN
    early_z: float = EARLY_Z
    early_min_ratio: float = EARLY_MIN_RATIO
    early_max_ratio: float = EARLY_MAX_RATIO
    floor: float = EARLY_FLOOR
    loss_window: int = LOSS_WINDOW
    loss_min: int = LOSS_MIN
    loss_ratio: float = LOSS_RATIO
    loss_floor: float = LOSS_FLOOR
    lr_ratio: float = LR_RATIO
    lr_min: int = LR_MIN

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
        for name, low in (("early_window", 0), ("early_min", 1), ("loss_window", 0), ("loss_min", 1),
                          ("lr_min", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"spike_{name} must be an int >= {low}, got {value!r}")
        if not 0.0 < float(self.loss_ratio) < math.inf:
            raise ValueError(f"spike_loss_ratio must be a finite number > 0, got {self.loss_ratio!r}")
        if not 0.0 <= float(self.loss_floor) < math.inf:
            raise ValueError(f"spike_loss_floor must be a finite number >= 0, got {self.loss_floor!r}")
        if not (float(self.lr_ratio) == 0.0 or 1.0 < float(self.lr_ratio) < math.inf):
            raise ValueError(f"spike_lr_ratio must be 0 (off) or a finite number > 1, got {self.lr_ratio!r}")
        if not 0.0 <= float(self.floor) < 1.0:
            raise ValueError(f"spike_floor must be in [0, 1), got {self.floor!r}")
        if not float(self.early_z) >= 0.0:
            raise ValueError(f"spike_early_z must be >= 0, got {self.early_z!r}")
        if not 1.0 < float(self.early_min_ratio) <= float(self.early_max_ratio) < math.inf:
            raise ValueError("spike_early_min_ratio and spike_early_max_ratio must satisfy "
                             f"1 < min <= max < inf, got {self.early_min_ratio!r}, {self.early_max_ratio!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def float32_constants(self) -> tuple[float, float]:
        """``(1 - alpha, z * z)`` as float32 values (Python floats holding them exactly), computed in
        float32 as GRAPH mode folds the Python expressions: the op path in both modes and the kernel
        use these, so they round alike (PYNATIVE would round the float64 result: 10 ulps apart for
        alpha 0.99)."""
        return ema_constants(self.alpha, self.z_threshold)

    def reference_rule(self) -> EarlyRule:
        """The early rule's settings for :mod:`gradmon.cells.zclip_reference`."""
        return EarlyRule(self.early_window, self.early_min, self.early_z, self.early_min_ratio,
                         self.early_max_ratio, self.floor)

    def reference_loss_rule(self) -> LossRule:
        """The loss test's settings for :mod:`gradmon.cells.zclip_reference`."""
        return LossRule(self.loss_window, self.loss_min, self.loss_ratio, self.loss_floor)

    def reference_lr_rule(self) -> LrRule:
        """The learning-rate test's settings for :mod:`gradmon.cells.zclip_reference`."""
        return LrRule(float(self.lr_ratio), self.lr_min)

    def lr_rule(self) -> tuple:
        """The learning-rate test's constants for :func:`zclip_update` (``()``: off): ``(min, ratio)``."""
        if not self.lr_ratio:
            return ()
        return (self.lr_min, float(self.lr_ratio))

    def loss_rule(self) -> tuple:
        """The loss test's constants for :func:`zclip_update` (``()``: off): ``(window, min, ratio,
        floor)``, plain Python numbers (GRAPH constants)."""
        if not self.loss_window:
            return ()
        return (self.loss_window, self.loss_min, self.loss_ratio, self.loss_floor)

    def early_rule(self) -> tuple:
        """The early rule's constants for :func:`zclip_update` (``()``: off): ``(window, min,
        early_z * 1.4826, log(min_ratio), log(max_ratio), floor)``, plain Python numbers (GRAPH
        constants)."""
        if not self.early_window:
            return ()
        return (self.early_window, self.early_min, self.early_z * MAD_SIGMA, math.log(self.early_min_ratio),
                math.log(self.early_max_ratio), self.floor)


def ema_constants(alpha: float, z_threshold: float) -> tuple[float, float]:
    """``(1 - alpha, z_threshold ** 2)`` computed in float32 (see :meth:`SpikeConfig.float32_constants`)."""
    one_minus_alpha = np.float32(1.0) - np.float32(alpha)
    z = np.float32(z_threshold)
    return float(one_minus_alpha), float(z * z)


def norm_state_size(early_window: int) -> int:
    """Floats of the norm tests' part of the state: ``[count, mean, var]`` (+ ``[scale, ring...]``)."""
    return 3 + (1 + early_window if early_window else 0)


def initial_state(config: SpikeConfig) -> np.ndarray:
    """The detector's state before the first step: ``[count, mean, var]``, then with the early
    rule the run's scale and the ring of ``early_window`` log-norms, then with the loss test
    ``[loss_count, loss_scale]`` and the ring of ``loss_window`` losses, then with the learning-rate
    test ``[lr_count, lr_top]`` (all zeros; the counts say which slots hold values)."""
    loss = 2 + config.loss_window if config.loss_window else 0
    lr = 2 if config.lr_ratio else 0
    return np.zeros(norm_state_size(config.early_window) + loss + lr, np.float32)


def _median_of_first(sorted_values: Tensor, n: Tensor, slots: Tensor) -> Tensor:
    """The median of the ``n`` smallest of ``sorted_values`` (ascending): the mean of the values at
    ``(n - 1) // 2`` and ``n // 2``, picked by masks (no indexing by a tensor, no branch)."""
    lo = ops.maximum(ops.floor((n - 1.0) * 0.5), 0.0)
    hi = ops.floor(n * 0.5)
    weights = 0.5 * (ops.cast(ops.equal(slots, lo), ms.float32) + ops.cast(ops.equal(slots, hi), ms.float32))
    return ops.reduce_sum(ops.select(weights > 0.0, sorted_values, ops.zeros_like(sorted_values)) * weights)


def _early_rule(norm: Tensor, count: Tensor, ring: Tensor, z_threshold: float, early: tuple) -> tuple:
    """The early rule on device (see :mod:`gradmon.cells.zclip_reference`):
    ``(zscore, spike, target, median)`` against the ring's median and MAD; ``early`` is
    :meth:`SpikeConfig.early_rule`."""
    window, _, z, lo, hi, _ = early
    slots = ops.cast(ops.arange(window), ms.float32)
    n = ops.minimum(count, float(window))
    filled = slots < n  # the ring fills slot by slot; after `window` norms every slot holds one
    big = ops.fill(ms.float32, (window,), _BIG)
    med = _median_of_first(ops.sort(ops.select(filled, ring, big))[0], n, slots)
    spread = ops.select(filled, ops.abs(ring - med), big)
    mad = _median_of_first(ops.sort(spread)[0], n, slots)
    thr = ops.minimum(ops.maximum(z * mad, lo), hi)
    log_norm = ops.log(ops.maximum(norm, TINY_NORM))
    dev = log_norm - med
    spike = dev > thr
    zscore = z_threshold * dev / thr
    # On a spike dev > thr > 0; elsewhere the quotient is discarded by select.
    target = ops.select(spike, ops.exp(med + thr * thr / ops.maximum(dev, thr)), norm)
    return zscore, spike, target, med


def _loss_update(loss: Tensor, counted: Tensor, part: Tensor, rule: tuple) -> tuple:
    """The loss test on device: ``(loss_spike, new_part)`` for the state's loss part ``part``
    (``[loss_count, loss_scale, ring...]``; see :mod:`gradmon.cells.zclip_reference`); ``rule`` is
    :meth:`SpikeConfig.loss_rule`. The part moves on the steps ``counted`` (finite, a nonzero norm)
    with a finite loss."""
    window, min_history, ratio, floor = rule
    count, scale, ring = part[0], part[1:2], part[2:]
    ok = ops.logical_and(counted, ops.isfinite(loss))
    judged = ops.logical_and(ok, count >= min_history)
    slots = ops.cast(ops.arange(window), ms.float32)
    n = ops.minimum(count, float(window))
    # Empty slots sort last: inf is above every finite loss (the median reads only the n filled).
    empty = ops.fill(ms.float32, (window,), math.inf)
    med = _median_of_first(ops.sort(ops.select(slots < n, ring, empty))[0], n, slots)
    size = ops.abs(med)
    scale = ops.select(judged, ops.maximum(scale, size), scale)  # (shape (1,))
    dev = loss - med
    spike = ops.logical_and(judged, ops.logical_and(dev > ratio * size, dev > floor * scale[0]))
    slot = count - ops.floor(count / window) * window  # count mod window: the oldest slot
    new_ring = ops.select(ops.equal(slots, slot), ops.broadcast_to(loss, (window,)), ring)
    new_part = ops.concat((ops.stack((count + 1.0,)), scale, new_ring))
    return spike, ops.select(ops.broadcast_to(ok, (2 + window,)), new_part, part)


def _lr_update(lr: Tensor, finite: Tensor, part: Tensor, rule: tuple) -> tuple:
    """The learning-rate test on device: ``(lr_spike, new_part)`` for the state's lr part
    ``[lr_count, lr_top]`` (see :mod:`gradmon.cells.zclip_reference`); ``rule`` is
    :meth:`SpikeConfig.lr_rule`. The part moves on every step whose rate is finite and > 0."""
    min_history, ratio = rule
    count, top = part[0], part[1]
    ok = ops.logical_and(ops.isfinite(lr), lr > 0.0)
    judged = ops.logical_and(ops.logical_and(ok, finite), count >= min_history)
    spike = ops.logical_and(judged, lr > ratio * top)
    new_part = ops.stack((count + 1.0, ops.maximum(top, lr)))
    return spike, ops.select(ops.broadcast_to(ok, (2,)), new_part, part)


def zclip_update(norm: Tensor, finite: Tensor, state: Tensor, warmup: int, alpha: float,
                 z_threshold: float, early: tuple = (), loss: Tensor | None = None,
                 loss_rule: tuple = (), constants: tuple = (), lr: Tensor | None = None,
                 lr_rule: tuple = ()) -> tuple:
    """One detector step on device.

    ``norm`` (float32 scalar) and ``finite`` (bool scalar) describe this step; ``state`` is the
    float32 vector ``[count, mean, var, scale, ring...]`` before it (:func:`initial_state`; ``count``:
    finite nonzero norms seen; float32 is exact far beyond any warm-up length, and past 2**24 only the
    comparisons with ``warmup`` and the ring's length matter). ``early`` is
    :meth:`SpikeConfig.early_rule` (empty: no early rule, and ``state`` is ``[count, mean, var]``).
    Returns ``(zscore, spike, target, new_state, loss_spike, lr_spike)``: ``target`` is the clip
    target on a spike and ``norm`` otherwise; ``loss_spike`` says the loss test tripped (``spike`` is
    then True); ``lr_spike`` that the learning-rate test did (``spike`` does not include it: an lr
    spike has no clip target).
    Non-finite steps leave the state unchanged; a zero norm (at most ``TINY_NORM``) moves only the
    learning-rate test's part. ``constants``: :func:`ema_constants` ``(alpha,
    z_threshold)``, computed outside the graph (:class:`~gradmon.cells.spike_kernel.SpikeDetector`
    passes them); without them ``1 - alpha`` and ``z * z`` are Python arithmetic, which GRAPH mode
    folds in float32 and PYNATIVE in float64.

    ``loss`` (float32 scalar, the step's loss) and ``loss_rule`` (:meth:`SpikeConfig.loss_rule`)
    add the loss test; its part of the state, ``[loss_count, loss_scale, loss ring...]``, follows
    the norm tests' and moves on finite steps with a nonzero norm whose loss is finite. A step it
    flags that the norm tests do not gets the target ``min(norm, mean)``. ``lr`` (float32 scalar, the
    rate this step's update uses) and ``lr_rule`` (:meth:`SpikeConfig.lr_rule`) add the learning-rate
    test; its part, ``[lr_count, lr_top]``, comes last.

    During the EMA's warm-up the early rule judges (from its ``min_history``-th norm on): the
    ring's median and MAD of log-norms. Warm-up and EMA share one recursion,
    ``mean += w * (g - mean)`` and ``var += w * (e * d - var)`` with ``e = g - mean_new``: during
    warm-up ``w = 1 / n`` and ``d = g - mean_old`` (Welford's population mean and variance, so
    ``var`` is already the warm-up variance when the EMA takes over); afterwards ``w = 1 - alpha``
    and ``d = e`` (ZClip's EMA). ``g`` is the effective norm. Straight-line kernels, no branches:
    everything is computed and ``select`` picks.
    """
    if loss_rule and loss is None:
        raise ValueError("zclip_update: the loss test (loss_rule) needs the step's loss")
    if lr_rule and lr is None:
        raise ValueError("zclip_update: the learning-rate test (lr_rule) needs the step's learning rate")
    one_minus_alpha, z_squared = constants if constants else (1.0 - alpha, z_threshold * z_threshold)
    norm_size = norm_state_size(early[0] if early else 0)
    count, mean, var, scale, ring = state[0], state[1], state[2], state[3:4], state[4:norm_size]
    in_warmup = count < warmup
    # A zero norm (at most TINY_NORM): no test but the lr test judges or learns it (zclip_reference).
    learns = ops.logical_and(finite, norm > TINY_NORM)
    active = ops.logical_and(learns, count >= warmup)
    std = ops.sqrt(var)
    z_raw = (norm - mean) / (std + ZSCORE_EPS)
    spike = ops.logical_and(active, z_raw > z_threshold)
    zscore = ops.select(active, z_raw, ops.zeros_like(norm))
    # On a spike z_raw > z_threshold > 0; elsewhere the quotient is discarded by select.
    clip_target = mean + z_squared * std / z_raw
    if early:
        early_z, early_spike, early_target, med = _early_rule(norm, count, ring, z_threshold, early)
        has_ring = count >= early[1]
        scale = ops.select(has_ring, ops.maximum(scale, ops.exp(med)), scale)  # (shape (1,))
        # floor 0 is no floor (the kernel's test too: 0 * an overflowed scale would be NaN)
        floor_level = early[5] * scale[0] if early[5] > 0.0 else 0.0
        above_floor = ops.logical_not(has_ring) | (norm > floor_level)
        spike = ops.logical_and(spike, above_floor)
        judged = ops.logical_and(ops.logical_and(learns, in_warmup), has_ring)
        early_spike = ops.logical_and(ops.logical_and(judged, early_spike), above_floor)
        zscore = ops.select(judged, early_z, zscore)
        # (ZClip's target once the floor has spoken: an outlier under it is no spike, its own target)
        target = ops.select(early_spike, early_target, ops.select(spike, clip_target, norm))
        spike = ops.logical_or(spike, early_spike)
    else:
        target = ops.select(spike, clip_target, norm)
    loss_spike = ops.zeros_like(finite)
    lr_spike = ops.zeros_like(finite)
    loss_end = norm_size + (2 + loss_rule[0] if loss_rule else 0)
    loss_part = state[norm_size:loss_end]  # the loss test's state (empty without it), unchanged unless below
    if loss_rule:
        loss_spike, loss_part = _loss_update(loss, learns, loss_part, loss_rule)
        # A loss-only spike is clipped to the norm's running level (never up).
        target = ops.select(ops.logical_and(loss_spike, ops.logical_not(spike)), ops.minimum(norm, mean),
                            target)
        spike = ops.logical_or(spike, loss_spike)
    weight = ops.select(in_warmup, 1.0 / (count + 1.0), ops.fill(ms.float32, (), one_minus_alpha))
    delta = target - mean
    new_mean = mean + weight * delta
    err = target - new_mean
    new_var = var + weight * (err * ops.select(in_warmup, delta, err) - var)
    stats = ops.stack((count + 1.0, new_mean, new_var))
    if early:
        window = early[0]
        slot = count - ops.floor(count / window) * window  # count mod window: the oldest slot
        here = ops.equal(ops.cast(ops.arange(window), ms.float32), slot)
        logged = ops.broadcast_to(ops.log(ops.maximum(target, TINY_NORM)), (window,))
        new_ring = ops.select(here, logged, ring)
        stats = ops.concat((stats, scale, new_ring))
    if not loss_rule and not lr_rule:
        new_state = ops.select(ops.broadcast_to(learns, (norm_size,)), stats, state)
        return zscore, spike, target, new_state, loss_spike, lr_spike
    parts = (ops.select(ops.broadcast_to(learns, (norm_size,)), stats, state[:norm_size]),)
    if loss_rule:
        parts = parts + (loss_part,)  # noqa: RUF005
    if lr_rule:
        lr_spike, lr_part = _lr_update(lr, finite, state[loss_end:], lr_rule)
        parts = parts + (lr_part,)  # noqa: RUF005
    return zscore, spike, target, ops.concat(parts), loss_spike, lr_spike
