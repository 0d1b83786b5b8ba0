"""Pure builders of run-log records (docs/format.md): history rows to step records, step flags
to events, the consecutive-bad-step counter of the abort policy. No I/O, no MindSpore."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradmon.schema import FLAG_FIELDS

__all__ = [
    "BadStepCounter",
    "epoch_of",
    "events_for_step",
    "history_rows_to_steps",
]



def _finite_or_none(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def history_rows_to_steps(
    fields: Sequence[str], rows: Any, total_steps: int, *, current_step: int, after_step: int
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Turn a device history snapshot into per-step fields.

    The snapshot's row ``i`` of ``n`` is the cell's step ``total_steps - n + 1 + i``; the cell's
    last step is the global step ``current_step`` (the two counters differ after a resume).
    Returns ``([(global_step, fields), ...], lost)`` for the steps after ``after_step``, oldest
    first, and how many of the steps ``after_step+1 .. current_step`` the ring no longer held.
    Flags become ``True`` (or are left out when 0); other columns become floats.
    """
    n = len(rows)
    offset = current_step - total_steps
    out: list[tuple[int, dict[str, Any]]] = []
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
            else:
                values[name] = value
        out.append((step, values))
    wanted = max(current_step - after_step, 0)
    return out, max(wanted - len(out), 0)


def epoch_of(step: int, current_step: int, current_epoch: int, steps_per_epoch: int | None) -> int:
    """Epoch of an earlier ``step`` given the epoch of ``current_step`` (epochs of
    ``steps_per_epoch`` steps; unknown size: the current epoch)."""
    if not steps_per_epoch or steps_per_epoch <= 0:
        return current_epoch
    crossed = (current_step - 1) // steps_per_epoch - (step - 1) // steps_per_epoch
    return max(current_epoch - crossed, 1)


def is_nonfinite_step(record: Mapping[str, Any]) -> bool:
    """A step whose loss or gradient norm is NaN/inf, or that the cell flagged ``nonfinite``."""
    return bool(record.get("nonfinite")) or any(
        isinstance(v, float) and not math.isfinite(v) for v in (record.get("loss"), record.get("grad_norm"))
    )


def is_bad_step(record: Mapping[str, Any]) -> bool:
    """A step that counts towards the abort policy: skipped or non-finite."""
    return bool(record.get("skipped")) or is_nonfinite_step(record)


def events_for_step(record: Mapping[str, Any], ts: float | None = None) -> list[dict[str, Any]]:
    """The ``event`` records a step record calls for: ``nonfinite`` (loss or norm NaN/inf, or
    the flag), ``skip`` (update skipped for another reason: spike rule, loss-scale overflow),
    ``spike`` (spike flag)."""
    ts = time.time() if ts is None else ts
    step = record.get("step")
    loss, norm = record.get("loss"), record.get("grad_norm")
    events: list[dict[str, Any]] = []
    nonfinite = is_nonfinite_step(record)
    skipped = bool(record.get("skipped"))
    if nonfinite:
        what = "gradient norm" if isinstance(norm, float) and not math.isfinite(norm) else "loss"
        events.append({
            "type": "event", "kind": "nonfinite", "step": step, "ts": ts,
            "message": f"non-finite {what}" + ("; update skipped" if skipped else ""),
            "loss": loss, "grad_norm": norm,
        })
    elif skipped:
        if record.get("spike"):
            reason = "spike rule"
        elif "loss_scale" in record:
            reason = "loss-scale overflow"
        else:
            reason = "skip rule"
        events.append({
            "type": "event", "kind": "skip", "step": step, "ts": ts,
            "message": f"update skipped ({reason})", "grad_norm": norm,
        })
    if record.get("spike"):
        event: dict[str, Any] = {
            "type": "event", "kind": "spike", "step": step, "ts": ts, "grad_norm": norm,
            "message": "gradient-norm spike",
        }
        if "zscore" in record:
            event["zscore"] = record["zscore"]
            if _finite_or_none(record["zscore"]):
                event["message"] = f"gradient-norm spike (z = {record['zscore']:.1f})"
        events.append(event)
    return [{k: v for k, v in e.items() if v is not None} for e in events]


@dataclass
class BadStepCounter:
    """Counts consecutive steps that were skipped or non-finite; ``update`` returns True once the
    count reaches ``limit`` (None or 0: never)."""

    limit: int | None = None
    consecutive: int = 0

    def update(self, bad: bool) -> bool:
        self.consecutive = self.consecutive + 1 if bad else 0
        return bool(self.limit) and self.consecutive >= self.limit  # type: ignore[operator]
