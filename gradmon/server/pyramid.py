"""The min/max pyramid: bounded-memory summaries of a run's step records at every scale.

Base buckets of ``BUCKET`` consecutive step records keep, per field, the first, last, minimum and
maximum finite value with their steps (:class:`Summary`); every ``FANOUT`` buckets of a level
merge into one bucket of the level above. A history query walks down from the top to the finest
level that fits the requested points (``query.py``), so its cost depends on the points asked
for, not on the run's length. Each base bucket also stores the byte offset of its first record: a
sparse offset index, so a zoomed range is read back from the file at full resolution by seeking.
Levels are stored column-wise in compact arrays (see benchmarks/README.md for the memory figures);
with an index sidecar, the four finest levels live in its files (:meth:`Pyramid.attach`,
``levelfiles.py``: the only I/O, behind ``Level.store``), and only their newest summaries in memory.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

from gradmon.logformat.values import FAST_TYPES, number
from gradmon.server.levelfiles import field_columns
from gradmon.server.native import scanner as _native_scanner

__all__ = ["BUCKET", "FANOUT", "STORED_LEVELS", "TAIL_MAX", "Block", "Level", "Pyramid", "Summary",
           "column_summary", "finite_summary", "merge_summaries"]

BUCKET = 128  # step records per base bucket
FANOUT = 4  # buckets of a level per bucket of the level above
# Levels kept in a sidecar's files when there is one (levelfiles.py): the four finest hold 255/256 of
# the buckets; the others (~4 MB for 10M steps of ten fields) stay in memory and in the checkpoint.
STORED_LEVELS = 4
# A stored level's tail is written once it holds this many summaries (~180 KB for ten fields; the
# write, on the event loop, packs them: ~1-3 ms).
TAIL_MAX = 256


def _all_finite(values: Sequence[Any]) -> bool:
    """Whether every one of ``values`` (ints and floats) is finite: their sum is (one C call; an
    overflowing sum or a huge integer says no, and the caller takes the general path)."""
    try:
        return math.isfinite(sum(values))
    except OverflowError:
        return False


def column_summary(values: Sequence[Any], steps: list[int], plain: bool = False) -> tuple[list | None, bool]:
    """``[count, first_step, first, last_step, last, min_step, min, max_step, max]`` of the finite
    numbers among ``values`` (``steps[i]`` is the step of ``values[i]``), ``None`` when there is
    none; and whether some value was a non-finite number. ``plain``: every value is known to be an
    ``int`` or a ``float`` (not checked again).

    The common column (all plain finite numbers) is summarized by C builtins, no Python loop."""
    # (else a NaN, an infinity, or a sum that overflowed: value by value. min() and max() would
    # pass over a NaN in the middle, which must not be counted, nor be the last value)
    if (plain or set(map(type, values)) <= FAST_TYPES) and _all_finite(values):
        # One sort (list.sort compares a column of floats by their doubles: ~4x faster than
        # min() and max() together, which compare objects); the first value equal to each end
        # is the one min() and max() return (the first of the smallest, the first of the largest).
        ordered = sorted(values)
        i = values.index(ordered[0])
        j = values.index(ordered[-1])
        lo = values[i]
        hi = values[j]
        if lo >= -1e308 and hi <= 1e308:  # (ints that fit a float)
            return [len(values), steps[0], float(values[0]), steps[-1], float(values[-1]),
                    steps[i], float(lo), steps[j], float(hi)], False
    return finite_summary(values, steps)


def finite_summary(values: Sequence[Any], steps: list[int]) -> tuple[list | None, bool]:
    """:func:`column_summary` value by value: any column (None, text, bools, NaN, huge integers)."""
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
_BASE_COLUMNS = ("lo", "hi", "n", "offset")
_BASE_TYPECODES = ("q", "q", "I", "q")


class Block:
    """Consecutive summaries of one level given column-wise, as :class:`Level` keeps them (what
    :meth:`Pyramid.push_block` appends in one go): the base columns ``lo``, ``hi``, ``n`` and
    ``offset``, and per field its nine columns (``_FIELD_TYPECODES``; a summary without the field
    has a row of zeros there), each as the bytes of an ``array`` of the column's typecode."""

    __slots__ = ("base", "fields", "size")

    def __init__(self, base: Sequence[bytes], fields: dict[str, Sequence[bytes]]) -> None:
        self.base = base
        self.fields = fields
        self.size = len(base[0]) // 8

    def __len__(self) -> int:
        return self.size

    def summary(self, i: int) -> Summary:
        """Summary ``i``, its fields in this block's order (those with a count there)."""
        base = [memoryview(c).cast(tc) for c, tc in zip(self.base, _BASE_TYPECODES)]
        fields = {name: [memoryview(c).cast(tc) for c, tc in zip(cols, _FIELD_TYPECODES)]
                  for name, cols in self.fields.items()}
        return _summary_at(base, fields, i)


