"""Series of step records read back from the file: a zoomed range at full resolution, or the
base buckets at a range's edges (``query.HistoryPlan``). Pure functions (the caller reads).

Decoded a chunk at a time, keeping only columns: a 100k-line read never holds 100k dicts.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import chain, islice, repeat
from operator import itemgetter, le, lt
from typing import Any

from gradmon.logformat.schema import MARK_FLAGS, NOT_SERIES
from gradmon.logformat.values import FAST_TYPES, number, plain_floats
from gradmon.server.downsample import downsample_indices
from gradmon.server.parse import parse_lines
from gradmon.server.segments import Intervals, Replaced
from gradmon.server.steps import TS

__all__ = ["SERIES_CHUNK", "LineRange", "Series", "merge_series", "series_from_lines"]

SERIES_CHUNK = 8_192  # lines decoded at a time when reading a range back

Series = dict[str, tuple[list[int], list[float]]]  # name -> (steps, values), in step order


def merge_series(into: Series, extra: Series) -> None:
    """Add ``extra``'s points to ``into`` (in place), keeping each series in step order (a point
    equal to one there already is not added again)."""
    for name, (steps, values) in extra.items():
        if not steps:
            continue
        old_s, old_v = into.get(name, ([], []))
        merged = _insert_points(old_s, old_v, steps, values)
        if merged is None:
            pts = sorted(set(zip(old_s, _values_key(old_v))) | set(zip(steps, _values_key(values))),
                         key=lambda p: p[0])
            merged = ([p[0] for p in pts], [_unkey(p[1]) for p in pts])
        into[name] = merged


_FEW = 64  # new points inserted one by one (a bisection and a list insert each); more: one sort


def _insert_points(old_s: list[int], old_v: list[float], steps: Sequence[int], values: Sequence[float],
                   ) -> tuple[list[int], list[float]] | None:
    """``old`` with the points of ``steps``/``values`` it lacks added at their steps (the common
    merge: a series of ~2000 points and a few edge or mark points), or ``None`` where the sort
    in :func:`merge_series` must decide: two different values at one step (that sort orders them
    as its set iterates; here every step is unique, so the orders agree)."""
    if not all(map(lt, old_s, islice(old_s, 1, None))):
        return None  # (old_s strictly increasing: no step twice, so no duplicate to drop either)
    new: dict[int, float] = {}
    n = len(old_s)
    for s, v in zip(steps, values):
        i = bisect_left(old_s, s)
        have = old_v[i] if i < n and old_s[i] == s else new.get(s, _NONE)
        if have is _NONE:
            new[s] = v
        elif not (have == v or (have != have and v != v)):  # (NaN: the same point too)
            return None
    if len(new) > _FEW:
        pts = sorted(chain(zip(old_s, old_v), new.items()), key=itemgetter(0))
        return [p[0] for p in pts], [p[1] for p in pts]
    out_s, out_v = list(old_s), list(old_v)
    for s, v in new.items():
        i = bisect_left(out_s, s)
        out_s.insert(i, s)
        out_v.insert(i, v)
    return out_s, out_v


_NONE: Any = object()


def _values_key(values: Iterable[float]) -> list[Any]:
    """Values made hashable-and-equal for de-duplication (NaN != NaN otherwise)."""
    return [("nan",) if isinstance(v, float) and math.isnan(v) else v for v in values]


def _unkey(v: Any) -> float:
    return math.nan if v == ("nan",) else v


LineRange = tuple[int, Sequence[tuple[int, bytes | None]]]  # (byte offset of the first line, lines)


def series_from_lines(parts: Iterable[LineRange], start: float, end: float, points: int,
                      replaced: Replaced | None = None, keep_out: Intervals = ()) -> tuple[Series, bool]:
    """Series of the step records in ``parts`` (byte ranges of the file, in file order: each the
    offset of its first line and its lines) with steps in ``[start, end]`` (the numeric fields and
    ``ts``). ``replaced`` (``Segments.replaced()``) leaves out the records a later segment
    replaced, found by their byte offsets; ``keep_out`` leaves out steps in those intervals (the
    records of one base bucket).

    Returns ``(series, exact)``: all points when there are at most ``points`` records, else each
    series downsampled to ``points // 4`` buckets keeping flagged steps and non-finite values.
    """
    steps: list[int] = []
    columns: dict[str, list[Any]] = {}  # every key, in order of first appearance
    flagged: set[int] = set()  # positions of records with a flag set
    gone = Replaced([keep_out]) if keep_out else None
    for offset, lines in parts:
        lines = lines if isinstance(lines, list) else list(lines)
        for k in range(0, len(lines), SERIES_CHUNK):
            chunk = lines[k:k + SERIES_CHUNK]
            parsed = parse_lines(chunk, offset)
            offset = chunk[-1][0]
            recs = [r for r, o in zip(parsed.records, parsed.offsets)
                    if r["type"] == "step" and start <= r["step"] <= end
                    and (replaced is None or not replaced.hides_at(o, r["step"]))
                    and (gone is None or not gone.hides(0, r["step"]))]
            if not recs:
                continue
            for name in dict.fromkeys(chain.from_iterable(recs)):
                if name not in columns:
                    columns[name] = [None] * len(steps)
            for flag, _kind in MARK_FLAGS:
                if flag in columns:
                    column = list(map(dict.get, recs, repeat(flag)))
                    if True in column:
                        flagged.update(len(steps) + i for i, v in enumerate(column) if v is True)
            for name, column in columns.items():
                column.extend(map(dict.get, recs, repeat(name)))
            steps.extend(map(itemgetter("step"), recs))
    exact = len(steps) <= points
    if not steps:
        return {}, exact
    if not all(map(le, steps, islice(steps, 1, None))):
        # A later segment's records come after the older ones it left standing: into step order.
        order = sorted(range(len(steps)), key=steps.__getitem__)
        steps = [steps[i] for i in order]
        columns = {name: [column[i] for i in order] for name, column in columns.items()}
        if flagged:
            flagged = {new for new, old in enumerate(order) if old in flagged}
    series = {}
    for name, column in columns.items():
        if name in NOT_SERIES and name != TS:
            continue
        if set(map(type, column)).isdisjoint(FAST_TYPES):
            continue  # no number at all (flags, text)
        values = plain_floats(column, finite_only=name == TS)
        if values is not None:  # the common column: a number in every record
            s_steps, keep = steps, flagged
        else:
            pos = [i for i, raw in enumerate(column)
                   if (v := number(raw)) is not None and (name != TS or math.isfinite(v))]
            if not pos:
                continue
            values = [number(column[i]) for i in pos]  # type: ignore[misc]
            s_steps = [steps[i] for i in pos]
            keep = {k for k, i in enumerate(pos) if i in flagged} if flagged else set()
        if not exact:
            idx = downsample_indices(values, max(1, points // 4), keep)
            s_steps = [s_steps[i] for i in idx]
            values = [values[i] for i in idx]
        series[name] = (list(s_steps), values)
    return series, exact
