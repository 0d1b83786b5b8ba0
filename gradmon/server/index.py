"""A per-run index in bounded memory: fast history of a 10M-line run without holding it.

- Numeric fields of ``step`` records go into a min/max *pyramid*: base buckets of ``BUCKET``
  consecutive step records keep, per field, the first, last, minimum and maximum finite value with
  their steps; every ``FANOUT`` buckets of a level merge into one bucket of the level above. A
  history query walks down from the top to the finest level that fits the requested points, so
  its cost depends on the points asked for, not on the run's length. Memory is ~70 bytes per
  field per 128 records (~55 MB for 10M records of 8 fields; ``ts`` counts as one more field).
- Each base bucket also stores the byte offset of its first record: a sparse offset index, so a
  zoomed range is read back from the file at full resolution by seeking.
- Building is batched for speed (a 1M-line file indexes in a few seconds): lines are decoded a
  batch at a time (``parse.parse_lines``), step records are held in the open bucket as decoded,
  and a bucket is summarized a column at a time with C builtins (``min``/``max``/``index``) when
  it closes; only the few records that may carry marks (a ``true`` flag, a non-finite value) are
  looked at one by one.
- Non-finite values and flagged steps (spike, skipped, nonfinite) are kept as *marks*, and
  eval records, events and headers are kept whole; each of these lists is capped. ``system``
  records (a few per minute) are kept per field, capped min/max-preserving (``sampled.py``); of
  ``layers`` records only the latest.
- Each header starts a *segment*. A run resumed from an older checkpoint repeats steps; for
  those the latest segment wins (:meth:`RunIndex.cutoffs`): queries leave the older records out.

Pure data structure: no I/O. The caller reads the file (see ``tail.read_lines``) when a plan asks.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from gradmon.schema import MARK_FLAGS, NOT_SERIES
from gradmon.server.downsample import downsample_indices
from gradmon.server.parse import ParsedLines, parse_lines
from gradmon.server.sampled import SampledSeries

__all__ = [
    "BUCKET", "FANOUT", "HistoryPlan", "RunIndex", "Summary", "merge_series", "merge_summaries",
    "series_from_lines",
]

BUCKET = 128  # step records per base bucket
FANOUT = 4  # buckets of a level per bucket of the level above
MAX_FIELDS = 128  # numeric fields indexed per run (a run logging thousands of names is capped)
MAX_MARKS = 20_000
MAX_EVENTS = 5_000
MAX_HEADERS = 1_000
MAX_EVAL_POINTS = 200_000
MAX_SYSTEM_POINTS = 20_000  # per system field; past that a field is downsampled (min/max kept)
MAX_SYSTEM_FIELDS = 64
EXACT_READ_MAX = 32_768  # step records a history request may read back from the file...
# ...or, so that even a range too short for the pyramid gets half the points asked for (the base
# level has 4 points per BUCKET records: 16 records per point asked for), up to this many.
READ_MAX = 131_072
SERIES_CHUNK = 8_192  # lines decoded at a time when reading a range back

# The wall-clock field: not listed in a run's ``fields``, but indexed and returned as the history
# series ``ts`` (steps -> Unix seconds), so a page can place any step in time.
TS = "ts"


def _number(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number (not a bool); a huge integer is ``inf``."""
    t = type(v)
    if t is float:
        return v
    if t is int:
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    return None


def _finite(v: Any) -> float | None:
    x = _number(v)
    return x if x is not None and math.isfinite(x) else None


_FAST_TYPES = frozenset({float, int})


def _column_summary(values: Sequence[Any], steps: list[int]) -> tuple[list | None, bool]:
    """``[count, first_step, first, last_step, last, min_step, min, max_step, max]`` of the finite
    numbers among ``values`` (``steps[i]`` is the step of ``values[i]``), ``None`` when there is
    none; and whether some value was a non-finite number.

    The common column (all plain finite numbers) is summarized by C builtins, no Python loop."""
    if set(map(type, values)) <= _FAST_TYPES:
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
        v = _number(raw)
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


class _Level:
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