def _summary_at(base: Sequence[Sequence[int]], fields: dict[str, Sequence[Sequence[Any]]], i: int) -> Summary:
    """Summary ``i`` of a level's columns (``base``: lo, hi, n, offset; per field its nine), its
    fields those with a count there, in ``fields``' order."""
    lo, hi, n, offset = (c[i] for c in base)
    s = Summary(offset)
    s.lo, s.hi, s.n = lo, hi, n
    for name, cols in fields.items():
        if cols[0][i]:
            s.fields[name] = [c[i] for c in cols]
    return s


class Level:
    """Summaries of one pyramid level, stored column-wise in compact arrays; with a ``store``
    (``levelfiles.LevelFile``, see :meth:`Pyramid.attach`), the first ``store.size`` of them are
    in its files and the arrays hold the rest (the *tail*), written by :meth:`flush`."""

    def __init__(self) -> None:
        self.size = 0
        self.store: Any = None
        self._lo = array("q")
        self._hi = array("q")
        self._n = array("I")
        self._offset = array("q")
        self.fields: dict[str, list[array]] = {}  # the tail's (every field the level has)

    @property
    def stored(self) -> int:
        """Summaries in the store (the tail's first is summary ``stored``)."""
        return 0 if self.store is None else self.store.size

    @property
    def tail(self) -> int:
        """Summaries in memory, not in the store."""
        return self.size - self.stored

    def _column(self, k: int) -> Sequence[int]:
        tail = (self._lo, self._hi, self._n, self._offset)[k]
        return tail if self.store is None else _Joined(self, k, tail)

    # Whole columns as sequences (for bisection: ``segments.bucket_cover``); see also span/count/offset_at.
    lo = property(lambda self: self._column(0))
    hi = property(lambda self: self._column(1))
    n = property(lambda self: self._column(2))
    offset = property(lambda self: self._column(3))

    def append(self, s: Summary) -> None:
        tail = self.tail
        for name in s.fields:
            if name not in self.fields:
                self.fields[name] = [array(tc, [0]) * tail for tc in _FIELD_TYPECODES]
        self._lo.append(int(s.lo))
        self._hi.append(int(s.hi))
        self._n.append(s.n)
        self._offset.append(s.offset)
        append = array.append
        for name, cols in self.fields.items():
            f = s.fields.get(name)
            any(map(append, cols, repeat(0) if f is None else f))  # (each value into its column, in C)
        self.size += 1

    def extend(self, block: Block) -> None:
        """Append a block's summaries (each of whose fields is one of this level's: as
        :meth:`append` of each, with no new field)."""
        k = len(block)
        frombytes = array.frombytes  # (each column's bytes onto its array, the loop in C: map, any)
        any(map(frombytes, (self._lo, self._hi, self._n, self._offset), block.base))
        for name, cols in self.fields.items():
            got = block.fields.get(name)
            any(map(frombytes, cols, got if got is not None else [bytes(c.itemsize * k) for c in cols]))
        self.size += k

    def merge_tail(self, first: int, groups: int, fanout: int) -> Block:
        """The merges (``merge_summaries``) of ``groups`` groups of ``fanout`` summaries from
        summary ``first``, all in the tail: by the compiled scanner, column by column."""
        names = list(self.fields)
        base, fields = _native_scanner().merge_groups(  # type: ignore[union-attr]
            [self._lo, self._hi, self._n, self._offset], [self.fields[name] for name in names],
            first - self.stored, groups, fanout)
        return Block(base, dict(zip(names, fields)))

    def get(self, i: int) -> Summary:
        k = self.stored
        if i < k:
            lo, hi, n, offset = self.store.base(i)
            s = Summary(offset)
            s.lo, s.hi, s.n = lo, hi, n
            s.fields = self.store.fields_at(i)
            return s
        return _summary_at((self._lo, self._hi, self._n, self._offset), self.fields, i - k)

    def extend_points(self, name: str, nodes: Sequence[int], out: list[tuple[int, float]]) -> None:
        """Append to ``out`` the points of field ``name`` that summaries ``nodes`` (increasing
        indices) keep, summary by summary, each as :meth:`Summary.points` gives them, without
        building the summaries: the stored ones' records are read once over the nodes' span and
        their points made by the compiled scanner's ``field_points`` (else their nine columns
        picked, one C call per column); the tail's columns are picked."""
        k = self.stored
        stored = nodes[: bisect_left(nodes, k)] if nodes and nodes[0] < k else ()
        if stored:
            got = self.store.field_records(name, stored[0], stored[-1] + 1)
            if got is not None:
                first, raw = got
                held = stored[bisect_left(stored, first):]  # (the field's records start at `first`)
                native = _native_scanner()
                # (the compiled loop: ~1 ms for a whole-run query's ~500 nodes of nine fields, not ~9)
                points = native.field_points(raw, first, held) if native is not None else None
                if points is None:
                    _extend_points(out, _pick(field_columns(raw), first, held))
                else:
                    out.extend(points)
        if len(stored) < len(nodes):
            cols = self.fields.get(name)
            if cols is not None:
                _extend_points(out, _pick(cols, k, nodes[len(stored):]))

    def span(self, i: int) -> tuple[int, int]:
        """Summary ``i``'s smallest and largest step."""
        k = self.stored
        if i < k:
            return self.store.span(i)
        return self._lo[i - k], self._hi[i - k]

    def count(self, i: int) -> int:
        """Summary ``i``'s number of records."""
        k = self.stored
        return self.store.column(i, 2) if i < k else self._n[i - k]

    def offset_at(self, i: int) -> int:
        """The byte offset of summary ``i``'s first record."""
        k = self.stored
        return self.store.column(i, 3) if i < k else self._offset[i - k]

    def flush(self) -> None:
        """Write the tail to the store (raises ``OSError`` when that fails: then it stays here)."""
        if self.store is None or self.tail == 0:
            return
        self.store.append(self._lo, self._hi, self._n, self._offset, self.fields)
        self._lo, self._hi, self._n, self._offset = array("q"), array("q"), array("I"), array("q")
        self.fields = {name: [array(tc) for tc in _FIELD_TYPECODES] for name in self.fields}

    def detach(self) -> None:
        """Read the store's summaries back into memory and forget the store (it is going away)."""
        store, k = self.store, self.stored
        if store is None:
            return
        lo, hi, n, offset = array("q"), array("q"), array("I"), array("q")
        fields = {name: [array(tc) for tc in _FIELD_TYPECODES] for name in self.fields}
        for i in range(k):
            b = store.base(i)
            lo.append(b[0])
            hi.append(b[1])
            n.append(b[2])
            offset.append(b[3])
            got = store.fields_at(i)
            for name, cols in fields.items():
                f = got.get(name)
                for c, v in zip(cols, f if f is not None else repeat(0, 9)):
                    c.append(v)
        self._lo, self._hi, self._n = lo + self._lo, hi + self._hi, n + self._n
        self._offset = offset + self._offset
        self.fields = {name: [a + b for a, b in zip(fields[name], t)] for name, t in self.fields.items()}
        store.release()
        self.store = None


