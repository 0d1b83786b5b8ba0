"""History queries on the pyramid: which nodes cover a step range, and how to answer it.

:func:`plan_history` takes everything it needs as arguments (the pyramid, the open bucket, the
segments) and returns a :class:`HistoryPlan`: the pyramid's points with the few base buckets at the
range's edges to read back, or a byte range of the file to read back whole. ``history.py``
carries a plan out. Pure: no I/O, no state kept between calls.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from gradmon.server.pyramid import BUCKET, FANOUT, Pyramid, Summary
from gradmon.server.segments import Segments

__all__ = ["EXACT_READ_MAX", "READ_MAX", "HistoryPlan", "plan_history"]

EXACT_READ_MAX = 32_768  # step records a history request may read back from the file...
# ...or, so that even a range too short for the pyramid gets half the points asked for (the base
# level has 4 points per BUCKET records: 16 records per point asked for), up to this many.
READ_MAX = 131_072


@dataclass
class HistoryPlan:
    """How to answer a history query: from the pyramid, or by reading ``[byte_lo, byte_hi)``."""

    kind: str  # "pyramid" | "exact" (read, all points) | "read" (read, then downsample)
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    byte_lo: int = 0
    byte_hi: int = 0
    # Pyramid plans: byte ranges of the base buckets that straddle the range's ends or hold
    # overridden records, to read back exactly (a bucket's min/max may lie outside the range) and
    # merge with merge_series(): ``(byte_lo, byte_hi, step_lo, step_hi)``, the steps to keep.
    edges: list[tuple[int, int, float, float]] = field(default_factory=list)
    # Read plans: segments' cutoffs for series_from_lines (empty: nothing is overridden).
    cutoffs: list[tuple[int, float]] = field(default_factory=list)


def plan_history(pyramid: Pyramid, open_bucket: Summary | None, segments: Segments,
                 names: Sequence[str], start: float, end: float, points: int, cursor: int) -> HistoryPlan:
    """Decide how to answer a history query for steps in ``[start, end]`` with about ``points``
    points per series (``names``), the file being complete up to byte ``cursor``; ``open_bucket``
    is the summary of the step records not in a base bucket yet.

    Records overridden by a later segment are left out: the nodes that hold some are split down
    to base buckets, which are skipped when all their records are overridden and read back
    otherwise. Marks are not added here (see ``history.answer_series``)."""
    hidden = segments.overridden_buckets(pyramid.base.hi, pyramid.base.size)
    view = _View(pyramid, open_bucket, hidden, sorted(hidden))
    buckets = max(1, points // 4)
    nodes = view.cover(start, end, buckets)
    count = sum(view.count(nd) for nd in nodes)
    coarse = 4 * len(nodes) < points // 2  # even base buckets would give too few points
    read_max = min(max(EXACT_READ_MAX, 16 * points), READ_MAX)
    if count <= points or (coarse and count <= read_max):
        fine = view.cover(start, end, read_max // BUCKET + 8)
        if fine and all(lv <= 0 for lv, _ in fine):
            return HistoryPlan(
                kind="exact" if count <= points else "read",
                byte_lo=view.node(fine[0]).offset,
                byte_hi=view.node_end(fine[-1], cursor),
                cutoffs=segments.byte_cutoffs(),
            )
    series: dict[str, tuple[list[int], list[float]]] = {}
    inner = [nd for nd in nodes if not view.partial(nd, start, end)]
    edges = [(view.node(nd).offset, view.node_end(nd, cursor), start,
              min(end, view.hidden.get(nd[1], math.inf) - 1) if nd[0] == 0 else end)
             for nd in nodes if view.partial(nd, start, end)]  # base buckets only, after refine_edges
    summaries = [view.node(nd) for nd in inner]
    for name in names:
        pts: list[tuple[int, float]] = []
        for s in summaries:
            pts.extend(s.points(name))
        series[name] = ([p[0] for p in pts], [p[1] for p in pts])
    return HistoryPlan(kind="pyramid", series=series, edges=edges)


@dataclass
class _View:
    """What one query looks at: the pyramid, its open bucket (node ``(-1, 0)``) and the base
    buckets holding overridden records (``hidden``: bucket -> cutoff step)."""

    pyramid: Pyramid
    open: Summary | None
    hidden: dict[int, float]
    hidden_sorted: list[int]

    def node(self, node: tuple[int, int]) -> Summary:
        level, i = node
        if level < 0:
            assert self.open is not None
            return self.open
        return self.pyramid.levels[level].get(i)

    def overlaps(self, node: tuple[int, int], start: float, end: float) -> bool:
        level, i = node
        if level < 0:
            o = self.open
            return o is not None and o.lo <= end and o.hi >= start
        lvl = self.pyramid.levels[level]
        if level == 0 and i in self.hidden and lvl.lo[i] >= self.hidden[i]:
            return False  # every record of this bucket is overridden
        return lvl.lo[i] <= end and lvl.hi[i] >= start

    def count(self, node: tuple[int, int]) -> int:
        level, i = node
        if level < 0:
            return self.open.n if self.open is not None else 0
        return self.pyramid.levels[level].n[i]

    def cover(self, start: float, end: float, max_nodes: int) -> list[tuple[int, int]]:
        """Nodes ``(level, index)`` (level -1: the open bucket), in file order, that overlap the
        step range ``[start, end]``: the finest level whose node count stays within ``max_nodes``,
        with an evenly spread part of its nodes split one level further to come close to
        ``max_nodes`` (a whole level more would be up to ``FANOUT`` times too many)."""
        nodes: list[tuple[int, int]] = []
        covered = 0  # base buckets covered by the coarser levels already listed
        for level in range(len(self.pyramid.levels) - 1, -1, -1):
            width = FANOUT**level
            lvl = self.pyramid.levels[level]
            nodes.extend((level, i) for i in range(covered // width, lvl.size))
            covered = max(covered, lvl.size * width)
        if self.open is not None:
            nodes.append((-1, 0))
        nodes = [nd for nd in nodes if self.overlaps(nd, start, end)]
        while True:
            top = max((lv for lv, _ in nodes), default=0)
            if top <= 0:
                return self.refine_edges(nodes, start, end)
            refined: list[tuple[int, int]] = []
            for lv, i in nodes:
                if lv != top:
                    refined.append((lv, i))
                    continue
                for c in range(i * FANOUT, i * FANOUT + FANOUT):
                    if self.overlaps((lv - 1, c), start, end):
                        refined.append((lv - 1, c))
            if len(refined) > max_nodes:
                return self.refine_edges(self.refine_some(nodes, top, max_nodes, start, end), start, end)
            nodes = refined

    def refine_some(self, nodes: list[tuple[int, int]], top: int, max_nodes: int, start: float,
                     end: float) -> list[tuple[int, int]]:
        """Split evenly spread nodes of level ``top`` into their children, as many as fit in
        ``max_nodes`` (each split adds at most ``FANOUT - 1`` nodes)."""
        tops = [k for k, (lv, _) in enumerate(nodes) if lv == top]
        n_split = min(len(tops), (max_nodes - len(nodes)) // (FANOUT - 1))
        if n_split <= 0:
            return nodes
        split = {tops[(j * len(tops)) // n_split] for j in range(n_split)}
        out: list[tuple[int, int]] = []
        for k, (lv, i) in enumerate(nodes):
            if k not in split:
                out.append((lv, i))
                continue
            out.extend((lv - 1, c) for c in range(i * FANOUT, i * FANOUT + FANOUT)
                       if self.overlaps((lv - 1, c), start, end))
        return out

    def partial(self, node: tuple[int, int], start: float, end: float) -> bool:
        s = self.node(node)
        return s.lo < start or s.hi > end or self.hidden_in(node)

    def refine_edges(self, nodes: list[tuple[int, int]], start: float, end: float) -> list[tuple[int, int]]:
        """Split nodes that only partly overlap the range down to base buckets: their min/max may
        lie outside the range, so the caller reads those few buckets back from the file."""
        while True:
            out: list[tuple[int, int]] = []
            split = False
            for lv, i in nodes:
                if lv > 0 and self.partial((lv, i), start, end):
                    split = True
                    out.extend((lv - 1, c) for c in range(i * FANOUT, i * FANOUT + FANOUT)
                               if self.overlaps((lv - 1, c), start, end))
                else:
                    out.append((lv, i))
            if not split:
                return out
            nodes = out

    def node_end(self, node: tuple[int, int], cursor: int) -> int:
        """Byte offset just after the records of a base node (or the open bucket)."""
        level, i = node
        if level < 0:
            return cursor
        base = self.pyramid.levels[0]
        if i + 1 < base.size:
            return base.offset[i + 1]
        return self.open.offset if self.open is not None else cursor

    def hidden_in(self, node: tuple[int, int]) -> bool:
        """Whether a node holds overridden records (then it is split down to base buckets)."""
        level, i = node
        if level < 0 or not self.hidden_sorted:
            return False
        lo = i * FANOUT**level
        j = bisect_left(self.hidden_sorted, lo)
        return j < len(self.hidden_sorted) and self.hidden_sorted[j] < lo + FANOUT**level
