"""The min/max pyramid: bounded-memory summaries of a run's step records at every scale.

Base buckets of ``BUCKET`` consecutive step records keep, per field, the first, last, minimum and
maximum finite value with their steps (:class:`Summary`); every ``FANOUT`` buckets of a level
merge into one bucket of the level above. A history query walks down from the top to the finest
level that fits the requested points (``query.py``), so its cost depends on the points asked
for, not on the run's length. Each base bucket also stores the byte offset of its first record: a
sparse offset index, so a zoomed range is read back from the file at full resolution by seeking.
Levels are stored column-wise in compact arrays (see benchmarks/README.md for the memory figures).

Pure data structure: no I/O.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from gradmon.server.values import FAST_TYPES, number

__all__ = ["BUCKET", "FANOUT", "Level", "Pyramid", "Summary", "column_summary", "merge_summaries"]

BUCKET = 128  # step records per base bucket
FANOUT = 4  # buckets of a level per bucket of the level above


def column_summary(values: Sequence[Any], steps: list[int]) -> tuple[list | None, bool]:
    """``[count, first_step, first, last_step, last, min_step, min, max_step, max]`` of the finite
    numbers among ``values`` (``steps[i]`` is the step of ``values[i]``), ``None`` when there is
    none; and whether some value was a non-finite number.

    The common column (all plain finite numbers) is summarized by C builtins, no Python loop."""
    if set(map(type, values)) <= FAST_TYPES:
        lo = min(values)
        hi = max(values)
        if lo >= -1e308 and hi <= 1e308:  # finite, and ints that fit a float
            i = values.index(lo)
            j = values.index(hi)
            return [len(values), steps[0], float(values[0]), steps[-1], float(values[-1]),
                    steps[i], float(lo), steps[j], float(hi)], False
    out: list | None = None
    nonfinite = False
    for s, raw in zip(steps, values):
        v = number(raw)
        if v is None:
            continue
        if not math.isfinite(v):
            nonfinite = True
            continue
        if out is None:
            out = [0, s, v, s, v, s, v, s, v]
        out[0] += 1
        out[3], out[4] = s, v
        if v < out[6]:
            out[5], out[6] = s, v
        if v > out[8]:
            out[7], out[8] = s, v
    return out, nonfinite


class Summary:
    """The summary of consecutive step records: step range, count, first byte offset, and per
    field ``[count, first_step, first, last_step, last, min_step, min, max_step, max]`` over its
    finite values."""

    __slots__ = ("fields", "hi", "lo", "n", "offset")

    def __init__(self, offset: int) -> None:
        self.lo = math.inf
        self.hi = -math.inf
        self.n = 0
        self.offset = offset
        self.fields: dict[str, list] = {}

    def add(self, step: int, values: Iterable[tuple[str, float]]) -> None:
        """Add one record: its step and its finite numeric values."""
        self.n += 1
        if step < self.lo:
            self.lo = step
        if step > self.hi:
            self.hi = step
        for name, v in values:
            f = self.fields.get(name)
            if f is None:
                self.fields[name] = [1, step, v, step, v, step, v, step, v]
                continue
            f[0] += 1
            f[3] = step
            f[4] = v
            if v < f[6]:
                f[5] = step
                f[6] = v
            if v > f[8]:
                f[7] = step
                f[8] = v

    def points(self, name: str) -> list[tuple[int, float]]:
        """The distinct (step, value) points this summary keeps of a field, in step order."""
        f = self.fields.get(name)
        if f is None or f[0] == 0:
            return []
        return sorted({(f[1], f[2]), (f[3], f[4]), (f[5], f[6]), (f[7], f[8])})


def merge_summaries(parts: Sequence[Summary]) -> Summary:
    """One summary of consecutive summaries (in file order)."""
    out = Summary(parts[0].offset)
    for p in parts:
        out.n += p.n
        out.lo = min(out.lo, p.lo)
        out.hi = max(out.hi, p.hi)
        for name, f in p.fields.items():
            if f[0] == 0:
                continue
            g = out.fields.get(name)
            if g is None:
                out.fields[name] = list(f)
                continue
            g[0] += f[0]
            g[3], g[4] = f[3], f[4]
            if f[6] < g[6]:
                g[5], g[6] = f[5], f[6]
            if f[8] > g[8]:
                g[7], g[8] = f[7], f[8]
    return out


_FIELD_TYPECODES = ("I", "q", "d", "q", "d", "q", "d", "q", "d")


class Level:
    """Summaries of one pyramid level, stored column-wise in compact arrays."""

    def __init__(self) -> None:
        self.size = 0
        self.lo = array("q")
        self.hi = array("q")
        self.n = array("I")
        self.offset = array("q")
        self.fields: dict[str, list[array]] = {}

    def append(self, s: Summary) -> None:
        for name in s.fields:
            if name not in self.fields:
                self.fields[name] = [array(tc, [0]) * self.size for tc in _FIELD_TYPECODES]
        self.lo.append(int(s.lo))
        self.hi.append(int(s.hi))
        self.n.append(s.n)
        self.offset.append(s.offset)
        for name, cols in self.fields.items():
            f = s.fields.get(name)
            if f is None:
                for c in cols:
                    c.append(0)
            else:
                for c, v in zip(cols, f):
                    c.append(v)
        self.size += 1

    def get(self, i: int) -> Summary:
        s = Summary(self.offset[i])
        s.lo, s.hi, s.n = self.lo[i], self.hi[i], self.n[i]
        for name, cols in self.fields.items():
            if cols[0][i]:
                s.fields[name] = [c[i] for c in cols]
        return s


class Pyramid:
    """The min/max pyramid of a run's step records: level 0 holds one summary per base bucket of
    ``BUCKET`` consecutive records (with the byte offset of its first record), and every ``FANOUT``
    summaries of a level merge into one of the level above. A node is ``(level, index)``."""

    def __init__(self) -> None:
        self.levels: list[Level] = [Level()]

    @property
    def base(self) -> Level:
        return self.levels[0]

    def push(self, s: Summary) -> None:
        """Append the summary of the next base bucket (merging upwards as levels fill)."""
        self.levels[0].append(s)
        level = 0
        while self.levels[level].size % FANOUT == 0:
            lvl = self.levels[level]
            merged = merge_summaries([lvl.get(i) for i in range(lvl.size - FANOUT, lvl.size)])
            if level + 1 == len(self.levels):
                self.levels.append(Level())
            self.levels[level + 1].append(merged)
            level += 1