def _pick(cols: Sequence[Sequence[Any]], first: int, nodes: Sequence[int]) -> Sequence[Sequence[Any]]:
    """The values of summaries ``nodes`` (from ``first`` on) in columns that start at summary ``first``."""
    at = [i - first for i in nodes if i >= first]
    if not at:
        return [()] * len(cols)
    if len(at) == 1:
        return [(c[at[0]],) for c in cols]
    if at[-1] - at[0] + 1 == len(at):  # consecutive
        return [c[at[0]: at[-1] + 1] for c in cols]
    get = itemgetter(*at)
    return [get(c) for c in cols]


def _extend_points(out: list[tuple[int, float]], cols: Sequence[Sequence[Any]]) -> None:
    """Each summary's points (``Summary.points``) of one field given as its nine columns, in order."""
    n, fs, fv, ls, lv, ns, nv, xs, xv = cols
    ext = out.extend
    for c, first, low, high, last in zip(n, zip(fs, fv), zip(ns, nv), zip(xs, xv), zip(ls, lv)):
        if c:
            ext(sorted({first, low, high, last}))


def _level_ordered(parts: Sequence[Summary], names: list[str]) -> bool:
    """Whether each summary has every one of the level's fields ``names``, in that order (then
    they are what ``Level.get`` gives back for them)."""
    return all(list(p.fields) == names for p in parts)


