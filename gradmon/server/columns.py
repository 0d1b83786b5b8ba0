"""Step records as columns: what the index sidecar keeps of each step record, and how a history
range is answered from it instead of decoding JSON lines.

A *row* is one step record, in file order: its line's byte offset, its step, its flags (bit k set:
``MARK_FLAGS[k]`` is ``true``) and, per numeric key, its value as a float64 (``MISSING``: no number
there; a NaN of the log stays a NaN). A key's column starts at the first row that had a number for
it (rows before hold none). :func:`step_rows` turns a parsed batch into rows (pure);
:func:`series_from_columns` answers like ``readback.series_from_lines`` from rows read back, exactly
(tests/test_sidecar.py checks the two agree). The files themselves are ``sidecar.py``'s.
"""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, islice, repeat
from operator import eq, itemgetter, le

from gradmon.logformat.schema import MARK_FLAGS, NOT_SERIES
from gradmon.logformat.values import FAST_TYPES, number
from gradmon.server.downsample import downsample_indices
from gradmon.server.native import scanner as _native_scanner
from gradmon.server.parse import KeyColumns, ParsedLines
from gradmon.server.segments import Intervals, Replaced
from gradmon.server.steps import TS

__all__ = ["MAX_COLUMNS", "MISSING", "MISSING_BITS", "Rows", "series_from_columns", "step_rows"]

# A quiet NaN with a payload no JSON value decodes to ("NaN" gives the canonical one): "no number".
MISSING_BITS = 0x7FF8_0000_DEAD_BEEF
MISSING: float = struct.unpack("<d", struct.pack("<Q", MISSING_BITS))[0]
MAX_COLUMNS = 256  # numeric keys kept as columns; a run with more is answered from its lines
_SKIP = (NOT_SERIES - {TS}) | {"type"}


@dataclass
class Rows:
    """Consecutive rows: offsets, steps, flags, and per key its values from ``columns[k][0]``
    (the position of its first row in this batch)."""

    offsets: array  # "q"
    steps: array  # "q"
    flags: bytearray
    # key -> (first position, its values from there: a "d" array, or for a key that has a column
    # already a "d" memoryview of the compiled scanner's float64s, not copied)
    columns: dict[str, tuple[int, array | memoryview]]

    def __len__(self) -> int:
        return len(self.steps)


def _packed(typecode: str, values: Sequence) -> array:
    """``array(typecode, values)`` for plain numbers, built by one ``struct.pack`` (about twice as
    fast as the array's own conversion, value by value the same C conversion)."""
    try:
        raw = struct.pack(f"={len(values)}{typecode}", *values)
    except struct.error:  # (out of range: the array says so, with its own error)
        return array(typecode, values)
    out = array(typecode)
    out.frombytes(raw)
    return out


def _floats(column: list, plain: bool = False) -> array:
    """The column as float64s (``MISSING`` where no number); ``plain``: every value is known to be
    an ``int`` or a ``float``."""
    if plain or set(map(type, column)) <= FAST_TYPES:
        try:
            return _packed("d", column)
        except OverflowError:  # an integer too big for a float: number() reads it as +-inf
            pass
    return array("d", [MISSING if (v := number(x)) is None else v for x in column])


def step_rows(parsed: ParsedLines, known: Collection[str], seen: set[str] | None = None) -> Rows:
    """The rows of a parsed batch's step records. ``known``: keys that already have a column (a
    column for a new key starts at its first number). ``seen`` (updated): every key of the step
    records so far; a batch whose records have no other key takes the keys to look at from
    ``known`` and ``seen`` instead of from every record (the common batch)."""
    recs = parsed.records
    cols = parsed.columns
    if cols is None or cols.records is not recs:
        cols = KeyColumns(recs)
    kinds = cols.values("type")
    if kinds.count("step") == len(recs):
        pos = None
        steps_recs = recs
        offsets = parsed.offsets
    else:  # the step records are some of them: their own columns (parse_lines took them, or not)
        is_step = list(map(eq, kinds, repeat("step")))
        pos = list(compress(range(len(recs)), is_step))
        cols = parsed.step_columns
        steps_recs = cols.records if cols is not None else list(compress(recs, is_step))
        offsets = list(compress(parsed.offsets, is_step))
    flags = bytearray(len(steps_recs))
    if parsed.check:  # only these records can hold a flag (parse.ParsedLines.check)
        for i in parsed.check:
            r = i if pos is None else bisect_left(pos, i)
            if pos is not None and (r == len(pos) or pos[r] != i):
                continue  # (not a step record)
            rec = recs[i]
            flags[r] = sum(1 << b for b, (flag, _k) in enumerate(MARK_FLAGS) if rec.get(flag) is True)
    columns: dict[str, tuple[int, array]] = {}
    if seen is not None and (seen.issuperset(cols.key_set()) if cols is not None
                             else all(map(seen.issuperset, steps_recs))):
        names: Iterable[str] = [*known, *(seen.difference(known).difference(_SKIP))]
    else:
        names = dict.fromkeys(chain.from_iterable(steps_recs))
        if seen is not None:
            seen.update(names)
    present = cols.key_set() if cols is not None else None
    for name in names:
        if name in _SKIP or (present is not None and name not in present and name not in known):
            continue  # (a key seen before, in no record of this batch, with no column: none now)
        native = cols.floats(name) if cols is not None else None
        if native is not None and name in known:  # (the scanner's float64s: the rows as they are)
            columns[name] = (0, memoryview(native).cast("d"))
            continue
        raw = list(map(dict.get, steps_recs, repeat(name))) if cols is None else cols.values(name)
        if name not in known:
            types = set(map(type, raw)) if cols is None else cols.types(name)
            if types.isdisjoint(FAST_TYPES):
                continue  # no number in this batch (absent, flags, text): no column yet
        if native is not None:  # (taken by the compiled scanner, value by value as _floats does)
            values = array("d")
            values.frombytes(native)
        else:
            values = _floats(raw, cols is not None and cols.fast(name))
        first = 0
        if name not in known:
            bits = array("Q", values.tobytes())
            while first < len(bits) and bits[first] == MISSING_BITS:
                first += 1
            if first == len(bits):
                continue  # no number yet: no column yet
            values = values[first:]
        columns[name] = (first, values)
    steps = list(map(itemgetter("step"), steps_recs)) if cols is None else cols.values("step")
    return Rows(_packed("q", offsets), _packed("q", steps), flags, columns)


