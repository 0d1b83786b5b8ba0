"""History queries on the pyramid: which nodes cover a step range, and how to answer it.

:func:`plan_history` takes everything it needs as arguments (the pyramid, the open bucket, the
segments) and returns a :class:`HistoryPlan`: the pyramid's points with the few base buckets at the
range's edges (or partly replaced by a later segment) to read back, or byte ranges of the file to
read back whole. ``history.py``
carries a plan out. Pure: no I/O, no state kept between calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter, lt

from gradmon.server.pyramid import BUCKET, FANOUT, Pyramid, Summary
from gradmon.server.segments import BucketCover, Intervals, Replaced, Segments

__all__ = ["EXACT_READ_MAX", "READ_MAX", "HistoryPlan", "plan_history"]

EXACT_READ_MAX = 32_768  # step records a history request may read back from the file...
# ...or, so that even a range too short for the pyramid gets half the points asked for (the base
# level has up to 4 points per BUCKET records: 16 records per point asked for, plus an eighth for
# the buckets whose first/last/min/max coincide), up to this many.
READ_MAX = 131_072
RECORDS_PER_POINT = BUCKET // 8 + BUCKET // 64  # 18


@dataclass
class HistoryPlan:
    """How to answer a history query: from the pyramid, or by reading byte ``ranges`` of the file."""

    kind: str  # "pyramid" | "exact" (read, all points) | "read" (read, then downsample)
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    # Read plans: the ``[byte_lo, byte_hi)`` ranges to read, in file order (base buckets wholly
    # replaced by a later segment between them are not read).
    ranges: list[tuple[int, int]] = field(default_factory=list)
    # Pyramid plans: byte ranges of the base buckets that straddle the range's ends or hold
    # replaced records, to read back exactly (a bucket's min/max may lie outside the range) and
    # merge with merge_series(): ``(byte_lo, byte_hi, step_lo, step_hi, replaced)``, the steps to
    # keep and the step intervals to leave out.
    edges: list[tuple[int, int, float, float, Intervals]] = field(default_factory=list)
    # Read plans: what later segments replaced (``None``: nothing), for series_from_lines.
    replaced: Replaced | None = None

    @property
    def byte_lo(self) -> int:
        return self.ranges[0][0] if self.ranges else 0

    @property
    def byte_hi(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0


def plan_history(pyramid: Pyramid, open_bucket: Summary | None, segments: Segments,
                 names: Sequence[str], start: float, end: float, points: int, cursor: int) -> HistoryPlan:
    """Decide how to answer a history query for steps in ``[start, end]`` with about ``points``
    points per series (``names``), the file being complete up to byte ``cursor``; ``open_bucket``
    is the summary of the step records not in a base bucket yet.

    Records replaced by a later segment are left out: nodes holding only such records are skipped
    whole, at any level, and the few nodes holding some are split down to base buckets and read
    back. Marks are not added here (see ``history.answer_series``)."""
    replaced = segments.replaced()
    base = pyramid.base
    view = _View(pyramid, open_bucket, segments.bucket_cover(replaced, base.lo, base.hi, base.size))
    buckets = max(1, points // 4)
    nodes = view.cover(start, end, buckets)
    count = sum(view.count(nd) for nd in nodes)
    read_max = min(max(EXACT_READ_MAX, RECORDS_PER_POINT * points), READ_MAX)
    if count <= points:
        plan = _read_plan(view, start, end, read_max, cursor, replaced, exact=True)
        if plan is not None:
            return plan
    series: dict[str, tuple[list[int], list[float]]] = {}
    if view.splits_none(start, end):
        partial = [False] * len(nodes)  # (~500 calls saved)
    else:
        partial = [view.partial(nd, start, end) for nd in nodes]
    inner = [nd for nd, p in zip(nodes, partial) if not p]
    edges = [(view.offset(nd), view.node_end(nd, cursor), start, end,
              view.buckets.partial.get(nd[1], ()) if nd[0] == 0 else ())
             for nd, p in zip(nodes, partial) if p]  # base buckets only, after refine_edges
    # Even base buckets give too few points (up to 4 each, fewer where first/last/min/max coincide):
    # read the range back instead, when it is short enough. The edge buckets are not counted: what
    # they give is only known once read (a range that covers one step of a bucket gives one point).
    short = count <= read_max
    if short and 4 * len(inner) < points // 2:  # (too few whatever they are: a zoom's common case)
        plan = _read_plan(view, start, end, read_max, cursor, replaced, exact=False)
        if plan is not None:
            return plan
        short = False  # (tried)
    by_level: dict[int, list[int]] = {}
    for lv, i in inner:
        by_level.setdefault(lv, []).append(i)  # (in increasing order within a level)
    levels = pyramid.levels
    for name in names:
        pts: list[tuple[int, float]] = []
        for lv, idx in by_level.items():
            if lv < 0:
                pts.extend(view.node((lv, 0)).points(name))
            else:
                levels[lv].extend_points(name, idx, pts)
        pts.sort(key=itemgetter(0))
        steps = list(map(itemgetter(0), pts))
        if not all(map(lt, steps, islice(steps, 1, None))):
            # A step twice (a segment that went back, or a log repeating steps): the nodes' order
            # decides among the points of one step (a later segment's after the older ones it left standing).
            pts = []
            for nd in inner:
                pts.extend(view.node(nd).points(name))
            pts.sort(key=itemgetter(0))
            steps = list(map(itemgetter(0), pts))
        series[name] = (steps, list(map(itemgetter(1), pts)))
    kept = max((len(steps) for steps, _values in series.values()), default=0)
    if short and kept < points // 2:
        plan = _read_plan(view, start, end, read_max, cursor, replaced, exact=False)
        if plan is not None:
            return plan
    return HistoryPlan(kind="pyramid", series=series, edges=edges)


def _read_plan(view: _View, start: float, end: float, read_max: int, cursor: int, replaced: Replaced,
               exact: bool) -> HistoryPlan | None:
    """A plan that reads ``[start, end]`` back from the file, if base buckets cover it within
    ``read_max`` records; ``exact``: every record in range fits the points asked for."""
    fine = view.cover(start, end, read_max // BUCKET + 8)
    if not fine or any(lv > 0 for lv, _ in fine):
        return None
    ranges: list[tuple[int, int]] = []
    for nd in fine:
        lo, hi = view.offset(nd), view.node_end(nd, cursor)
        if ranges and ranges[-1][1] == lo:
            ranges[-1] = (ranges[-1][0], hi)
        else:
            ranges.append((lo, hi))
    return HistoryPlan(kind="exact" if exact else "read", ranges=ranges,
                       replaced=replaced if replaced.any else None)


@dataclass
class _View:
    """What one query looks at: the pyramid, its open bucket (node ``(-1, 0)``) and the base
    buckets holding replaced records (``buckets``)."""

    pyramid: Pyramid
    open: Summary | None
    buckets: BucketCover

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
        width = FANOUT**level
        if self.buckets.gone_starts and self.buckets.all_gone(i * width, (i + 1) * width):
            return False  # every record under this node was replaced
        if start == -math.inf and end == math.inf:
            return True  # (the whole run: no span to read)
        lo, hi = self.pyramid.levels[level].span(i)
        return lo <= end and hi >= start

    def count(self, node: tuple[int, int]) -> int:
        level, i = node
        if level < 0:
            return self.open.n if self.open is not None else 0
        return self.pyramid.levels[level].count(i)

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

    def span(self, node: tuple[int, int]) -> tuple[float, float]:
        level, i = node
        if level < 0:
            assert self.open is not None
            return self.open.lo, self.open.hi
        return self.pyramid.levels[level].span(i)

    def offset(self, node: tuple[int, int]) -> int:
        level, i = node
        if level < 0:
            assert self.open is not None
            return self.open.offset
        return self.pyramid.levels[level].offset_at(i)

    def splits_none(self, start: float, end: float) -> bool:
        """Whether :meth:`partial` is false for every node: the whole run, with no replaced records
        and no segment going back."""
        return start == -math.inf and end == math.inf and self.buckets.none

    def partial(self, node: tuple[int, int], start: float, end: float) -> bool:
        if start == -math.inf and end == math.inf:
            return self.must_split(node)  # (the whole run: no span to read)
        lo, hi = self.span(node)  # (not self.node(): a Summary with every field is 10x the cost)
        return lo < start or hi > end or self.must_split(node)

    def refine_edges(self, nodes: list[tuple[int, int]], start: float, end: float) -> list[tuple[int, int]]:
        """Split nodes that only partly overlap the range down to base buckets: their min/max may
        lie outside the range, so the caller reads those few buckets back from the file."""
        if self.splits_none(start, end):
            return nodes
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
            return base.offset_at(i + 1)
        return self.open.offset if self.open is not None else cursor

    def must_split(self, node: tuple[int, int]) -> bool:
        """Whether a node holds replaced records, or spans a segment going back (then it is split
        down to base buckets, or until its parts are in step order)."""
        level, i = node
        if level < 0:
            return False
        width = FANOUT**level
        lo, hi = i * width, (i + 1) * width
        return self.buckets.touches(lo, hi) or (level > 0 and self.buckets.straddles(lo, hi))
