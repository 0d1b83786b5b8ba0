"""Pure-numpy reference of the spike detector the train step runs on device.

This is the specification the device code (:func:`gradmon.cells.spike.zclip_update`) is tested
against, and a readable statement of the rule. Two tests share one state:

* Only finite norms count. Non-finite steps change nothing.
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
MAD_SIGMA = 1.4826
TINY_NORM = 1e-30  # log(0) guard: a zero norm counts as this


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


@dataclass
class ZClipState:
    """Detector state: finite steps seen, running mean and variance, the warm-up's norms and the
    early rule's ring (float32 logs of the last ``window`` effective norms, oldest first)."""

    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    scale: float = 0.0  # the largest ring median so far (the early rule's; a float32 value)
    warm: list[float] = field(default_factory=list)
    ring: list[np.float32] = field(default_factory=list)


@dataclass(frozen=True)
class ZClipStep:
    """What the detector says about one norm."""

    zscore: float
    spike: bool
    target: float  # the clip target on a spike, else the norm itself


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


def zclip_step(state: ZClipState, norm: float, *, warmup: int, alpha: float, z_threshold: float,
               eps: float = 1e-6, early: EarlyRule | None = None) -> ZClipStep:
    """Advance ``state`` (in place) by one gradient norm and return the verdict for that norm.
    ``early``: the early rule's settings (default :class:`EarlyRule`; ``NO_EARLY_RULE``: off)."""
    early = EarlyRule() if early is None else early
    if not math.isfinite(norm):
        return ZClipStep(0.0, False, norm)
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
        state.count += 1
        state.mean = alpha * state.mean + (1.0 - alpha) * effective
        state.var = alpha * state.var + (1.0 - alpha) * (effective - state.mean) ** 2
        verdict = ZClipStep(z, spike, effective)
    if early.enabled:
        logged = np.float32(np.log(np.float32(max(verdict.target, TINY_NORM))))
        state.ring = [*state.ring, logged][-early.window:]
    return verdict


def zclip_run(norms: list[float], *, warmup: int, alpha: float, z_threshold: float,
              eps: float = 1e-6, early: EarlyRule | None = None) -> tuple[list[ZClipStep], ZClipState]:
    """Run :func:`zclip_step` over ``norms``; returns the per-step verdicts and the final state."""
    state = ZClipState()
    steps = [zclip_step(state, n, warmup=warmup, alpha=alpha, z_threshold=z_threshold, eps=eps, early=early)
             for n in norms]
    return steps, state