def series_from_columns(steps: Sequence[int], offsets: Sequence[int], flags: bytes,
                        columns: dict[str, tuple[int, array]], start: float, end: float, points: int,
                        replaced: Replaced | None = None, keep_out: Intervals = (),
                        ) -> tuple[dict[str, tuple[list[int], list[float]]], bool]:
    """``readback.series_from_lines`` of the rows given (consecutive, in file order; each column
    ``(first position, values from there)``), with the same arguments and result."""
    gone = Replaced([keep_out]) if keep_out else None
    if replaced is None and gone is None and all(map(le, steps, islice(steps, 1, None))):
        # Steps in order (one segment, no rollback): the range is one stretch of rows.
        sel: Sequence[int] = range(bisect_left(steps, start), bisect_right(steps, end))
    else:
        sel = [i for i, s in enumerate(steps) if start <= s <= end
               and (replaced is None or not replaced.hides_at(offsets[i], s))
               and (gone is None or not gone.hides(0, s))]
    exact = len(sel) <= points
    if not sel:
        return {}, exact
    if isinstance(sel, range):
        sel_steps = list(steps[sel.start:sel.stop])
        contiguous = True
        marked = any(flags[sel.start:sel.stop])
    else:
        sel_steps = [steps[i] for i in sel]
        if not all(map(le, sel_steps, sel_steps[1:])):
            order = sorted(range(len(sel)), key=sel_steps.__getitem__)
            sel = [sel[k] for k in order]
            sel_steps = [sel_steps[k] for k in order]
        contiguous = sel[-1] - sel[0] + 1 == len(sel) and all(map(le, sel, sel[1:]))
        marked = any(flags)
    flagged: set[int] = set()
    if marked:  # (C builtins: a 20,000-row zoom's loop here was ~1.7 ms)
        picked = flags[sel.start:sel.stop] if isinstance(sel, range) else map(flags.__getitem__, sel)
        flagged = set(compress(range(len(sel)), picked))
    series: dict[str, tuple[list[int], list[float]]] = {}
    for name, (first, values) in columns.items():
        finite_only = name == TS
        a, b = sel[0] - first, sel[-1] + 1 - first
        if contiguous and a >= 0:  # the common range: no loop
            part = values[a:b]
            # (a finite sum: no NaN, so no MISSING either: one C pass, not a count of the bits)
            if math.isfinite(sum(part)) or (
                    not finite_only and array("Q", part.tobytes()).count(MISSING_BITS) == 0):
                series[name] = _downsampled_rows(sel_steps, part, flagged, exact, points)
                continue
        bits = array("Q", values.tobytes())
        pos = []
        vals = []
        for k, i in enumerate(sel):
            j = i - first
            if j < 0 or bits[j] == MISSING_BITS:
                continue
            v = values[j]
            if finite_only and not math.isfinite(v):
                continue
            pos.append(k)
            vals.append(v)
        if not pos:
            continue
        if len(pos) == len(sel):
            s_steps, keep = sel_steps, flagged
        else:
            s_steps = [sel_steps[k] for k in pos]
            keep = {m for m, k in enumerate(pos) if k in flagged} if flagged else set()
        series[name] = _downsampled(s_steps, vals, keep, exact, points)
    return series, exact


def _downsampled_rows(steps: list[int], values: array, keep: set[int], exact: bool,
                      points: int) -> tuple[list[int], list[float]]:
    """:func:`_downsampled` of a column's rows (float64, none ``MISSING``), the kept rows found by
    the compiled scanner's ``m4_indices`` (``downsample_indices``' rules, tests/test_native_scanner.py)
    when it is built: a 20,000-row zoom's nine series took ~20 ms of Python, ~2/3 of the answer."""
    native = None if exact else _native_scanner()
    idx = native.m4_indices(values, max(1, points // 4)) if native is not None else None
    if idx is None:
        return _downsampled(steps, values.tolist(), keep, exact, points)
    if keep:
        n = len(values)
        # (every row flagged: a diverged run's stretch; the flags' rows are the selection's, in range)
        inside = keep if min(keep) >= 0 and max(keep) < n else {k for k in keep if 0 <= k < n}
        idx = sorted(inside.union(idx))
    return list(map(steps.__getitem__, idx)), list(map(values.__getitem__, idx))


def _downsampled(steps: list[int], values: list[float], keep: set[int], exact: bool,
                 points: int) -> tuple[list[int], list[float]]:
    if exact:
        return list(steps), values
    idx = downsample_indices(values, max(1, points // 4), keep)
    return [steps[i] for i in idx], [values[i] for i in idx]
