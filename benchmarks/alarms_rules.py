"""The rules the alarm benchmark compares, and how it scores them. Pure: records in, numbers out.

- ``banner``: what the page's banner lists today — one item per step flagged by the page's
  5x-rolling-median rule (``dashboard/src/lib/spikes.js``, ported below), by the cell's ZClip
  detector (the ``spike`` flag) or with a non-finite loss or norm;
- ``page_rule``: the page's 5x-rolling-median rule alone (plus non-finite steps);
- ``zclip``: the cell's detector flags (plus non-finite steps) under its old defaults (25, 0.97,
  2.5), replayed on the run's norms with ``gradmon.cells.zclip_reference`` (the runs themselves
  train with the new defaults; ``cell_spike_steps`` are their flags);
- ``detector``: the flags the runs' own cells raised with the new detector defaults (plus
  non-finite steps): what the page would mark as spikes now;
- ``alarms``: :class:`gradmon.logformat.alarms.AlarmRule` — one alarm per incident.

Per-step rules raise one banner item per flagged step; the alarm rule one alarm per incident.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gradmon.logformat.alarms import AlarmConfig, AlarmRule

OLD_ZCLIP = {"warmup": 25, "alpha": 0.97, "z_threshold": 2.5}
PAGE_RULE = {"k": 5.0, "window": 50, "min_history": 10}
RULES = ("banner", "page_rule", "zclip", "detector", "alarms")
MUST_MAGNITUDE = 10.0  # faults that move the norm this much (or make a value non-finite) must alarm
EARLY_STEP = 10  # the detector's clean-run flag rate is counted after this step (issue 22)
MAGNITUDE_BASE_STEPS = 50  # the norm level before a fault: the median of this many clean steps


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def nonfinite_steps(records: Iterable[dict[str, Any]]) -> set[int]:
    """Steps whose loss or gradient norm is NaN/inf (the page marks each of them)."""
    out = set()
    for r in records:
        for name in ("loss", "grad_norm"):
            v = r.get(name)
            if isinstance(v, float) and not math.isfinite(v):
                out.add(r["step"])
    return out


def page_rule_steps(records: Sequence[dict[str, Any]], k: float = PAGE_RULE["k"],
                    window: int = PAGE_RULE["window"], min_history: int = PAGE_RULE["min_history"]
                    ) -> set[int]:
    """``spikes.js``'s ``detectSpikes`` on the grad-norm series: a finite norm above ``k`` times the
    median of the previous ``window`` finite norms, once ``min_history`` were seen."""
    recent: list[float] = []
    out = set()
    for r in records:
        v = r.get("grad_norm")
        if not _finite(v):
            continue
        if len(recent) >= min_history:
            med = statistics.median(recent)
            if v > k * med and med >= 0 and v > 0:
                out.add(r["step"])
        recent.append(v)
        if len(recent) > window:
            recent.pop(0)
    return out


def zclip_steps(records: Sequence[dict[str, Any]], warmup: int = OLD_ZCLIP["warmup"],
                alpha: float = OLD_ZCLIP["alpha"], z_threshold: float = OLD_ZCLIP["z_threshold"]) -> set[int]:
    """Steps the cell's ZClip detector would flag with these settings (replayed on the norms)."""
    from gradmon.cells.zclip_reference import zclip_run

    norms = [float(r["grad_norm"]) if isinstance(r.get("grad_norm"), (int, float)) else math.nan
             for r in records]
    verdicts, _ = zclip_run(norms, warmup=warmup, alpha=alpha, z_threshold=z_threshold)
    return {r["step"] for r, v in zip(records, verdicts) if v.spike}


def cell_spike_steps(records: Iterable[dict[str, Any]]) -> set[int]:
    """Steps the run's own cell flagged (``spike`` in the step records)."""
    return {r["step"] for r in records if r.get("spike") is True}


def alarm_events(records: Iterable[dict[str, Any]], config: AlarmConfig | None = None) -> list[dict]:
    """Every event the alarm rule writes for ``records`` (``alarm`` and ``alarm_end``)."""
    rule = AlarmRule(config)
    out: list[dict[str, Any]] = []
    for r in records:
        out += rule.update(r)
    return out + rule.finish()


