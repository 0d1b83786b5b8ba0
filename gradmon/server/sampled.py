"""Bounded per-field series of sparse records (``system``): step-keyed, min/max-preserving cap.

``system`` records come every few seconds, so even a long run has few of them, but a week-long
run (or a tiny ``system_interval``) must still not grow the server without bound. Each field keeps
at most ``cap`` points; past that its points are downsampled to ``cap // 2`` keeping each bucket's
first, last, minimum and maximum (``downsample_indices``), so a memory peak is never sampled away.

Pure data structure: no I/O.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import compress, islice, repeat
from operator import lt, ne
from typing import Any

from gradmon.server.downsample import downsample_indices
from gradmon.server.native import scanner as _native_scanner
from gradmon.server.segments import Replaced

__all__ = ["SampledSeries"]


class _Points:
    """One field's points in file order: steps, values and the segment of each, and whether the
    steps increase strictly (kept as points come: a query then needs no O(n) check)."""

    __slots__ = ("increasing", "seg", "steps", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.seg = array("I")
        self.increasing = True

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        for name, value in state[1].items():
            setattr(self, name, value)
        if "increasing" not in state[1]:  # (an index checkpoint written before the flag)
            self.increasing = _increasing(self.steps)


def _increasing(steps: array) -> bool:
    """Whether ``steps`` increase strictly (C calls only)."""
    return all(map(lt, steps, islice(steps, 1, None)))


def _kept(values: array, buckets: int) -> list[int]:
    """``downsample_indices(values, buckets)`` of float64s, by the compiled scanner's
    ``m4_indices`` when it is built (its rules: tests/test_native_scanner.py; a 20,000-point
    field's compaction took ~6 ms of Python)."""
    native = _native_scanner()
    idx = native.m4_indices(values, buckets) if native is not None else None
    return idx if idx is not None else downsample_indices(values.tolist(), buckets)


class SampledSeries:
    """Per-field ``(step, value)`` points of a sparse record type, at most ``cap`` per field and
    ``max_fields`` fields.

    A point at the same step and segment as the field's previous point replaces it (training did
    not advance between two samples: the newest sample wins, as on the page). Records of earlier
    segments at steps a later segment replaced (``Segments.replaced``) are left out of queries, and
    dropped first when a field is compacted."""

    def __init__(self, cap: int = 20_000, max_fields: int = 64) -> None:
        if cap < 8:
            raise ValueError(f"cap must be at least 8, got {cap}")
        self.cap = cap
        self.max_fields = max_fields
        self.fields: dict[str, _Points] = {}
        self.compactions = 0  # times a field was downsampled (the data is then not exact)

    def room_left(self) -> int:
        """How many more records fit without compacting a field (each adds at most one point per
        field)."""
        return max(0, self.cap - max((len(p.steps) for p in self.fields.values()), default=0))

    def add(self, step: int, values: Sequence[tuple[str, float]], seg: int,
            replaced: Callable[[], Replaced]) -> None:
        """Add one record's numeric ``(name, value)`` pairs at ``step`` in segment ``seg``.
        ``replaced`` is called only when a field is compacted."""
        for name, v in values:
            pts = self.fields.get(name)
            if pts is None:
                if len(self.fields) >= self.max_fields:
                    continue
                pts = self.fields[name] = _Points()
            if pts.steps and pts.steps[-1] >= step:
                if pts.steps[-1] == step and pts.seg[-1] == seg:
                    pts.values[-1] = v
                    continue
                pts.increasing = False
            pts.steps.append(step)
            pts.values.append(v)
            pts.seg.append(seg)
            if len(pts.steps) > self.cap:
                self._compact(pts, replaced())

    def add_columns(self, steps: list[int], columns: dict[str, list[float | None]], records: list[dict],
                    seg: int) -> None:
        """:meth:`add` of consecutive records of segment ``seg`` (``records``: their dicts, for the
        order of their keys), a field at a time: ``columns`` holds each key's values (``None``
        where a record has no number there), keys in the order they first appear. The caller
        makes sure that no field is compacted meanwhile (:meth:`room_left`); new fields are made in
        the order of their first numbers, as record by record."""
        first = {name: next(i for i, v in enumerate(values) if v is not None)
                 for name, values in columns.items()
                 if name not in self.fields and values.count(None) < len(values)}
        new = sorted(first, key=lambda name: (first[name], list(records[first[name]]).index(name)))
        for name in new[: max(0, self.max_fields - len(self.fields))]:
            self.fields[name] = _Points()
        for name, values in columns.items():
            pts = self.fields.get(name)
            if pts is None:
                continue
            at, got = steps, values
            if None in values:  # (records without a number there)
                keep = [v is not None for v in values]
                at, got = list(compress(steps, keep)), list(compress(values, keep))
            if not got:
                continue
            if len(at) > 1:  # a point at the same step as the one before (same segment) replaces it
                last = [*map(ne, at, islice(at, 1, None)), True]
                if False in last:
                    at, got = list(compress(at, last)), list(compress(got, last))
            if pts.steps and pts.steps[-1] == at[0] and pts.seg[-1] == seg:
                pts.values[-1] = got[0]
                at, got = at[1:], got[1:]
            if pts.increasing and at and not ((not pts.steps or pts.steps[-1] < at[0]) and _increasing(at)):
                pts.increasing = False
            pts.steps.extend(at)
            pts.values.extend(got)
            pts.seg.extend(repeat(seg, len(at)))

    def _compact(self, pts: _Points, rep: Replaced) -> None:
        """Drop replaced points, then downsample to ``cap // 2`` (min/max kept)."""
        if rep.any:
            live = [i for i, (s, k) in enumerate(zip(pts.steps, pts.seg)) if not rep.hides(k, s)]
            idx = _kept(array("d", map(pts.values.__getitem__, live)), max(1, self.cap // 8))
            idx = [live[i] for i in idx]
        else:  # (one segment, or none replaced anything: every point is live)
            idx = _kept(pts.values, max(1, self.cap // 8))
        pts.steps = array("q", map(pts.steps.__getitem__, idx))
        pts.values = array("d", map(pts.values.__getitem__, idx))
        pts.seg = array("I", map(pts.seg.__getitem__, idx))
        if not pts.increasing:  # (a subset in order keeps increasing steps increasing; others may start to)
            pts.increasing = _increasing(pts.steps)
        self.compactions += 1

    def copy(self) -> SampledSeries:
        """An independent copy (the arrays are copied: cheap, no per-point work)."""
        out = SampledSeries(self.cap, self.max_fields)
        out.compactions = self.compactions
        for name, pts in self.fields.items():
            c = out.fields[name] = _Points()
            c.steps, c.values, c.seg = array("q", pts.steps), array("d", pts.values), array("I", pts.seg)
            c.increasing = pts.increasing
        return out

    def names(self) -> list[str]:
        return list(self.fields)

    def query(self, start: float, end: float, points: int,
              rep: Replaced) -> dict[str, dict[str, list[Any]]]:
        """``{name: {"step": [...], "value": [...]}}`` of the points with steps in ``[start, end]``
        not replaced by a later segment, in step order, one per step (the latest segment's),
        each field downsampled to about ``points`` (min/max kept) when it has more."""
        out: dict[str, dict[str, list[Any]]] = {}
        for name, pts in self.fields.items():
            if not rep.any and pts.increasing:  # (the common field: its points, one per step)
                lo, hi = bisect_left(pts.steps, start), bisect_right(pts.steps, end)
                at, got = pts.steps[lo:hi], pts.values[lo:hi]
                if hi - lo > points:
                    idx = _kept(got, max(1, points // 4))
                    out[name] = {"step": list(map(at.__getitem__, idx)),
                                 "value": list(map(got.__getitem__, idx))}
                else:
                    out[name] = {"step": at.tolist(), "value": got.tolist()}
                continue
            by_step: dict[int, float] = {}
            for s, v, k in zip(pts.steps, pts.values, pts.seg):
                if start <= s <= end and not rep.hides(k, s):
                    by_step[s] = v  # file order: a repeat within a segment (a step going back) -> newest
            steps = sorted(by_step)
            values = [by_step[s] for s in steps]
            if len(steps) > points:
                idx = _kept(array("d", values), max(1, points // 4))
                steps = [steps[i] for i in idx]
                values = [values[i] for i in idx]
            out[name] = {"step": steps, "value": values}
        return out

