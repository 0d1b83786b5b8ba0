"""Pure-numpy reference of the spike detector the train step runs on device.

This is the specification the device code (:func:`gradmon.cells.spike.zclip_update`) is tested
against, and a readable statement of the rule. Two tests share one state:

* Only finite norms above ``TINY_NORM`` count. Non-finite steps change nothing, nor do steps with a
  zero norm (no gradient at all: a frozen stretch, a batch whose loss reaches no trained weight, or
  whose every label is masked), which neither the norm tests nor the loss test judge or learn: such
  a step's update has nothing to defend, its norm says nothing of the gradient's scale and its loss
  may be a placeholder (0). Learnt, five zero norms at a run's start would put the ring's median at
  log(1e-30), where every later norm is a spike clipped back to about that, for good; five zero
  losses would make the first real losses loss spikes. The learning-rate test judges them as any
  finite step (an Adam step still moves the weights).
* **Early rule** (the EMA's warm-up, from the ``early_min``-th finite norm on): a ring keeps the
  logs of the last ``early_window`` effective norms. With ``m`` and ``mad`` the median and the
  median absolute deviation of the ring (the median of ``n`` values: the mean of the sorted
  values at ``(n - 1) // 2`` and ``n // 2``) and ``d = log(norm) - m``, a spike is ``d > t`` with
  ``t = clip(early_z * 1.4826 * mad, log(early_min_ratio), log(early_max_ratio))``: at least
  ``early_min_ratio`` times the recent median, and never more than ``early_max_ratio`` times it
  needed, however noisy the first steps are. Its clip target is ``exp(m + t * t / d)``, the
  reciprocal target of ZClip taken in log space (at the threshold for a norm just above it,
  towards the median the larger the outlier). Computed in float32, as on device.
* **Warm-up of the EMA**: the first ``warmup`` finite (effective) norms gather statistics; at the
  last of them ``mean`` and ``var`` become their mean and population variance.
* **ZClip** after warm-up, with the statistics *before* this step: ``std = sqrt(var)``,
  ``z = (norm - mean) / (std + eps)``; a spike is ``z > z_threshold``. The "reciprocal" clip
  target of a spike is ``mean + (z_threshold ** 2 / z) * std`` (ZClip, arXiv:2504.02507,
  "adaptive_scaling").
* Both update the statistics with the *effective* norm (the target on a spike, else the norm):
  during warm-up a running mean/variance, then ``mean = a * mean + (1 - a) * g``;
  ``var = a * var + (1 - a) * (g - mean_new) ** 2``; the ring gets ``log(effective)``.
* **The run's scale**: ``scale`` is the largest ring median (``exp(m)``) seen so far, taken before
  each finite norm once the ring holds ``early_min`` values. A norm at most ``floor`` times the
  scale is never a spike (either test); ``floor`` is 0 by default (no floor: see EARLY_FLOOR).
* The reported ``zscore`` crosses ``z_threshold`` exactly where a step is flagged (apart from
  norms under the floor): ZClip's ``z`` after warm-up, ``z_threshold * d / t`` under the early
  rule, 0 before the early rule judges.

* **Loss test** (:class:`LossRule`, with the step's loss): a ring keeps the last ``window`` finite
  losses of the steps counted (a finite, nonzero norm; raw values, oldest first). From the
  ``min_history``-th on, with ``m`` their median (as above) and ``scale`` the largest ``|m|`` seen
  so far (taken before each judged loss), a step is a *loss spike* when ``loss - m > ratio * |m|``
  and ``loss - m > floor * scale``: far above its recent level, and not a converged run's float
  noise (a loss of 1e-7 that jumps 1000x is still nothing against the 2.3 the run started at).
  Judged on every counted step with a finite loss, during the warm-up too. A loss spike is a spike
  (``spike``; ``loss_spike`` says the loss test tripped). When the norm tests do not flag it, its
  clip target is ``min(norm, mean)``: the norm's running level (the EMA mean, or the warm-up's
  running mean before the EMA takes over), so ``clip`` scales that step's gradients to an ordinary
  step's size and never up; that target is the step's effective norm. The loss ring takes the loss
  as it is (the median is robust to a few outliers, and a lasting shift of the loss becomes the new
  level after ``window // 2`` steps).
  ``window=0`` (or no loss) turns the test off.

* **Learning-rate test** (:class:`LrRule`, with the step's learning rate): the count of the steps
  with a finite rate > 0 and the largest such rate so far, ``top``. From the ``min_history``-th such
  rate on, a finite step whose rate is more than ``ratio`` times ``top`` (the run's earlier steps) is
  an *lr spike*: one step at lr x100 moves Adam's weights 100x an ordinary step whatever its
  gradient, which no norm or loss statistic of that step sees. ``top`` takes every finite rate > 0,
  flagged or not and on non-finite steps too, so a deliberate change of the schedule is flagged once;
  a warm-up ramp (at most ``ratio`` per step) and a warm restart (back to a rate already seen) never
  trip it. An lr spike is not a ``spike`` of the norm tests (no clip target: clipping cannot bound an
  Adam step, whose size does not follow the gradient's); ``lr_spike`` says it, and the step cell
  skips such a step with ``spike_mode="skip"``, only flags it otherwise. ``ratio=0`` (or no rate)
  turns the test off.

``early_window=0`` turns the early rule off (ZClip alone, as gradmon's first detector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

EARLY_WINDOW = 16  # log-norms in the early rule's ring
EARLY_MIN = 4  # finite norms before the early rule judges: the 5th finite step is the first
EARLY_Z = 3.0  # MAD z-score of the early threshold (1.4826 * MAD estimates a Gaussian sigma)
EARLY_MIN_RATIO = 4.0  # the early threshold is at least this ratio to the ring's median ...
EARLY_MAX_RATIO = 8.0  # ... and at most this one
# No spike below this fraction of the run's scale (the largest ring median). Off by default: under
# Adam the update is normalised, so a converged run's 100x noise excursion at 1e-6 of the run's
# scale still moves the weights by ~lr per coordinate, and clipping it is what keeps the run
# converged (docs/cells.md, "Why these defaults": with 0.01 issue 22's 20k-step run diverged).
EARLY_FLOOR = 0.0
# The loss test: the median of the last LOSS_WINDOW finite losses, judged from the LOSS_MIN-th on; a
# loss more than LOSS_RATIO x |median| above it (and LOSS_FLOOR x the run's loss scale) is a spike.
# Measured (benchmarks/ALARMS.md): clean steps of the suite reach 79x their median of 16, the inputs
# the norm tests miss 349-404x.
LOSS_WINDOW = 16
LOSS_MIN = 4
LOSS_RATIO = 150.0
LOSS_FLOOR = 0.01
# The learning-rate test: a rate more than LR_RATIO x the largest rate of the earlier steps, judged
# from the LR_MIN + 1-th step with a finite rate > 0 (warm-up ramps in the suite move it <= 2x per step).
LR_RATIO = 10.0
LR_MIN = 4
MAD_SIGMA = 1.4826
TINY_NORM = 1e-30  # a norm at most this is a zero norm: no test but the lr test judges its step


@dataclass(frozen=True)
class EarlyRule:
    """Settings of the early (warm-up) rule; ``window=0`` disables it."""

    window: int = EARLY_WINDOW
    min_history: int = EARLY_MIN
    z: float = EARLY_Z
    min_ratio: float = EARLY_MIN_RATIO
    max_ratio: float = EARLY_MAX_RATIO
    floor: float = EARLY_FLOOR

    @property
    def enabled(self) -> bool:
        return self.window > 0

    def log_bounds(self) -> tuple[np.float32, np.float32]:
        return np.float32(math.log(self.min_ratio)), np.float32(math.log(self.max_ratio))


NO_EARLY_RULE = EarlyRule(window=0)


@dataclass(frozen=True)
class LossRule:
    """Settings of the loss test; ``window=0`` disables it."""

    window: int = LOSS_WINDOW
    min_history: int = LOSS_MIN
    ratio: float = LOSS_RATIO
    floor: float = LOSS_FLOOR

    @property
    def enabled(self) -> bool:
        return self.window > 0


NO_LOSS_RULE = LossRule(window=0)


@dataclass(frozen=True)
class LrRule:
    """Settings of the learning-rate test; ``ratio=0`` disables it."""

    ratio: float = LR_RATIO
    min_history: int = LR_MIN

    @property
    def enabled(self) -> bool:
        return self.ratio > 0


NO_LR_RULE = LrRule(ratio=0.0)


@dataclass
class ZClipState:
    """Detector state: finite norms above ``TINY_NORM`` seen, running mean and variance, the warm-up's
    norms and the early rule's ring (float32 logs of the last ``window`` effective norms, oldest first)."""

    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    scale: float = 0.0  # the largest ring median so far (the early rule's; a float32 value)
    warm: list[float] = field(default_factory=list)
    ring: list[np.float32] = field(default_factory=list)
    loss_count: int = 0  # finite losses of the steps counted in ``count`` (the loss test's)
    loss_scale: float = 0.0  # the largest |median| of the loss ring so far (a float32 value)
    loss_ring: list[np.float32] = field(default_factory=list)  # the last losses, oldest first
    lr_count: int = 0  # steps with a finite learning rate > 0 seen (the lr test's)
    lr_top: float = 0.0  # the largest such rate so far (a float32 value)