class RunIndex:
    """Everything the server keeps about one run (one generation of its file)."""

    def __init__(self) -> None:
        self.records = 0
        self.malformed = 0
        self.step_records = 0
        self.last_step: int | None = None
        self.min_step: int | None = None
        self.max_step: int | None = None
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.header: dict | None = None
        self.ended: str | None = None  # status of the `end` record of the latest segment
        self.status_records = 0  # header and end records seen
        self.fields: list[str] = []
        self._field_set: set[str] = set()
        self._has_ts = False  # some step record had a finite ``ts``: history has a ``ts`` series
        # Keys of step records seen so far: a record with only known keys needs no field discovery.
        self._known: set[str] = set(NOT_SERIES - {TS}) | {"type"}
        self._text_names: set[str] = set()  # keys seen with non-number, non-bool values only
        self.levels: list[_Level] = [_Level()]
        # The open bucket: step records not yet summarized (fewer than BUCKET), in file order.
        self._ob_recs: list[dict] = []
        self._ob_steps: list[int] = []
        self._ob_offset = 0
        self._ob_marked: set[int] = set()  # positions in the open bucket whose marks are taken
        self._ob_cache: tuple[int, Summary] | None = None
        self.marks: list[tuple[int, str, str, float]] = []  # (step, kind, field, value)
        self.marks_dropped = 0
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.events_dropped = 0
        self.headers: list[dict] = []
        self.eval: dict[str, tuple[list[int], list[float]]] = {}
        self._eval_seg: dict[str, array] = {}  # segment of each eval point
        self._mark_seg = array("I")  # segment of each mark
        # Segments (a header starts one): first base bucket, byte offset of the header, smallest
        # step. A restarted run whose steps go back overrides the steps it repeats (see cutoffs()).
        self._seg_bucket = array("q", [0])
        self._seg_offset = array("q", [0])
        self._seg_min: list[float] = [math.inf]
        self._seg_max: list[float] = [-math.inf]
        self._hidden: dict[int, float] = {}  # during a query: see _overridden_buckets()
        self._hidden_sorted: list[int] = []
        self._eval_points = 0
        self.eval_dropped = 0
        self.system = SampledSeries(MAX_SYSTEM_POINTS, MAX_SYSTEM_FIELDS)
        self.layers: dict | None = None  # the latest `layers` record

    # ---- building -------------------------------------------------------------------------

    def add_lines(self, lines: Sequence[tuple[int, bytes | None]], start: int) -> ParsedLines:
        """Decode and index a batch of lines (``(end_offset, line)`` pairs, the first line
        starting at byte ``start``); return what was decoded (invalid lines are counted in
        ``malformed``)."""
        parsed = parse_lines(lines, start)
        self.malformed += parsed.malformed
        self._add_records(parsed.records, parsed.offsets, parsed.check)
        return parsed

    def add_line(self, line: bytes | None, offset: int) -> dict | None:
        """Decode one line (starting at byte ``offset``) and index it; return the record, or
        ``None`` (counted in ``malformed``) for a line that is not a valid record."""
        parsed = self.add_lines([(offset + len(line or b"") + 1, line)], offset)
        return parsed.records[0] if parsed.records else None

    def add(self, rec: dict, offset: int) -> None:
        """Index one valid (decoded) record that starts at byte ``offset`` of the file."""
        self._add_records([rec], [offset], [0])

    def _add_records(self, recs: list[dict], offsets: list[int], check: list[int]) -> None:
        """Index valid records in file order; ``check``: indices (ascending) of those that may
        carry marks (see ``parse.ParsedLines.check``)."""
        if not recs:
            return
        self.records += len(recs)
        kinds = list(map(itemgetter("type"), recs))
        n_steps = kinds.count("step")
        if n_steps == len(recs):  # the common batch: step records only
            self._add_steps(recs, offsets, check)
        else:  # runs of step records between the other records, in file order
            i = 0
            while i < len(recs):
                if kinds[i] != "step":
                    self._add_other(recs[i], offsets[i])
                    i += 1
                    continue
                j = i + 1
                while j < len(recs) and kinds[j] == "step":
                    j += 1
                self._add_steps(recs[i:j], offsets[i:j], [c - i for c in check if i <= c < j])
                i = j
        self._ob_cache = None
        for rec in reversed(recs):
            ts = _finite(rec.get(TS))
            if ts is not None:
                self.last_ts = ts
                break
        if self.first_ts is None:
            for rec in recs:
                ts = _finite(rec.get(TS))
                if ts is not None:
                    self.first_ts = ts
                    break

    def _add_steps(self, recs: list[dict], offsets: list[int], check: list[int]) -> None:
        """Index consecutive step records: whole slices go into the open bucket at a time."""
        steps = list(map(itemgetter("step"), recs))
        self.step_records += len(recs)
        self.last_step = steps[-1]
        lo, hi = min(steps), max(steps)
        if lo < self._seg_min[-1]:
            self._seg_min[-1] = lo
        if hi > self._seg_max[-1]:
            self._seg_max[-1] = hi
        self.min_step = lo if self.min_step is None else min(self.min_step, lo)
        self.max_step = hi if self.max_step is None else max(self.max_step, hi)
        if not all(map(self._known.issuperset, recs)):
            for rec in recs:
                if not self._known.issuperset(rec):
                    self._discover(rec)
        for c in check:
            self._step_marks(recs[c], steps[c])
        checks = iter(check)
        c = next(checks, -1)
        i, n = 0, len(recs)
        while i < n:
            ob = self._ob_recs
            if not ob:
                self._ob_offset = offsets[i]
            j = min(n, i + BUCKET - len(ob))
            while 0 <= c < j:
                self._ob_marked.add(len(ob) + c - i)
                c = next(checks, -1)
            ob.extend(recs[i:j])
            self._ob_steps.extend(steps[i:j])
            if len(ob) >= BUCKET:
                self._close_bucket()
            i = j

    def _add_other(self, rec: dict, offset: int) -> None:
        kind = rec["type"]
        if kind == "header":
            self._new_segment(offset)
        if kind == "eval":
            self._add_eval(rec)
        elif kind == "system":
            self._add_system(rec)
        elif kind == "layers":
            self.layers = rec
        elif kind == "header":
            self.status_records += 1
            self.header = rec
            self.ended = None
            if len(self.headers) < MAX_HEADERS:
                self.headers.append(rec)
        elif kind == "event":
            if len(self.events) == self.events.maxlen:
                self.events_dropped += 1
            self.events.append(rec)
        elif kind == "end":
            self.status_records += 1
            self.ended = rec.get("status") if isinstance(rec.get("status"), str) else "finished"

    def _new_segment(self, offset: int) -> None:
        """A header at byte ``offset``: the records after it are a new segment (the open bucket is
        closed early, so that no base bucket holds two segments)."""
        if self._ob_recs:
            self._close_bucket()
        if self.levels[0].size == self._seg_bucket[-1] and self._seg_min[-1] == math.inf:
            self._seg_offset[-1] = offset  # no step record in the current segment: reuse it
            return
        self._seg_bucket.append(self.levels[0].size)
        self._seg_offset.append(offset)
        self._seg_min.append(math.inf)
        self._seg_max.append(-math.inf)

    def cutoffs(self) -> list[float]:
        """Per segment, the step from which its records are overridden: the smallest step of any
        later segment (``inf`` for the last). A run resumed from an older checkpoint repeats
        steps; for those the latest segment wins, so history shows one value per step."""
        out = [math.inf] * len(self._seg_min)
        low = math.inf
        for k in range(len(out) - 1, -1, -1):
            out[k] = low
            low = min(low, self._seg_min[k])
        return out

    def segment_cutoffs(self) -> list[tuple[int, float]]:
        """``(byte offset where a segment starts, its cutoff)`` for every segment, in file
        order, when some segment is overridden; else ``[]`` (see :func:`series_from_lines`)."""
        cut = self.cutoffs()
        if all(mx < c for mx, c in zip(self._seg_max, cut)):
            return []
        return list(zip(self._seg_offset, cut))

    def _overridden_buckets(self) -> dict[int, float]:
        """Base buckets holding records that a later segment overrides, with the cutoff step."""
        out: dict[int, float] = {}
        cut = self.cutoffs()
        lvl0 = self.levels[0]
        for k, c in enumerate(cut):
            if self._seg_max[k] < c:
                continue
            b1 = self._seg_bucket[k + 1] if k + 1 < len(cut) else lvl0.size
            for b in range(self._seg_bucket[k], b1):
                if lvl0.hi[b] >= c:
                    out[b] = c
        return out

    def _hidden_in(self, node: tuple[int, int]) -> bool:
        """Whether a node holds overridden records (then it is split down to base buckets)."""
        level, i = node
        if level < 0 or not self._hidden_sorted:
            return False
        lo = i * FANOUT**level
        j = bisect_left(self._hidden_sorted, lo)
        return j < len(self._hidden_sorted) and self._hidden_sorted[j] < lo + FANOUT**level

    def _discover(self, rec: dict) -> None:
        """Register the numeric fields of a step record that has keys not seen before."""
        for name, raw in rec.items():
            if name in self._known:
                continue
            if _number(raw) is None:
                if not isinstance(raw, bool):  # flags stay flags; other values are re-checked
                    self._text_names.add(name)
                self._known.add(name)
                continue
            self._known.add(name)
            self._text_names.discard(name)
            self._add_field(name)

    def _add_field(self, name: str) -> None:
        if name == TS:
            self._has_ts = True
        elif name not in self._field_set and len(self.fields) < MAX_FIELDS:
            self._field_set.add(name)
            self.fields.append(name)

    def _mark(self, step: int, kind: str, name: str, value: Any) -> None:
        if len(self.marks) >= MAX_MARKS:
            self.marks_dropped += 1
            return
        self.marks.append((step, kind, name, value))
        self._mark_seg.append(len(self._seg_min) - 1)

    def _step_marks(self, rec: dict, step: int) -> None:
        """The marks of one step record: its non-finite field values, then its flags."""
        nonfinite_marked = False
        for name, raw in rec.items():
            if name in self._field_set:
                v = _number(raw)
                if v is not None and not math.isfinite(v):
                    self._mark(step, "nonfinite", name, v)
                    nonfinite_marked = True
        for flag, kind in MARK_FLAGS:
            if rec.get(flag) is True and not (kind == "nonfinite" and nonfinite_marked):
                name = "grad_norm" if "grad_norm" in rec else "loss"
                self._mark(step, kind, name, _number(rec.get(name)))

    def _summarize(self, recs: list[dict], steps: list[int], offset: int, marked: set[int] | None) -> Summary:
        """The summary of consecutive step records, column by column (``marked``: positions whose
        marks are taken; the others get theirs here if a value turns out non-finite)."""
        out = Summary(offset)
        out.n = len(steps)
        out.lo = min(steps)
        out.hi = max(steps)
        for name in list(self._text_names):  # a key first seen with text values, now a number?
            if any(_number(r.get(name)) is not None for r in recs):
                self._text_names.discard(name)
                self._add_field(name)
        names = self.series_names()
        if not names:
            return out
        for name in names:
            f, nonfinite = _column_summary(list(map(dict.get, recs, repeat(name))), steps)
            if f is not None:
                out.fields[name] = f
            if nonfinite and marked is not None and name != TS:
                # Non-finite values where no mark was expected (a literal like 1e999): mark them.
                for i, r in enumerate(recs):
                    v = _number(r.get(name))
                    if i not in marked and v is not None and not math.isfinite(v):
                        self._mark(steps[i], "nonfinite", name, v)
        return out

    def _close_bucket(self) -> None:
        self._push(self._summarize(self._ob_recs, self._ob_steps, self._ob_offset, self._ob_marked))
        self._ob_recs = []
        self._ob_steps = []
        self._ob_marked = set()
        self._ob_cache = None

    @property
    def _open(self) -> Summary | None:
        """The open bucket's summary (computed on demand, cached until the bucket changes)."""
        if not self._ob_recs:
            return None
        n = len(self._ob_recs)
        if self._ob_cache is None or self._ob_cache[0] != n:
            self._ob_cache = (n, self._summarize(self._ob_recs, self._ob_steps, self._ob_offset, None))
        return self._ob_cache[1]

    def _push(self, s: Summary) -> None:
        self.levels[0].append(s)
        level = 0
        while self.levels[level].size % FANOUT == 0:
            lvl = self.levels[level]
            merged = merge_summaries([lvl.get(i) for i in range(lvl.size - FANOUT, lvl.size)])
            if level + 1 == len(self.levels):
                self.levels.append(_Level())
            self.levels[level + 1].append(merged)
            level += 1

    def _add_eval(self, rec: dict) -> None:
        step = rec.get("step")
        if not isinstance(step, int):
            return
        for name, raw in rec.items():
            if name in NOT_SERIES:
                continue
            v = _number(raw)
            if v is None:
                continue
            if self._eval_points >= MAX_EVAL_POINTS:
                self.eval_dropped += 1
                continue
            steps, values = self.eval.setdefault(name, ([], []))
            steps.append(step)
            values.append(v)
            self._eval_seg.setdefault(name, array("I")).append(len(self._seg_min) - 1)
            self._eval_points += 1

    def _add_system(self, rec: dict) -> None:
        step = rec.get("step")
        if type(step) is not int or not -(1 << 63) <= step < (1 << 63):
            return  # sampled before the first step (no `step`), or a step no array can hold
        values = [(name, v) for name, raw in rec.items()
                  if name not in NOT_SERIES and (v := _number(raw)) is not None]
        self.system.add(step, values, len(self._seg_min) - 1, self.cutoffs)

    # ---- querying -------------------------------------------------------------------------

    def _node(self, node: tuple[int, int]) -> Summary:
        level, i = node
        if level < 0:
            assert self._open is not None
            return self._open
        return self.levels[level].get(i)

    def _overlaps(self, node: tuple[int, int], start: float, end: float) -> bool:
        level, i = node
        if level < 0:
            o = self._open
            return o is not None and o.lo <= end and o.hi >= start
        lvl = self.levels[level]
        if level == 0 and i in self._hidden and lvl.lo[i] >= self._hidden[i]:
            return False  # every record of this bucket is overridden
        return lvl.lo[i] <= end and lvl.hi[i] >= start

    def _count(self, node: tuple[int, int]) -> int:
        level, i = node
        if level < 0:
            return self._open.n if self._open is not None else 0
        return self.levels[level].n[i]

    def cover(self, start: float, end: float, max_nodes: int) -> list[tuple[int, int]]:
        """Nodes ``(level, index)`` (level -1: the open bucket), in file order, that overlap the
        step range ``[start, end]``: the finest level whose node count stays within ``max_nodes``,
        with an evenly spread part of its nodes split one level further to come close to
        ``max_nodes`` (a whole level more would be up to ``FANOUT`` times too many)."""
        nodes: list[tuple[int, int]] = []
        covered = 0  # base buckets covered by the coarser levels already listed
        for level in range(len(self.levels) - 1, -1, -1):
            width = FANOUT**level
            lvl = self.levels[level]
            nodes.extend((level, i) for i in range(covered // width, lvl.size))
            covered = max(covered, lvl.size * width)
        if self._open is not None:
            nodes.append((-1, 0))
        nodes = [nd for nd in nodes if self._overlaps(nd, start, end)]
        while True:
            top = max((lv for lv, _ in nodes), default=0)
            if top <= 0:
                return self._refine_edges(nodes, start, end)
            refined: list[tuple[int, int]] = []
            for lv, i in nodes:
                if lv != top:
                    refined.append((lv, i))
                    continue
                for c in range(i * FANOUT, i * FANOUT + FANOUT):
                    if self._overlaps((lv - 1, c), start, end):
                        refined.append((lv - 1, c))
            if len(refined) > max_nodes:
                return self._refine_edges(self._refine_some(nodes, top, max_nodes, start, end), start, end)
            nodes = refined

    def _refine_some(self, nodes: list[tuple[int, int]], top: int, max_nodes: int, start: float,
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
                       if self._overlaps((lv - 1, c), start, end))
        return out

    def _partial(self, node: tuple[int, int], start: float, end: float) -> bool:
        s = self._node(node)
        return s.lo < start or s.hi > end or self._hidden_in(node)

    def _refine_edges(self, nodes: list[tuple[int, int]], start: float, end: float) -> list[tuple[int, int]]:
        """Split nodes that only partly overlap the range down to base buckets: their min/max may
        lie outside the range, so the caller reads those few buckets back from the file."""
        while True:
            out: list[tuple[int, int]] = []
            split = False
            for lv, i in nodes:
                if lv > 0 and self._partial((lv, i), start, end):
                    split = True
                    out.extend((lv - 1, c) for c in range(i * FANOUT, i * FANOUT + FANOUT)
                               if self._overlaps((lv - 1, c), start, end))
                else:
                    out.append((lv, i))
            if not split:
                return out
            nodes = out

    def _node_end(self, node: tuple[int, int], cursor: int) -> int:
        """Byte offset just after the records of a base node (or the open bucket)."""
        level, i = node
        if level < 0:
            return cursor
        base = self.levels[0]
        if i + 1 < base.size:
            return base.offset[i + 1]
        return self._open.offset if self._open is not None else cursor

    def plan_history(self, start: float, end: float, points: int, cursor: int) -> HistoryPlan:
        """Decide how to answer a history query for steps in ``[start, end]`` with about
        ``points`` points per series, the file being complete up to byte ``cursor``.

        Records overridden by a later segment (see :meth:`cutoffs`) are left out: the nodes that
        hold some are split down to base buckets, which are skipped when all their records are
        overridden and read back otherwise."""
        self._hidden = self._overridden_buckets()
        self._hidden_sorted = sorted(self._hidden)
        try:
            return self._plan(start, end, points, cursor)
        finally:
            self._hidden, self._hidden_sorted = {}, []

    def _plan(self, start: float, end: float, points: int, cursor: int) -> HistoryPlan:
        buckets = max(1, points // 4)
        nodes = self.cover(start, end, buckets)
        count = sum(self._count(nd) for nd in nodes)
        coarse = 4 * len(nodes) < points // 2  # even base buckets would give too few points
        read_max = min(max(EXACT_READ_MAX, 16 * points), READ_MAX)
        if count <= points or (coarse and count <= read_max):
            fine = self.cover(start, end, read_max // BUCKET + 8)
            if fine and all(lv <= 0 for lv, _ in fine):
                return HistoryPlan(
                    kind="exact" if count <= points else "read",
                    byte_lo=self._node(fine[0]).offset,
                    byte_hi=self._node_end(fine[-1], cursor),
                    cutoffs=self.segment_cutoffs(),
                )
        series: dict[str, tuple[list[int], list[float]]] = {}
        inner = [nd for nd in nodes if not self._partial(nd, start, end)]
        edges = [(self._node(nd).offset, self._node_end(nd, cursor), start,
                  min(end, self._hidden.get(nd[1], math.inf) - 1) if nd[0] == 0 else end)
                 for nd in nodes if self._partial(nd, start, end)]  # base buckets only, after _refine_edges
        summaries = [self._node(nd) for nd in inner]
        for name in self.series_names():
            pts: list[tuple[int, float]] = []
            for s in summaries:
                pts.extend(s.points(name))
            series[name] = ([p[0] for p in pts], [p[1] for p in pts])
        self._add_marks_to(series, start, end)
        return HistoryPlan(kind="pyramid", series=series, edges=edges)

    def series_names(self) -> list[str]:
        """The names of the history series: the numeric fields, then ``ts`` when known."""
        return [*self.fields, TS] if self._has_ts else list(self.fields)

    def _add_marks_to(self, series: dict[str, tuple[list[int], list[float]]], start: float,
                      end: float) -> None:
        """Put every mark's point into its series (so no spike or NaN is ever sampled away)."""
        extra: dict[str, list[tuple[int, float]]] = {}
        for step, _kind, name, value in self.visible_marks(start, end):
            if value is not None and name in series:
                extra.setdefault(name, []).append((step, value))
        merge_series(series, {n: ([p[0] for p in pts], [p[1] for p in pts]) for n, pts in extra.items()})

    def visible_marks(self, start: float, end: float) -> list[tuple[int, str, str, float]]:
        """``(step, kind, field, value)`` of the marks with steps in ``[start, end]`` that no later
        segment overrides."""
        cut = self.cutoffs()
        return [m for m, k in zip(self.marks, self._mark_seg) if start <= m[0] <= end and m[0] < cut[k]]

    def marks_in(self, start: float, end: float) -> list[dict]:
        return [{"step": s, "kind": k, "field": f, "value": v}
                for s, k, f, v in self.visible_marks(start, end)]

    def eval_in(self, start: float, end: float) -> dict[str, dict[str, list]]:
        out = {}
        cut = self.cutoffs()
        for name, (steps, values) in self.eval.items():
            segs = self._eval_seg[name]
            idx = [i for i, s in enumerate(steps) if start <= s <= end and s < cut[segs[i]]]
            out[name] = {"step": [steps[i] for i in idx], "value": [values[i] for i in idx]}
        return out

    def system_in(self, start: float, end: float, points: int) -> dict[str, dict[str, list]]:
        """The system fields' points with steps in ``[start, end]`` (latest segment wins), each
        downsampled min/max-preserving to about ``points`` when it has more."""
        return self.system.query(start, end, points, self.cutoffs())

    def events_in(self, start: float, end: float) -> list[dict]:
        out = []
        for ev in self.events:
            s = ev.get("step")
            if not isinstance(s, int) or start <= s <= end:
                out.append(ev)
        return out

    def stats(self) -> dict[str, Any]:
        """Sizes of what the index holds (for ``GradmonServer.stats`` and benchmarks)."""
        return {"records": self.records, "step_records": self.step_records, "malformed": self.malformed,
                "levels": [lvl.size for lvl in self.levels], "fields": len(self.fields),
                "marks": len(self.marks), "events": len(self.events)}

    def summary(self) -> dict[str, Any]:
        """The index's part of a run's ``/api/runs`` entry."""
        return {
            "records": self.records,
            "malformed": self.malformed,
            "last_step": self.last_step,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "header": self.header,
            "fields": list(self.fields),
            "eval_fields": list(self.eval),
            "system_fields": self.system.names(),
        }


def merge_series(into: dict[str, tuple[list[int], list[float]]],
                 extra: dict[str, tuple[list[int], list[float]]]) -> None:
    """Add ``extra``'s points to ``into`` (in place), keeping each series in step order."""
    for name, (steps, values) in extra.items():
        if not steps:
            continue
        old_s, old_v = into.get(name, ([], []))
        pts = sorted(set(zip(old_s, values_key(old_v))) | set(zip(steps, values_key(values))),
                     key=lambda p: p[0])
        into[name] = ([p[0] for p in pts], [_unkey(p[1]) for p in pts])


def values_key(values: Iterable[float]) -> list[Any]:
    """Values made hashable-and-equal for de-duplication (NaN != NaN otherwise)."""
    return [("nan",) if isinstance(v, float) and math.isnan(v) else v for v in values]


def _unkey(v: Any) -> float:
    return math.nan if v == ("nan",) else v


def _plain_floats(column: list[Any], finite_only: bool) -> list[float] | None:
    """The column as floats when every value is a number (and finite, if asked), else ``None``."""
    if not set(map(type, column)) <= _FAST_TYPES:
        return None
    try:
        values = list(map(float, column))
    except OverflowError:
        return None
    if finite_only and not math.isfinite(sum(values)):
        return None
    return values


def series_from_lines(lines: Iterable[tuple[int, bytes | None]], start: float, end: float,
                      points: int, first_offset: int = 0, cutoffs: Sequence[tuple[int, float]] = ()
                      ) -> tuple[dict[str, tuple[list[int], list[float]]], bool]:
    """Series of the step records among ``lines`` (the first starting at byte ``first_offset``)
    with steps in ``[start, end]`` (the numeric fields and ``ts``), in file order. ``cutoffs``
    (``RunIndex.segment_cutoffs()``) leaves out the records a later segment overrides.

    Returns ``(series, exact)``: all points when there are at most ``points`` records, else each
    series downsampled to ``points // 4`` buckets keeping flagged steps and non-finite values.
    """
    # Decoded a chunk at a time, keeping only columns: a 100k-line read never holds 100k dicts.
    lines = lines if isinstance(lines, list) else list(lines)
    seg_starts = [o for o, _c in cutoffs]
    steps: list[int] = []
    columns: dict[str, list[Any]] = {}  # every key, in order of first appearance
    flagged: set[int] = set()  # positions of records with a flag set
    offset = first_offset
    for k in range(0, len(lines), SERIES_CHUNK):
        chunk = lines[k:k + SERIES_CHUNK]
        parsed = parse_lines(chunk, offset)
        offset = chunk[-1][0]
        recs = [r for r, o in zip(parsed.records, parsed.offsets)
                if r["type"] == "step" and start <= r["step"] <= end
                and (not cutoffs or r["step"] < cutoffs[max(0, bisect_right(seg_starts, o) - 1)][1])]
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
    series = {}
    for name, column in columns.items():
        if name in NOT_SERIES and name != TS:
            continue
        if set(map(type, column)).isdisjoint(_FAST_TYPES):
            continue  # no number at all (flags, text)
        values = _plain_floats(column, finite_only=name == TS)
        if values is not None:  # the common column: a number in every record
            s_steps, keep = steps, flagged
        else:
            pos = [i for i, raw in enumerate(column)
                   if (v := _number(raw)) is not None and (name != TS or math.isfinite(v))]
            if not pos:
                continue
            values = [_number(column[i]) for i in pos]  # type: ignore[misc]
            s_steps = [steps[i] for i in pos]
            keep = {k for k, i in enumerate(pos) if i in flagged} if flagged else set()
        if not exact:
            idx = downsample_indices(values, max(1, points // 4), keep)
            s_steps = [s_steps[i] for i in idx]
            values = [values[i] for i in idx]
        series[name] = (list(s_steps), values)
    return series, exact
