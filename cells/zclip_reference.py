"""Pure-numpy reference of the spike detector the train step runs on device (ZClip, z-score mode).

This is the specification the device code is tested against, and a readable statement of the rule:

* Only finite norms count. Non-finite steps change nothing.
* Warm-up: the first ``warmup`` finite norms only gather statistics; at the last of them
  ``mean`` and ``var`` become their mean and population variance. No spike is flagged, z is 0.
* After warm-up, with the statistics *before* this step: ``std = sqrt(var)``,
  ``z = (norm - mean) / (std + eps)``; a spike is ``z > z_threshold``.
* The "reciprocal" clip target of a spike is ``mean + (z_threshold ** 2 / z) * std`` — the norm a
  step at exactly the threshold would have, pulled further in the larger the outlier
  (ZClip, arXiv:2504.02507, "adaptive_scaling").
* The statistics are updated with the *effective* norm (the target on a spike, else the norm):
  ``mean = a * mean + (1 - a) * g``; ``var = a * var + (1 - a) * (g - mean_new) ** 2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class ZClipState:
    """Detector state: finite steps seen, running mean and variance (Welford M2 during warm-up)."""

    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    warm: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ZClipStep:
    """What the detector says about one norm."""

    zscore: float
    spike: bool
    target: float  # the reciprocal clip target on a spike, else the norm itself


def zclip_step(state: ZClipState, norm: float, *, warmup: int, alpha: float, z_threshold: float,
               eps: float = 1e-6) -> ZClipStep:
    """Advance ``state`` (in place) by one gradient norm and return the verdict for that norm."""
    if not math.isfinite(norm):
        return ZClipStep(0.0, False, norm)
    if state.count < warmup:
        state.warm.append(norm)
        state.count += 1
        if state.count == warmup:
            n = len(state.warm)
            state.mean = sum(state.warm) / n
            state.var = sum((x - state.mean) ** 2 for x in state.warm) / n
        return ZClipStep(0.0, False, norm)
    std = math.sqrt(state.var)
    z = (norm - state.mean) / (std + eps)
    spike = z > z_threshold
    effective = state.mean + (z_threshold * z_threshold / z) * std if spike else norm
    state.count += 1
    state.mean = alpha * state.mean + (1.0 - alpha) * effective
    state.var = alpha * state.var + (1.0 - alpha) * (effective - state.mean) ** 2
    return ZClipStep(z, spike, effective)


def zclip_run(norms: list[float], *, warmup: int, alpha: float, z_threshold: float,
              eps: float = 1e-6) -> tuple[list[ZClipStep], ZClipState]:
    """Run :func:`zclip_step` over ``norms``; returns the per-step verdicts and the final state."""
    state = ZClipState()
    steps = [zclip_step(state, n, warmup=warmup, alpha=alpha, z_threshold=z_threshold, eps=eps)
             for n in norms]
    return steps, state