@dataclass(frozen=True)
class ZClipStep:
    """What the detector says about one norm."""

    zscore: float
    spike: bool
    target: float  # the clip target on a spike, else the norm itself
    loss_spike: bool = False  # the loss test tripped (then ``spike`` is True too)
    lr_spike: bool = False  # the learning-rate test tripped (``spike`` says only the norm and loss tests)


def _median(values: np.ndarray) -> np.float32:
    s = np.sort(values)
    n = len(s)
    return np.float32(np.float32(0.5) * (s[(n - 1) // 2] + s[n // 2]))


def ring_median(ring: list[np.float32]) -> np.float32:
    """The median of the ring's log-norms."""
    return _median(np.asarray(ring, np.float32))


def early_verdict(ring: list[np.float32], norm: float, z_threshold: float, rule: EarlyRule
                  ) -> tuple[float, bool, float]:
    """The early rule on one finite ``norm`` against ``ring``: ``(zscore, spike, target)``."""
    logs = np.asarray(ring, np.float32)
    med = _median(logs)
    mad = _median(np.abs(logs - med))
    lo, hi = rule.log_bounds()
    thr = np.float32(min(max(np.float32(rule.z * MAD_SIGMA) * mad, lo), hi))
    dev = np.float32(np.log(np.float32(max(norm, TINY_NORM))) - med)
    spike = bool(dev > thr)
    zscore = float(np.float32(z_threshold) * dev / thr)
    target = float(np.exp(med + thr * thr / dev)) if spike else norm
    return zscore, spike, target


def loss_verdict(state: ZClipState, loss: float, rule: LossRule) -> bool:
    """The loss test on one finite ``loss`` of a finite step (advances ``state.loss_scale``; the
    ring is written by :func:`zclip_step`): True when it trips."""
    if state.loss_count < rule.min_history:
        return False
    med = ring_median(state.loss_ring)
    state.loss_scale = float(max(np.float32(state.loss_scale), np.float32(abs(med))))
    dev = np.float32(np.float32(loss) - med)
    return bool(dev > np.float32(rule.ratio) * np.float32(abs(med))
                and dev > np.float32(rule.floor) * np.float32(state.loss_scale))


def lr_verdict(state: ZClipState, lr: float, finite: bool, rule: LrRule) -> bool:
    """The learning-rate test on one step's rate (advances ``state.lr_count`` and ``state.lr_top``):
    True when it trips (only on a finite step)."""
    rate = np.float32(lr)
    if not (rule.enabled and np.isfinite(rate) and rate > 0):
        return False
    spike = bool(finite and state.lr_count >= rule.min_history
                 and rate > np.float32(rule.ratio) * np.float32(state.lr_top))
    state.lr_count += 1
    state.lr_top = float(max(np.float32(state.lr_top), rate))
    return spike


def zclip_step(state: ZClipState, norm: float, *, warmup: int, alpha: float, z_threshold: float,
               eps: float = 1e-6, early: EarlyRule | None = None, loss: float | None = None,
               loss_rule: LossRule | None = None, lr: float | None = None,
               lr_rule: LrRule | None = None) -> ZClipStep:
    """Advance ``state`` (in place) by one gradient norm and return the verdict for that norm.
    ``early``: the early rule's settings (default :class:`EarlyRule`; ``NO_EARLY_RULE``: off).
    ``loss``: the step's loss, judged by ``loss_rule`` (default :class:`LossRule`; ``None``: no
    loss, the test is off). ``lr``: the step's learning rate, judged by ``lr_rule`` (default
    :class:`LrRule`; ``None``: no rate, the test is off)."""
    early = EarlyRule() if early is None else early
    loss_rule = LossRule() if loss_rule is None else loss_rule
    lr_rule = LrRule() if lr_rule is None else lr_rule
    lr_spike = lr is not None and lr_verdict(state, lr, math.isfinite(norm), lr_rule)
    verdict = _norm_and_loss_step(state, norm, warmup, alpha, z_threshold, eps, early, loss, loss_rule)
    return ZClipStep(verdict.zscore, verdict.spike, verdict.target, verdict.loss_spike, lr_spike)


def _norm_and_loss_step(state: ZClipState, norm: float, warmup: int, alpha: float, z_threshold: float,
                        eps: float, early: EarlyRule, loss: float | None, loss_rule: LossRule) -> ZClipStep:
    """The norm tests and the loss test of :func:`zclip_step`."""
    if not (math.isfinite(norm) and np.float32(norm) > np.float32(TINY_NORM)):  # non-finite, or a zero norm
        return ZClipStep(0.0, False, norm)
    judge_loss = loss_rule.enabled and loss is not None and math.isfinite(loss)
    loss_spike = judge_loss and loss_verdict(state, float(loss), loss_rule)
    floored = False
    if early.enabled and state.count >= early.min_history:
        scale = max(np.float32(state.scale), np.float32(np.exp(ring_median(state.ring))))
        state.scale = float(scale)
        floored = not np.float32(norm) > np.float32(early.floor) * scale
    if state.count < warmup:
        verdict = ZClipStep(0.0, False, norm)
        if early.enabled and state.count >= early.min_history:
            verdict = ZClipStep(*early_verdict(state.ring, norm, z_threshold, early))
            if floored:
                verdict = ZClipStep(verdict.zscore, False, norm)
        if loss_spike:  # the level: the warm-up's running mean so far (loss_count <= count, so >= 1 norm)
            verdict = _loss_flagged(verdict, norm, sum(state.warm) / len(state.warm))
        state.warm.append(verdict.target)
        state.count += 1
        if state.count == warmup:
            n = len(state.warm)
            state.mean = sum(state.warm) / n
            state.var = sum((x - state.mean) ** 2 for x in state.warm) / n
    else:
        std = math.sqrt(state.var)
        z = (norm - state.mean) / (std + eps)
        spike = z > z_threshold and not floored
        effective = state.mean + (z_threshold * z_threshold / z) * std if spike else norm
        verdict = ZClipStep(z, spike, effective)
        if loss_spike:
            verdict = _loss_flagged(verdict, norm, state.mean)
        state.count += 1
        state.mean = alpha * state.mean + (1.0 - alpha) * verdict.target
        state.var = alpha * state.var + (1.0 - alpha) * (verdict.target - state.mean) ** 2
    if early.enabled:
        logged = np.float32(np.log(np.float32(max(verdict.target, TINY_NORM))))
        state.ring = [*state.ring, logged][-early.window:]
    if judge_loss:
        state.loss_count += 1
        state.loss_ring = [*state.loss_ring, np.float32(loss)][-loss_rule.window:]
    return verdict


def _loss_flagged(verdict: ZClipStep, norm: float, level: float) -> ZClipStep:
    """``verdict`` of a step the loss test flagged: a spike; when the norm tests did not flag it, its
    target is ``min(norm, level)`` (the norm's running level: clipped to an ordinary step's size)."""
    target = verdict.target if verdict.spike else min(norm, level)
    return ZClipStep(verdict.zscore, True, target, True)


def zclip_run(norms: list[float], *, warmup: int, alpha: float, z_threshold: float,
              eps: float = 1e-6, early: EarlyRule | None = None, losses: list[float] | None = None,
              loss_rule: LossRule | None = None, lrs: list[float] | None = None,
              lr_rule: LrRule | None = None) -> tuple[list[ZClipStep], ZClipState]:
    """Run :func:`zclip_step` over ``norms`` (and each step's loss from ``losses`` and learning rate
    from ``lrs``, when given); returns the per-step verdicts and the final state."""
    state = ZClipState()
    losses = [None] * len(norms) if losses is None else losses
    lrs = [None] * len(norms) if lrs is None else lrs
    steps = [zclip_step(state, n, warmup=warmup, alpha=alpha, z_threshold=z_threshold, eps=eps, early=early,
                        loss=loss, loss_rule=loss_rule, lr=lr, lr_rule=lr_rule)
             for n, loss, lr in zip(norms, losses, lrs)]
    return steps, state