class _Joined(Sequence):
    """One base column of a level with a store: the store's values, then the tail's."""

    def __init__(self, level: Level, k: int, tail: array) -> None:
        self._store, self._stored, self._k, self._tail = level.store, level.stored, k, tail

    def __len__(self) -> int:
        return self._stored + len(self._tail)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i < self._stored:
            return self._store.column(i, self._k)
        return self._tail[i - self._stored]


class Pyramid:
    """The min/max pyramid of a run's step records: level 0 holds one summary per base bucket of
    ``BUCKET`` consecutive records (with the byte offset of its first record), and every ``FANOUT``
    summaries of a level merge into one of the level above. A node is ``(level, index)``."""

    def __init__(self) -> None:
        self.levels: list[Level] = [Level()]
        self.directory: str | None = None  # where the stored levels' files are (attach)
        # Per level, the summaries appended since its last merge, as appended (the next merge takes
        # them instead of reading them back from the level's columns or files). Not pickled: a
        # restored pyramid reads its first merge's parts back.
        self._unmerged: list[list[Summary]] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"levels": self.levels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.levels, self.directory, self._unmerged = state["levels"], None, []

    # ---- stored levels (levelfiles.py) ----------------------------------------------------

    def attach(self, directory: str) -> None:
        """Keep the ``STORED_LEVELS`` finest levels in files of ``directory`` (a sidecar's), from
        now on; a restored pyramid's stores find their files there again."""
        from gradmon.server.levelfiles import LevelFile

        self.directory = directory
        for k, lvl in enumerate(self.levels[:STORED_LEVELS]):
            if lvl.store is None:
                lvl.store = LevelFile(k)
            lvl.store.attach(directory)

    def flush(self, min_tail: int = 1) -> None:
        """Write the stored levels' tails of at least ``min_tail`` summaries (raises ``OSError``)."""
        for lvl in self.levels[:STORED_LEVELS]:
            if lvl.tail >= min_tail:
                lvl.flush()

    def detach(self) -> None:
        """Hold every level in memory again (the files are going away)."""
        for lvl in self.levels:
            lvl.detach()
        self.directory = None

    def release(self) -> None:
        """Drop the stored levels' maps (after a query: what it read leaves this process's memory)."""
        for lvl in self.levels[:STORED_LEVELS]:
            if lvl.store is not None:
                lvl.store.release()

    def files(self) -> dict[str, int]:
        """The stored levels' files and the bytes each must hold."""
        out: dict[str, int] = {}
        for lvl in self.levels:
            if lvl.store is not None:
                out.update(lvl.store.lengths())
        return out

    @property
    def base(self) -> Level:
        return self.levels[0]

    def push(self, s: Summary) -> None:
        """Append the summary of the next base bucket (merging upwards as levels fill)."""
        self.levels[0].append(s)
        unmerged = self._unmerged
        level = 0
        while True:
            if level == len(unmerged):
                unmerged.append([])
            parts = unmerged[level]
            parts.append(s)
            lvl = self.levels[level]
            if lvl.size % FANOUT:
                break
            if len(parts) != FANOUT or not _level_ordered(parts, list(lvl.fields)):
                # (restored mid-way, or fields in another order than the level's: read them back,
                # so the merge is Level.get's, field order included)
                parts = [lvl.get(i) for i in range(lvl.size - FANOUT, lvl.size)]
            unmerged[level] = []
            s = merged = merge_summaries(parts)
            if level + 1 == len(self.levels):
                self.levels.append(Level())
                if self.directory is not None and level + 1 < STORED_LEVELS:
                    self.attach(self.directory)
            self.levels[level + 1].append(merged)
            level += 1

    def push_block(self, block: Block) -> None:
        """Push the summaries of consecutive base buckets, given column-wise: as :meth:`push` of
        each (the same levels, fields in the same order), but each level extended at once and its
        merges made in C, when no level the block reaches is new or gets a new field (else one by
        one: a young pyramid, a new field)."""
        if not self._takes(block):
            for i in range(len(block)):
                self.push(block.summary(i))
            return
        level = 0
        while len(block):
            block = self._extend_level(level, block)
            level += 1

    def _takes(self, block: Block) -> bool:
        """Whether every level that ``block`` reaches exists and has every field it brings there."""
        if _native_scanner() is None:  # (the merges are made in C)
            return False
        names = [name for name, cols in block.fields.items() if any(cols[0])]
        k = len(block)
        for lvl in self.levels:
            if not k:
                return True
            if not lvl.fields.keys() >= set(names):
                return False
            names = list(lvl.fields)  # (a merge has the level's fields)
            k = (lvl.size + k) // FANOUT - lvl.size // FANOUT
        return not k

    def _extend_level(self, level: int, block: Block) -> Block:
        """Append ``block`` to a level; return the merges of the groups it completes (for the
        level above: maybe none)."""
        lvl = self.levels[level]
        size = lvl.size
        lvl.extend(block)
        while len(self._unmerged) <= level:
            self._unmerged.append([])
        self._unmerged[level] = []  # (push's next merge here reads its parts back: Level.get)
        first, stop = size // FANOUT * FANOUT, (size + len(block)) // FANOUT * FANOUT
        if first == stop:
            return Block([b""] * 4, {})
        if first >= lvl.stored:
            return lvl.merge_tail(first, (stop - first) // FANOUT, FANOUT)
        # (the first group began before a flush: its parts read back, as push merges them)
        head = _block_of([merge_summaries([lvl.get(i) for i in range(first, first + FANOUT)])], lvl.fields)
        if first + FANOUT == stop:
            return head
        rest = lvl.merge_tail(first + FANOUT, (stop - first) // FANOUT - 1, FANOUT)
        fields = {name: [a + b for a, b in zip(cols, rest.fields[name])]
                  for name, cols in head.fields.items()}
        return Block([a + b for a, b in zip(head.base, rest.base)], fields)


def _block_of(summaries: Sequence[Summary], names: Iterable[str]) -> Block:
    """A block of ``summaries`` with the columns of fields ``names``."""
    base = [array(tc, map(attrgetter(attr), summaries)).tobytes()
            for tc, attr in zip(_BASE_TYPECODES, _BASE_COLUMNS)]
    fields = {}
    for name in names:
        cols = [array(tc) for tc in _FIELD_TYPECODES]
        for s in summaries:
            any(map(array.append, cols, s.fields.get(name) or repeat(0)))
        fields[name] = [c.tobytes() for c in cols]
    return Block(base, fields)
