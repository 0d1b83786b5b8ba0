"""How many bytes of a backlog one tick of the tail loop reads while a page is connected.

Each slice of a backlog blocks the event loop while it is read and indexed, and a live push that
falls due meanwhile waits for it. A fixed byte count bounds that wait only on the machine it was
chosen on: the index got twice as fast since 64 KiB slices were chosen (~0.3 ms each here now),
and on a machine three times slower the same slice takes three times as long. :class:`SlicePacer`
sizes slices by time instead: as many bytes as the recent slices were read and indexed in
``budget_s``, between ``low`` and ``high`` bytes. Pure: the server measures, the pacer decides.
"""

from __future__ import annotations

__all__ = ["SLICE_BUDGET_S", "SlicePacer"]

# A slice's time on the loop while a page is connected. In-process on the 2M-step log (RESULTS.md,
# stop 51): 0.7 ms gave slices of ~120 KiB, p99 1.5 ms, the index 20 % faster than 64 KiB slices
# (p99 0.9 ms); 1 ms gave ~185 KiB, only 3 % faster again, with p99 2.8-3.4 ms and ten times as many
# slices over 3 ms. Live pushes wait for a slice: their goal is p99 <= 10 ms while a run indexes.
SLICE_BUDGET_S = 0.0007
# The weight of the latest slice in the running seconds-per-byte: a slow slice (a checkpoint, the
# core taken by another process) shrinks the next ones at once; fast ones grow them back gradually.
WEIGHT = 0.25


class SlicePacer:
    """The size of the next backlog slice: ``budget_s`` worth of bytes at the pace the recent
    slices were read and indexed (a running mean of their seconds per byte), between ``low`` and
    ``high``; ``low`` until a slice has been timed."""

    def __init__(self, low: int, high: int, budget_s: float = SLICE_BUDGET_S, weight: float = WEIGHT) -> None:
        if not 0 < low <= high:
            raise ValueError(f"slice bounds must satisfy 0 < low <= high, got {low} and {high}")
        if budget_s <= 0 or not 0 < weight <= 1:
            raise ValueError(f"budget_s must be > 0 and weight in (0, 1], got {budget_s} and {weight}")
        self.low = low
        self.high = high
        self.budget_s = budget_s
        self.weight = weight
        self.seconds_per_byte: float | None = None  # (None: no slice timed yet)

    def note(self, nbytes: int, seconds: float) -> None:
        """A poll read and indexed ``nbytes`` in ``seconds``. Polls of less than half ``low`` (a
        live tail's few lines: their time is mostly the poll's own, not its bytes') are not
        counted, nor are those that read nothing or took no measurable time."""
        if nbytes < self.low // 2 or seconds <= 0:
            return
        spb = seconds / nbytes
        prev = self.seconds_per_byte
        # (seconds per byte, not bytes per second: the mean then weighs a slow slice by its time)
        self.seconds_per_byte = spb if prev is None else prev + self.weight * (spb - prev)

    def size(self) -> int:
        """The bytes the next slice may read."""
        spb = self.seconds_per_byte
        if spb is None:
            return self.low
        return int(min(self.high, max(self.low, self.budget_s / spb)))
