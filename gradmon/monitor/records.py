"""Pure builders of run-log records (docs/format.md). No I/O, no MindSpore.

- device history rows to per-step fields (:func:`history_rows_to_steps`);
- the host values of a read interval (learning rate, data time, epoch, timing) aligned to those
  steps (:func:`step_records`, :class:`EpochTrack`);
- what a step was (:func:`classify_step`: a loss-scale overflow is a skip, not a non-finite step),
  the events it calls for (:func:`events_for_step`) and its vote in the abort policy
  (:func:`abort_vote`, :class:`BadStepCounter`).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

from gradmon.logformat.schema import (
    FLAG_FIELDS,
    LOSS_SPIKE_REASON,
    LR_SPIKE_REASON,
    OVERFLOW_REASON,
    SPIKE_REASON_FIELD,
)

__all__ = [
    "DYNAMIC_MIN_LOSS_SCALE",
    "BadStepCounter",
    "EpochTrack",
    "abort_vote",
    "classify_step",
    "eval_metrics",
    "events_for_step",
    "history_rows_to_steps",
    "interval_timing",
    "is_overflow_step",
    "resumed_epoch_offset",
    "skip_reason",
    "skipped_mask",
    "step_records",
]

# The smallest scale MindSpore's dynamic loss scalers go down to (DynamicLossScaleUpdateCell,
# amp.DynamicLossScaler): overflows at or below it count toward the abort policy.
DYNAMIC_MIN_LOSS_SCALE = 1.0

StepFields = tuple[int, dict[str, Any]]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _nonfinite_number(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


# -- device history -----------------------------------------------------------------------------


def history_rows_to_steps(
    fields: Sequence[str], rows: Any, total_steps: int, *, current_step: int, after_step: int
) -> tuple[list[StepFields], int]:
    """Turn a device history snapshot into per-step fields.

    The snapshot's row ``i`` of ``n`` is the cell's step ``total_steps - n + 1 + i``; the cell's
    last step is the global step ``current_step`` (the two counters differ when the run's steps
    were not counted by this cell, e.g. an explicit ``initial_step``).
    Returns ``([(global_step, fields), ...], lost)`` for the steps after ``after_step``, oldest
    first, and how many of the steps ``after_step+1 .. current_step`` the ring no longer held.
    Flags become ``True`` (or are left out when 0); other columns become floats. A ``spike`` of 2
    (the detector's loss test tripped) also gives ``spike_reason: "loss"``, one of 3 (its
    learning-rate test) ``spike_reason: "lr"``.
    """
    n = len(rows)
    offset = current_step - total_steps
    out: list[StepFields] = []
    for i in range(n):
        step = total_steps - n + 1 + i + offset
        if step <= after_step or step > current_step:
            continue
        values: dict[str, Any] = {}
        for name, raw in zip(fields, rows[i]):
            value = float(raw)
            if name in FLAG_FIELDS:
                if value >= 0.5:
                    values[name] = True
                if name == "spike" and value >= 1.5:  # the loss (2) or lr (3) test (cells/train_step.py)
                    values[SPIKE_REASON_FIELD] = LR_SPIKE_REASON if value >= 2.5 else LOSS_SPIKE_REASON
            else:
                values[name] = value
        out.append((step, values))
    wanted = max(current_step - after_step, 0)
    return out, max(wanted - len(out), 0)


# -- host values of a read interval ---------------------------------------------------------------


class EpochTrack:
    """The epoch of each recent step, from the epoch the training loop reported with each step
    callback. A callback may cover several steps (dataset sink mode: one callback per sink), all
    of one epoch. Exact whatever the epoch's length; epochs never decrease within a segment."""

    def __init__(self, epoch: int = 1) -> None:
        self.current = int(epoch)
        self._base = self.current  # epoch of the steps before the first change below
        self._starts: list[int] = []  # first step of each later epoch
        self._epochs: list[int] = []

    def note(self, epoch: int, first_step: int) -> int:
        """The loop reports ``epoch`` for the steps from ``first_step`` on; returns the epoch kept
        (never below the current one)."""
        epoch = max(int(epoch), self.current)
        if epoch != self.current:
            self._starts.append(int(first_step))
            self._epochs.append(epoch)
            self.current = epoch
        return epoch

    def epoch_at(self, step: int) -> int:
        i = bisect.bisect_right(self._starts, step)
        return self._epochs[i - 1] if i else self._base

    def forget_through(self, step: int) -> None:
        """Steps up to ``step`` are written: keep only what later steps need."""
        i = bisect.bisect_right(self._starts, step)
        if i:
            self._base = self._epochs[i - 1]
            del self._starts[:i], self._epochs[:i]


