"""The device-side step history ring: its columns and the host-side decoding of a read."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gradmon.logformat.schema import HISTORY_BASE_FIELDS as BASE_FIELDS
from gradmon.logformat.schema import HISTORY_COUNTER_NAMES as COUNTER_NAMES  # after the step count


def history_fields(loss_scale: bool, local_norm: bool) -> tuple[str, ...]:
    """Column names of the ring for a cell with the given options."""
    extra = (("loss_scale",) if loss_scale else ()) + (("grad_norm_local",) if local_norm else ())
    return BASE_FIELDS + extra


@dataclass(frozen=True)
class HistorySnapshot:
    """One read of a monitored step's history.

    ``rows[i]`` is step ``total_steps - len(rows) + 1 + i`` (steps counted from 1), oldest first;
    flags are 0.0/1.0. ``counters`` are totals since construction (``clipped``, ``spikes``,
    ``skipped``, ``nonfinite``), including steps that have left the ring.
    """

    total_steps: int
    fields: tuple[str, ...]
    rows: np.ndarray
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def first_step(self) -> int:
        """Step number of ``rows[0]`` (``total_steps + 1`` when there are no rows)."""
        return self.total_steps - len(self.rows) + 1

    def column(self, name: str) -> np.ndarray:
        """One column by field name."""
        return self.rows[:, self.fields.index(name)]


def unroll_ring(ring: np.ndarray, counts: np.ndarray, fields: tuple[str, ...]) -> HistorySnapshot:
    """Turn the raw ring ``[size, len(fields)]`` and counters ``[1 + 4]`` into a snapshot.

    Step ``s`` (from 1) lives in row ``(s - 1) % size``; the last ``min(total, size)`` steps are
    returned oldest first.
    """
    size = int(ring.shape[0])
    total = int(counts[0])
    n = min(total, size)
    first = total - n  # zero-based index of the oldest kept step
    order = (np.arange(first, total) % size) if size else np.arange(0)
    rows = np.array(ring[order], dtype=np.float64, copy=True).reshape(n, len(fields))
    counters = {name: int(counts[1 + i]) for i, name in enumerate(COUNTER_NAMES)}
    return HistorySnapshot(total_steps=total, fields=tuple(fields), rows=rows, counters=counters)
