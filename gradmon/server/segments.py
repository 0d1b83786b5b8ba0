"""Segments of a run: each ``header`` starts one, and a run resumed from an older checkpoint
repeats steps. For those the latest segment wins (like TensorBoard's purge of orphaned steps):
segment k shows only the steps below the smallest step of every later segment, its *cutoff*.

Pure data structure: no I/O.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

__all__ = ["Segments"]


class Segments:
    """Where each segment starts (its first base bucket of the pyramid, the byte offset of its
    header) and its smallest and largest step."""

    def __init__(self) -> None:
        self.first_bucket = array("q", [0])
        self.offset = array("q", [0])
        self.min_step: list[float] = [math.inf]
        self.max_step: list[float] = [-math.inf]

    @property
    def current(self) -> int:
        """The index of the latest segment."""
        return len(self.min_step) - 1

    def start(self, offset: int, bucket: int) -> None:
        """A header at byte ``offset``, the pyramid having ``bucket`` base buckets (closed before:
        no base bucket holds two segments). A segment without steps yet is reused."""
        if bucket == self.first_bucket[-1] and self.min_step[-1] == math.inf:
            self.offset[-1] = offset
            return
        self.first_bucket.append(bucket)
        self.offset.append(offset)
        self.min_step.append(math.inf)
        self.max_step.append(-math.inf)

    def note_steps(self, lo: int, hi: int) -> None:
        """The latest segment has steps from ``lo`` to ``hi``."""
        if lo < self.min_step[-1]:
            self.min_step[-1] = lo
        if hi > self.max_step[-1]:
            self.max_step[-1] = hi

    def cutoffs(self) -> list[float]:
        """Per segment, the step from which its records are overridden: the smallest step of any
        later segment (``inf`` for the last)."""
        out = [math.inf] * len(self.min_step)
        low = math.inf
        for k in range(len(out) - 1, -1, -1):
            out[k] = low
            low = min(low, self.min_step[k])
        return out

    def byte_cutoffs(self) -> list[tuple[int, float]]:
        """``(byte offset where a segment starts, its cutoff)`` for every segment, in file order,
        when some segment is overridden; else ``[]`` (see ``history.series_from_lines``)."""
        cut = self.cutoffs()
        if all(mx < c for mx, c in zip(self.max_step, cut)):
            return []
        return list(zip(self.offset, cut))

    def overridden_buckets(self, base_hi: Sequence[int], base_size: int) -> dict[int, float]:
        """Base buckets (their largest steps: ``base_hi``) holding records that a later segment
        overrides, with the cutoff step."""
        out: dict[int, float] = {}
        cut = self.cutoffs()
        for k, c in enumerate(cut):
            if self.max_step[k] < c:
                continue
            b1 = self.first_bucket[k + 1] if k + 1 < len(cut) else base_size
            for b in range(self.first_bucket[k], b1):
                if base_hi[b] >= c:
                    out[b] = c
        return out