def flagged_steps(rule: str, records: Sequence[dict[str, Any]], config: AlarmConfig | None = None,
                  detector: bool = True) -> list[int]:
    """The steps at which ``rule`` raises a banner item / alarm, sorted. ``detector``: the run's
    cell had a spike detector on (else today's banner shows no ZClip flags for it)."""
    if rule == "alarms":
        return sorted(e["step"] for e in alarm_events(records, config) if e["kind"] == "alarm")
    steps = nonfinite_steps(records)
    if rule in ("banner", "page_rule"):
        steps |= page_rule_steps(records)
    if rule in ("banner", "zclip") and detector:
        steps |= zclip_steps(records)
    if rule == "detector":
        steps |= cell_spike_steps(records)
    return sorted(steps)


def detector_rate(records: Sequence[dict[str, Any]], warmup: int, flags: set[int]) -> float:
    """Detector flags per 100 steps after its warm-up (the first ``warmup`` finite norms)."""
    seen = 0
    after = 0
    count = 0
    for r in records:
        if _finite(r.get("grad_norm")):
            seen += 1
        if seen > warmup:
            after += 1
            count += r["step"] in flags
    return 100.0 * count / after if after else math.nan


def flags_after_per_100(records: Sequence[dict[str, Any]], step: int, flags: set[int]) -> float:
    """Detector flags per 100 steps after ``step``."""
    after = [r["step"] for r in records if r["step"] > step]
    return 100.0 * sum(s in flags for s in after) / len(after) if after else math.nan


def fault_magnitude(prefix: Sequence[dict[str, Any]], faulty: Sequence[dict[str, Any]]) -> float:
    """How far a fault moved the norm: the largest norm of its first two steps over the median of
    the last ``MAGNITUDE_BASE_STEPS`` clean norms before it; ``inf`` when a loss or norm of those
    two steps is non-finite."""
    base_norms = [r["grad_norm"] for r in prefix[-MAGNITUDE_BASE_STEPS:] if _finite(r.get("grad_norm"))]
    base = statistics.median(base_norms) if base_norms else math.nan
    worst = 0.0
    for r in faulty[:2]:
        if not (_finite(r.get("loss")) and _finite(r.get("grad_norm"))):
            return math.inf
        worst = max(worst, r["grad_norm"] / base)
    return worst


@dataclass(frozen=True)
class FaultScore:
    """One rule on one faulty run."""

    alarms: int  # alarms / banner items at or after the fault step (within the faulty run)
    delay: int | None  # first of them minus the fault step (None: none)

    @property
    def detected(self) -> bool:
        """Flagged within one step of the fault."""
        return self.delay is not None and self.delay <= 1


def score_fault(rule: str, prefix: Sequence[dict[str, Any]], faulty: Sequence[dict[str, Any]], start: int,
                config: AlarmConfig | None = None) -> FaultScore:
    """Score ``rule`` on the run ``prefix + faulty`` whose fault begins at step ``start``."""
    steps = [s for s in flagged_steps(rule, [*prefix, *faulty], config) if s >= start]
    return FaultScore(len(steps), steps[0] - start if steps else None)


def headroom(records: Sequence[dict[str, Any]], config: AlarmConfig | None = None,
             steps: Iterable[int] | None = None) -> dict[str, float | None]:
    """How close the alarm rule's spike tests came to firing: the largest ``norm / envelope`` among
    norms above ``norm_ratio`` x the median, and the largest ``loss rise / envelope height`` among
    losses above the ``loss_ratio`` bound (None when there is none), over ``steps`` (default all).
    Baselines as the rule keeps them, without its flags (a pure replay)."""
    from gradmon.logformat.alarms import RunningBaseline

    config = config or AlarmConfig()
    wanted = None if steps is None else set(steps)
    norms, losses = RunningBaseline(config.window), RunningBaseline(config.window)
    worst: dict[str, float | None] = {"norm_over_envelope": None, "loss_over_height": None}

    def raise_to(key: str, value: float) -> None:
        old = worst[key]
        worst[key] = value if old is None else max(old, value)

    for r in records:
        norm, loss = r.get("grad_norm"), r.get("loss")
        judged = wanted is None or r["step"] in wanted
        if judged and _finite(norm) and len(norms) >= config.min_history:
            median = norms.median()
            if norm > config.norm_ratio * median:
                raise_to("norm_over_envelope", norm / norms.envelope())
        if judged and _finite(loss) and len(losses) >= config.min_history:
            median = losses.median()
            height = losses.envelope() - median
            if loss - median > config.loss_ratio * abs(median) and height > 0:
                raise_to("loss_over_height", (loss - median) / height)
        if _finite(norm):
            norms.add(norm)
        if _finite(loss):
            losses.add(loss)
    return worst


def per_thousand(count: int, steps: int) -> float:
    return 1000.0 * count / steps if steps else math.nan
