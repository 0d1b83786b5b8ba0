"""Min/max-preserving downsampling of one series (pure functions, no I/O).

A chart of a million steps on a thousand pixels must still show the one step where the
gradient norm spiked or went NaN. Averaging or picking every n-th point hides exactly that, so
each bucket of consecutive points keeps its first, last, minimum and maximum (the M4 scheme), and
every non-finite point and every point the caller flags is always kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import repeat
from math import isfinite
from operator import add, itemgetter, sub

__all__ = ["bucket_bounds", "downsample", "downsample_indices"]


def bucket_bounds(n: int, buckets: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into at most ``buckets`` contiguous ``[lo, hi)`` slices of near-equal size."""
    buckets = max(1, min(buckets, n))
    return [(n * b // buckets, n * (b + 1) // buckets) for b in range(buckets)] if n else []


def downsample_indices(values: Sequence[float], buckets: int, keep: Iterable[int] = ()) -> list[int]:
    """Indices (ascending) of the points to keep out of ``values``.

    Per bucket of consecutive points: the first, the last, the minimum and the maximum finite
    value. Also every non-finite value and every index in ``keep``. At most ``4 * buckets`` points
    plus the non-finite and kept ones; all points when there are no more than ``4 * buckets``.
    """
    n = len(values)
    if n <= 4 * max(1, buckets):
        return list(range(n))
    if type(values) is not list:
        values = list(values)
    chosen = {i for i in keep if 0 <= i < n}
    bounds = bucket_bounds(n, buckets)
    los = list(map(itemgetter(0), bounds))
    his = list(map(itemgetter(1), bounds))
    parts = list(map(values.__getitem__, map(slice, los, his)))
    finite = list(map(isfinite, map(sum, parts)))
    if False not in finite:  # every bucket finite (a zoom's common case): C builtins, no loop per bucket
        chosen.update(los)
        chosen.update(map(sub, his, repeat(1)))
        chosen.update(map(add, los, map(list.index, parts, map(min, parts))))
        chosen.update(map(add, los, map(list.index, parts, map(max, parts))))
        return sorted(chosen)
    for lo, hi, part, ok in zip(los, his, parts, finite):
        if ok:  # all finite: a min and a max are the first of their values (as the loop below)
            chosen.update((lo, hi - 1, lo + part.index(min(part)), lo + part.index(max(part))))
            continue
        first = last = imin = imax = -1
        vmin = math.inf
        vmax = -math.inf
        for i in range(lo, hi):
            v = values[i]
            if not isfinite(v):
                chosen.add(i)
                continue
            if first < 0:
                first = i
            last = i
            if v < vmin:
                vmin, imin = v, i
            if v > vmax:
                vmax, imax = v, i
        if first >= 0:
            chosen.update((first, last, imin, imax))
    return sorted(chosen)


def downsample(steps: Sequence[int], values: Sequence[float], buckets: int,
               keep: Iterable[int] = ()) -> tuple[list[int], list[float]]:
    """Downsample the series ``(steps[i], values[i])``; see :func:`downsample_indices`."""
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} != {len(values)}")
    idx = downsample_indices(values, buckets, keep)
    return [steps[i] for i in idx], [values[i] for i in idx]