def resumed_epoch_offset(initial_step: int, steps_per_epoch: int | None, reported_epoch: int) -> int:
    """What to add to the epoch a training loop reports so that a resumed run's epochs continue.
    The restored state has done ``initial_step // steps_per_epoch`` whole epochs; a loop that
    counts from 1 again (``Model.train`` without ``initial_epoch``) reports ``reported_epoch`` for
    the segment's first step. 0 when the epoch length is unknown, or when the loop already counts
    the restored epochs (``initial_epoch``)."""
    if not steps_per_epoch or initial_step <= 0:
        return 0
    return max(initial_step // steps_per_epoch - (int(reported_epoch) - 1), 0)


def skipped_mask(items: Sequence[StepFields], first: int, n: int) -> list[bool]:
    """For the steps ``first .. first+n-1``, whether each skipped its update (so the optimizer's
    ``global_step`` did not advance for it: see :func:`gradmon.monitor.lr.step_indices`)."""
    mask = [False] * n
    for step, fields in items:
        if 0 <= step - first < n:
            mask[step - first] = bool(fields.get("skipped"))
    return mask


def interval_timing(step_time: float, samples_per_step: int | None) -> dict[str, float]:
    """``step_time`` plus ``throughput`` (samples/s over all ranks) when the batch size is known,
    else ``steps_per_sec``."""
    timing = {"step_time": step_time}
    if step_time > 0:
        if samples_per_step:
            timing["throughput"] = samples_per_step / step_time
        else:
            timing["steps_per_sec"] = 1.0 / step_time
    return timing


def step_records(
    items: Sequence[StepFields],
    *,
    first: int,
    last: int,
    ts: float,
    epoch_at: Callable[[int], int],
    lrs: Sequence[float | None] = (),
    data_times: Sequence[float] = (),
    timing: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """``step`` records for one read of the steps ``first .. last`` (``items``: what the device
    said about each step read, oldest first).

    Alignment of the host's per-interval values: ``lrs[i]`` is the rate of step ``first + i``;
    ``data_times`` holds one value per step callback, so when there are as many as steps,
    ``data_times[i]`` is step ``first + i``'s, and otherwise (dataset sink mode: one callback per
    sink) only the last one is known, for step ``last``. ``timing`` (the interval's averages) goes
    into every record; ``ts`` is the time of the read.
    """
    n = last - first + 1
    timing = timing or {}
    out: list[dict[str, Any]] = []
    for step, fields in items:
        i = step - first
        record: dict[str, Any] = {"type": "step", "step": step, "epoch": epoch_at(step), "ts": ts}
        record.update(fields)
        if 0 <= i < len(lrs) and lrs[i] is not None:
            record["lr"] = lrs[i]
        record.update(timing)
        k = i if len(data_times) == n else (len(data_times) - 1 if step == last else -1)
        if 0 <= k < len(data_times):
            record["data_time"] = data_times[k]
        out.append(record)
    return out


def eval_metrics(results: Mapping[str, Any], batch_losses: Sequence[float]) -> dict[str, Any]:
    """The metrics of an ``eval`` record from ``Model.fit``'s evaluation results and the eval
    network's per-batch losses. MindSpore 2.7-2.10's ``Model.fit`` makes a new loss metric for
    every eval batch, so its ``eval_loss`` is the LAST batch's loss: ``loss`` is the user's
    ``loss`` metric when there is one, else the mean batch loss (what ``mindspore.train.Loss``
    computes), else that last batch's loss as ``last_batch_loss``."""
    metrics = dict(results)
    last_batch_loss = metrics.pop("eval_loss", None)
    if "loss" not in metrics:
        if batch_losses:
            metrics["loss"] = sum(batch_losses) / len(batch_losses)
        elif last_batch_loss is not None:
            metrics["last_batch_loss"] = last_batch_loss
    return metrics


# -- what a step was --------------------------------------------------------------------------------


def is_overflow_step(record: Mapping[str, Any]) -> bool:
    """A loss-scale overflow: the step ran with a loss scale (``loss_scale``), its update was
    skipped, its loss is finite and its gradient norm is not (or not reported: MindSpore's
    ``(loss, overflow, scale)`` outputs). The scaled gradients overflowed, nothing is broken yet."""
    if not record.get("skipped") or "loss_scale" not in record or _nonfinite_number(record.get("loss")):
        return False
    norm = record.get("grad_norm")
    return norm is None or _nonfinite_number(norm)


def is_nonfinite_step(record: Mapping[str, Any]) -> bool:
    """A step whose loss or gradient norm is NaN/inf, or that the cell flagged ``nonfinite`` —
    unless it is a loss-scale overflow."""
    if is_overflow_step(record):
        return False
    return bool(record.get("nonfinite")) or any(
        _nonfinite_number(v) for v in (record.get("loss"), record.get("grad_norm"))
    )


def skip_reason(record: Mapping[str, Any]) -> str | None:
    """Why a skipped step skipped its update: ``overflow`` (loss scale), ``nonfinite``, ``spike``
    (the spike rule), ``other``; None when the update ran."""
    if not record.get("skipped"):
        return None
    if is_overflow_step(record):
        return OVERFLOW_REASON
    if is_nonfinite_step(record):
        return "nonfinite"
    return "spike" if record.get("spike") else "other"


def classify_step(record: dict[str, Any]) -> dict[str, Any]:
    """Write what the step was into its record (in place, returned): a skipped step gets
    ``skip_reason``; an overflow step loses the cell's ``nonfinite`` flag (its norm stays as
    measured)."""
    reason = skip_reason(record)
    if reason is not None:
        record["skip_reason"] = reason
        if reason == OVERFLOW_REASON:
            record.pop("nonfinite", None)
    return record


def events_for_step(record: Mapping[str, Any], ts: float | None = None) -> list[dict[str, Any]]:
    """The ``event`` records a step record calls for: ``nonfinite`` (loss or norm NaN/inf, or the
    flag), ``skip`` (update skipped for another reason, with its ``reason``: ``overflow``,
    ``spike``, ``other``), ``spike`` (spike flag)."""
    ts = time.time() if ts is None else ts
    step = record.get("step")
    loss, norm = record.get("loss"), record.get("grad_norm")
    skipped = bool(record.get("skipped"))
    reason = skip_reason(record)
    events: list[dict[str, Any]] = []
    if reason == OVERFLOW_REASON:
        scale = record.get("loss_scale")
        at = f" at scale {scale:g}" if _finite(scale) else ""
        events.append({
            "type": "event", "kind": "skip", "reason": OVERFLOW_REASON, "step": step, "ts": ts,
            "message": f"update skipped: loss-scale overflow{at}",
            "grad_norm": norm, "loss_scale": scale,
        })
    elif is_nonfinite_step(record):
        what = "gradient norm" if _nonfinite_number(norm) else "loss"
        events.append({
            "type": "event", "kind": "nonfinite", "step": step, "ts": ts,
            "message": f"non-finite {what}" + ("; update skipped" if skipped else ""),
            "loss": loss, "grad_norm": norm,
        })
    elif skipped:
        rule = "spike rule" if reason == "spike" else "skip rule"
        events.append({
            "type": "event", "kind": "skip", "reason": reason, "step": step, "ts": ts,
            "message": f"update skipped ({rule})", "grad_norm": norm,
        })
    if record.get("spike"):
        event: dict[str, Any] = {
            "type": "event", "kind": "spike", "step": step, "ts": ts, "grad_norm": norm,
            "message": "gradient-norm spike",
        }
        if "zscore" in record:
            event["zscore"] = record["zscore"]
            if _finite(record["zscore"]):
                event["message"] = f"gradient-norm spike (z = {record['zscore']:.1f})"
        if record.get(SPIKE_REASON_FIELD) == LOSS_SPIKE_REASON:
            event[SPIKE_REASON_FIELD] = LOSS_SPIKE_REASON
            event["loss"] = loss
            event["message"] = "loss spike (the detector's loss test)"
        elif record.get(SPIKE_REASON_FIELD) == LR_SPIKE_REASON:
            event[SPIKE_REASON_FIELD] = LR_SPIKE_REASON
            if "lr" in record:
                event["lr"] = record["lr"]
            event["message"] = "learning-rate spike (the detector's learning-rate test)"
        events.append(event)
    return [{k: v for k, v in e.items() if v is not None} for e in events]


# -- abort policy ----------------------------------------------------------------------------------


def abort_vote(record: Mapping[str, Any], overflow_floor: float = DYNAMIC_MIN_LOSS_SCALE) -> bool | None:
    """How a step counts toward ``abort_after``: True (skipped or non-finite), False (a healthy
    step: the count starts again), None (neither: a loss-scale overflow while the scale is still
    above ``overflow_floor``, i.e. a dynamic scale settling). An overflow at or below the floor
    counts: the scale cannot go lower (``inf``: a fixed scale, every overflow counts)."""
    if is_overflow_step(record):
        scale = record.get("loss_scale")
        return True if not _finite(scale) or scale <= overflow_floor else None
    return bool(record.get("skipped")) or is_nonfinite_step(record)


@dataclass
class BadStepCounter:
    """Counts consecutive bad steps (votes of :func:`abort_vote`); ``update`` returns True once
    the count reaches ``limit`` (None or 0: never)."""

    limit: int | None = None
    consecutive: int = 0

    def update(self, bad: bool | None) -> bool:
        if bad is not None:
            self.consecutive = self.consecutive + 1 if bad else 0
        return bool(self.limit) and self.consecutive >= self.limit  # type: ignore[operator]
