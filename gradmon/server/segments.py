"""Segments of a run: each ``header`` starts one, and a run resumed from an older checkpoint
repeats steps. For those the latest segment wins, step by step (docs/format.md): a segment
*covers* the steps from its first to its last, and every record an older segment wrote at a
covered step is *replaced*; the older segments' records outside every later segment's cover stay.
So a rollback to step 10 that trains 11-20 again replaces 11-20 and keeps 21-40 of the old run.

:class:`Segments` is what the index keeps (where each segment starts, its step range);
:class:`Replaced` is, per segment, the steps that later segments replaced (computed per query,
picklable); :class:`BucketCover` is which base buckets of the pyramid that leaves wholly or partly
replaced, found by bisection so that a long replaced stretch costs a query nothing per bucket.

Pure data structures: no I/O.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BucketCover", "Intervals", "Replaced", "Segments"]

Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint, closed step intervals


def _insert(starts: list[int], ends: list[int], lo: int, hi: int) -> None:
    """Add ``[lo, hi]`` to the sorted disjoint intervals ``starts``/``ends`` (in place), merging it
    with every interval it overlaps or touches (steps are integers: ``[1, 5]`` and ``[6, 9]`` merge)."""
    i = bisect_left(ends, lo - 1)  # the first interval ending at or after lo - 1
    j = bisect_right(starts, hi + 1)  # the intervals before j start at or before hi + 1
    if i < j:
        lo = min(lo, starts[i])
        hi = max(hi, ends[j - 1])
    starts[i:j] = [lo]
    ends[i:j] = [hi]


class Replaced:
    """Per segment (in file order), the steps that later segments replaced, and the byte offset
    where each segment starts (to find a record's segment from its offset)."""

    def __init__(self, intervals: Sequence[Intervals], offsets: Sequence[int] = ()) -> None:
        self.starts = [tuple(a for a, _b in iv) for iv in intervals]
        self.ends = [tuple(b for _a, b in iv) for iv in intervals]
        self.offsets = list(offsets) if offsets else [0] * len(intervals)
        self.any = any(self.starts)

    @classmethod
    def none(cls, segments: int = 1) -> Replaced:
        """Nothing replaced (``segments`` segments)."""
        return cls([()] * segments)

    @classmethod
    def of_spans(cls, min_step: Sequence[float], max_step: Sequence[float],
                 offsets: Sequence[int] = ()) -> Replaced:
        """From each segment's smallest and largest step (``inf``/``-inf`` for a segment without
        steps): segment k's replaced steps are the union of the spans of the segments after it,
        within its own span."""
        n = len(min_step)
        out: list[Intervals] = [()] * n
        starts: list[int] = []  # the union of the spans of the segments after k, merged
        ends: list[int] = []
        for k in range(n - 1, -1, -1):
            lo, hi = min_step[k], max_step[k]
            if lo > hi:  # no steps
                continue
            lo, hi = int(lo), int(hi)
            i = bisect_left(ends, lo)
            j = bisect_right(starts, hi)
            if i < j:  # clipped to the segment's own span
                out[k] = tuple((max(a, lo), min(b, hi)) for a, b in zip(starts[i:j], ends[i:j]))
            _insert(starts, ends, lo, hi)
        return cls(out, offsets)

    def __len__(self) -> int:
        return len(self.starts)

    def intervals(self, seg: int) -> Intervals:
        return tuple(zip(self.starts[seg], self.ends[seg]))

    def hides(self, seg: int, step: int) -> bool:
        """Whether a later segment replaced ``step`` of segment ``seg``."""
        starts = self.starts[seg]
        if not starts:
            return False
        j = bisect_right(starts, step) - 1
        return j >= 0 and step <= self.ends[seg][j]

    def segment_at(self, offset: int) -> int:
        """The segment of the record whose line starts at byte ``offset``."""
        return max(0, bisect_right(self.offsets, offset) - 1)

    def hides_at(self, offset: int, step: int) -> bool:
        """Whether the step record at byte ``offset`` was replaced."""
        return self.hides(self.segment_at(offset), step)


@dataclass
class BucketCover:
    """The base buckets of the pyramid that hold replaced records: ``gone`` (``[b0, b1)`` ranges,
    sorted, merged) hold nothing else; ``partial`` buckets hold some, with the replaced step
    intervals (read back and filtered). ``breaks``: the first buckets of segments whose steps go
    back (a rollback): a pyramid node across one is not in step order (its first and last records
    are not its first and last steps), so queries split it."""

    gone_starts: list[int] = field(default_factory=list)
    gone_ends: list[int] = field(default_factory=list)
    partial: dict[int, Intervals] = field(default_factory=dict)
    breaks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.partial_sorted = sorted(self.partial)

    @property
    def none(self) -> bool:
        """Whether no base bucket holds replaced records and no segment goes back (the common
        case: then no query splits a node for them)."""
        return not (self.gone_starts or self.partial or self.breaks)

    def all_gone(self, lo: int, hi: int) -> bool:
        """Whether base buckets ``[lo, hi)`` hold replaced records only."""
        j = bisect_right(self.gone_starts, lo) - 1
        return j >= 0 and self.gone_ends[j] >= hi

    def touches(self, lo: int, hi: int) -> bool:
        """Whether some base bucket in ``[lo, hi)`` holds replaced records."""
        j = bisect_left(self.gone_starts, hi) - 1  # the last gone range starting before hi
        if j >= 0 and self.gone_ends[j] > lo:
            return True
        p = bisect_left(self.partial_sorted, lo)
        return p < len(self.partial_sorted) and self.partial_sorted[p] < hi

    def straddles(self, lo: int, hi: int) -> bool:
        """Whether base buckets ``[lo, hi)`` hold the end of one segment and a later segment going
        back from there."""
        k = bisect_right(self.breaks, lo)
        return k < len(self.breaks) and self.breaks[k] < hi


class Segments:
    """Where each segment starts (its first base bucket of the pyramid, the byte offset of its
    header), its smallest and largest step, and whether its steps never go back (then its base
    buckets' step ranges are sorted, and a query finds the replaced ones by bisection)."""

    def __init__(self) -> None:
        self.first_bucket = array("q", [0])
        self.offset = array("q", [0])
        self.min_step: list[float] = [math.inf]
        self.max_step: list[float] = [-math.inf]
        self.ordered: list[bool] = [True]

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
        self.ordered.append(True)

    def note_steps(self, lo: int, hi: int, ordered: bool = True) -> None:
        """The latest segment has steps from ``lo`` to ``hi`` (``ordered``: in non-decreasing
        order, the first one ``lo``)."""
        if not ordered or lo < self.max_step[-1]:
            self.ordered[-1] = False
        if lo < self.min_step[-1]:
            self.min_step[-1] = lo
        if hi > self.max_step[-1]:
            self.max_step[-1] = hi

    def replaced(self) -> Replaced:
        """Per segment, the steps later segments replaced (see :class:`Replaced`)."""
        return Replaced.of_spans(self.min_step, self.max_step, self.offset)

    def latest_span(self) -> tuple[int, int] | None:
        """The latest segment's smallest and largest step (``None`` before its first step)."""
        lo, hi = self.min_step[-1], self.max_step[-1]
        return None if lo > hi else (int(lo), int(hi))

    def bucket_cover(self, replaced: Replaced, base_lo: Sequence[int], base_hi: Sequence[int],
                     base_size: int) -> BucketCover:
        """The base buckets (step ranges ``base_lo``/``base_hi``) holding replaced records, and
        where segments go back."""
        gone: list[tuple[int, int]] = []
        partial: dict[int, list[tuple[int, int]]] = {}
        breaks: list[int] = []
        n = len(self.min_step)
        top = -math.inf  # the largest step of the segments before k
        for k in range(n):
            if self.min_step[k] < top and self.first_bucket[k] < base_size:
                breaks.append(self.first_bucket[k])
            top = max(top, self.max_step[k])
            ivs = replaced.intervals(k)
            if not ivs:
                continue
            b0 = self.first_bucket[k]
            b1 = self.first_bucket[k + 1] if k + 1 < n else base_size
            for a, b in ivs:
                if self.ordered[k]:  # sorted bucket ranges: those meeting [a, b] are one stretch
                    p = bisect_left(base_hi, a, b0, b1)
                    q = bisect_right(base_lo, b, p, b1)
                    if q - p > 2:  # every bucket strictly between the first and the last lies inside
                        gone.append((p + 1, q - 1))
                    candidates: Sequence[int] = (p, q - 1) if q - p >= 2 else range(p, q)
                else:
                    candidates = range(b0, b1)
                for bk in candidates:
                    if base_lo[bk] > b or base_hi[bk] < a:
                        continue
                    if a <= base_lo[bk] and base_hi[bk] <= b:
                        gone.append((bk, bk + 1))
                    else:
                        partial.setdefault(bk, []).append((a, b))
        gone.sort()
        starts: list[int] = []
        ends: list[int] = []
        for g0, g1 in gone:
            if ends and g0 <= ends[-1]:
                ends[-1] = max(ends[-1], g1)
            else:
                starts.append(g0)
                ends.append(g1)
        return BucketCover(starts, ends, {bk: tuple(sorted(iv)) for bk, iv in partial.items()}, breaks)
