"""The step records of a run, indexed: their numeric fields, their marks, and the min/max pyramid.

Building is batched for speed: step records are held in the *open bucket* as decoded, and a bucket
is summarized a column at a time with C builtins (``sorted``/``index``) when it closes (see
benchmarks/README.md for the speed); the whole buckets that a batch read by the compiled line
scanner fills are summarized from its float64 columns without passing through the open bucket
(``KeyColumns.bucket_columns``, the same summaries), and an open bucket filled by such batches
keeps their float64 pieces instead of lists, summarized by the scanner too (``summarize_floats``).
Only the few records that may carry marks (a ``true`` flag, a non-finite value:
``parse.ParsedLines.check``) are looked at one by one. Non-finite values and flagged steps (spike,
skipped, nonfinite) are kept as *marks*, capped.

Pure data structure: no I/O.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import islice, repeat
from operator import le
from typing import Any, Optional

from gradmon.logformat.schema import MARK_FLAGS, NOT_SERIES, OVERFLOW_REASON
from gradmon.logformat.values import FAST_TYPES, number
from gradmon.server.parse import KeyColumns, summarize_floats
from gradmon.server.pyramid import BUCKET, Block, Pyramid, Summary, column_summary
from gradmon.server.steprecords import StepRecords

__all__ = ["MAX_FIELDS", "MAX_MARKS", "TS", "Mark", "StepSeries"]

MAX_FIELDS = 128  # numeric fields indexed per run (a run logging thousands of names is capped)
MAX_MARKS = 20_000

# The wall-clock field: not listed in a run's ``fields``, but indexed and returned as the history
# series ``ts`` (steps -> Unix seconds), so a page can place any step in time.
TS = "ts"

Mark = tuple[int, str, str, float, Optional[str]]  # (step, kind, field, value, skip reason)


class StepSeries:
    """What the index keeps of a run's step records."""

    def __init__(self) -> None:
        self.count = 0
        self.last_step: int | None = None
        self.min_step: int | None = None
        self.max_step: int | None = None
        self.fields: list[str] = []
        self._field_set: set[str] = set()
        self._has_ts = False  # some step record had a finite ``ts``: history has a ``ts`` series
        # Keys of step records seen so far: a record with only known keys needs no field discovery.
        self._known: set[str] = set(NOT_SERIES - {TS}) | {"type"}
        self._text_names: set[str] = set()  # keys seen with non-number, non-bool values only
        self.pyramid = Pyramid()
        # The open bucket: step records not yet summarized (fewer than BUCKET), in file order.
        self._ob_recs: list[dict] = []
        self._ob_steps: list[int] = []
        self._ob_offset = 0
        self._ob_marked: set[int] = set()  # positions in the open bucket whose marks are taken
        self._ob_cache: tuple[int, Summary] | None = None
        self._init_columns()
        self.marks: list[Mark] = []
        self.mark_segments = array("I")  # segment of each mark
        self.marks_dropped = 0
        self._segment = 0

    def _init_columns(self) -> None:
        # The open bucket's values per series name, taken from each batch's columns (one
        # ``dict.get`` pass per key and batch, shared with the sidecar's rows: parse.KeyColumns),
        # and the names with a piece whose types are not known to be plain int/float. A name not
        # here is read from the bucket's records. Not pickled: a restored index reads its records.
        self._ob_cols: dict[str, list] = {}
        self._ob_unchecked: set[str] = set()
        # The open bucket's float64 values per series name (``KeyColumns.float_piece``), for the
        # names whose every value in it the compiled scanner read: those have no list above, and
        # the bucket's summary of them is the scanner's (``bucket_summaries``: column_summary's).
        self._ob_floats: dict[str, bytearray] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_ob_cols"], state["_ob_unchecked"], state["_ob_floats"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_columns()

    @property
    def open_records(self) -> int:
        """Step records in the open bucket (not summarized yet)."""
        return len(self._ob_recs)

    def series_names(self) -> list[str]:
        """The names of the history series: the numeric fields, then ``ts`` when known."""
        return [*self.fields, TS] if self._has_ts else list(self.fields)

    def add(self, recs: Sequence[dict], offsets: list[int], check: list[int],
            segment: int, columns: KeyColumns | None = None) -> tuple[int, int, bool]:
        """Index consecutive step records (starting at byte ``offsets[i]``) of ``segment``;
        ``check``: positions of those that may carry marks; ``columns``: their values by key, when
        taken already (``parse.KeyColumns`` of ``recs``). Whole slices go into the open bucket.
        Returns their smallest and largest step, and whether their steps never go back."""
        self._segment = segment
        if columns is None or columns.records is not recs:
            columns = KeyColumns(recs)
        steps = columns.values("step")  # (every step record has an int step: parse.py)
        self.count += len(recs)
        self.last_step = steps[-1]
        if columns.increasing():  # (the common batch; shared with the alarm rule)
            lo, hi, ordered = steps[0], steps[-1], True
        else:
            lo, hi = min(steps), max(steps)
            ordered = steps[0] == lo and steps[-1] == hi and all(map(le, steps, islice(steps, 1, None)))
        self.min_step = lo if self.min_step is None else min(self.min_step, lo)
        self.max_step = hi if self.max_step is None else max(self.max_step, hi)
        # Fields are decided record by record, in file order (never per batch or per bucket), so
        # that the index is the same wherever the log's lines are split into batches: a key
        # becomes a field at its first record with a number there. ``added``: the fields this
        # batch adds, at the position of the record that adds each.
        added: dict[str, int] = {}
        keys = columns.key_set()
        # Keys that some record here has as a number while they are no fields yet (or are new: a
        # key's first records may hold text or None, its first number is in a later one).
        pending = {name for name in keys if (name in self._text_names or name not in self._known)
                   and not columns.types(name).isdisjoint(FAST_TYPES)} \
            if self._text_names or not self._known.issuperset(keys) else set()
        if pending or not self._known.issuperset(keys):  # (else every record's keys are known)
            # (the compiled scanner's records are made when read: only those with such keys are)
            runs = recs.shape_runs() if isinstance(recs, StepRecords) else [(0, len(recs), None)]
            for first, stop, shape in runs:
                for pos in range(first, stop):
                    have = recs[pos] if shape is None else shape
                    if not self._known.issuperset(have) or (pending and not pending.isdisjoint(have)):
                        self._discover(recs[pos], pos, added)
                        # (later records are looked at only for keys still unknown or text)
                        pending -= self._known - self._text_names
                    elif shape is not None:
                        break  # (the run's later records have the same keys: none is looked at either)
        names = self.series_names()
        plain: list[tuple[str, bool]] | None = None  # (name, known plain ints/floats only), when needed
        checks = iter(check)
        c = next(checks, -1)
        i, n = 0, len(recs)
        while i < n:
            ob = self._ob_recs
            if not ob and n - i >= BUCKET and (done := self._whole_buckets(columns, names, i, offsets,
                                                                           steps)):
                while 0 <= c < i + done:  # (the marks of their records, in order, as below)
                    self._step_marks(recs[c], steps[c],
                                     [name for name, at in added.items() if at > c] if added else None)
                    c = next(checks, -1)
                i += done
                continue
            if not ob:
                self._ob_offset = offsets[i]
            j = min(n, i + BUCKET - len(ob))
            while 0 <= c < j:  # (a piece's marks before its bucket closes: as fed line by line)
                self._step_marks(recs[c], steps[c],
                                 [name for name, at in added.items() if at > c] if added else None)
                self._ob_marked.add(len(ob) + c - i)
                c = next(checks, -1)
            obc, obf = self._ob_cols, self._ob_floats
            if plain is None:
                plain = [(name, columns.known_plain(name)) for name in names]
            for name, fast in plain:
                floats = obf.get(name)
                if floats is not None or not ob:  # (a name's floats start with its bucket)
                    got = columns.float_piece(name, i, j)
                    if got is not None:
                        if floats is None:
                            obf[name] = bytearray(got)
                        else:
                            floats += got
                        continue
                    if floats is not None:  # (a piece the scanner did not read: a list from here on)
                        del obf[name]
                col = obc.get(name)
                if col is None:  # (a new field, or a restored index: the bucket's records have it)
                    col = obc[name] = list(map(dict.get, ob, repeat(name)))
                    if ob:
                        self._ob_unchecked.add(name)
                col.extend(columns.piece(name, i, j))
                if not fast:
                    self._ob_unchecked.add(name)
            ob.extend(recs[i:j])
            self._ob_steps.extend(steps[i:j])
            if len(ob) >= BUCKET:
                self.close_bucket()
            i = j
        self._ob_cache = None
        return lo, hi, ordered

    def _whole_buckets(self, columns: KeyColumns, names: list[str], i: int, offsets: list[int],
                       steps: list[int]) -> int:
        """Push the whole buckets that the records from position ``i`` fill (the open bucket being
        empty) straight into the pyramid, as one block summarized from the compiled scanner's
        float64 columns (``KeyColumns.bucket_columns``, which is ``_summarize``'s
        ``column_summary``); returns how many records they held (0: not taken here, the caller's
        loop does it)."""
        k = (len(steps) - i) // BUCKET
        got = columns.bucket_columns(names, i, k, BUCKET)
        if got is None:  # (a non-finite value, a name not taken: the whole buckets before it, if any)
            k = columns.finite_buckets(names, i, k, BUCKET)
            got = columns.bucket_columns(names, i, k, BUCKET) if k else None
            if got is None:
                return 0
        stop = i + k * BUCKET
        if columns.increasing():
            lo, hi = steps[i:stop:BUCKET], steps[i + BUCKET - 1:stop:BUCKET]
        else:
            ends = [sorted(steps[a:a + BUCKET]) for a in range(i, stop, BUCKET)]
            lo, hi = [e[0] for e in ends], [e[-1] for e in ends]
        base = [array("q", lo).tobytes(), array("q", hi).tobytes(), array("I", [BUCKET]).tobytes() * k,
                array("q", offsets[i:stop:BUCKET]).tobytes()]
        fields = {name: cols for name, cols in zip(names, got) if cols is not None}
        self.pyramid.push_block(Block(base, fields))
        return k * BUCKET

    def close_bucket(self) -> None:
        """Summarize the open bucket into the pyramid (early at a segment's start, so that no base
        bucket holds two segments)."""
        if not self._ob_recs:
            return
        self.pyramid.push(self._summarize(self._ob_recs, self._ob_steps, self._ob_offset, self._ob_marked))
        self._ob_recs = []
        self._ob_steps = []
        self._ob_marked = set()
        self._ob_cache = None
        self._init_columns()

    def open_summary(self) -> Summary | None:
        """The open bucket's summary (computed on demand, cached until the bucket changes)."""
        if not self._ob_recs:
            return None
        n = len(self._ob_recs)
        if self._ob_cache is None or self._ob_cache[0] != n:
            self._ob_cache = (n, self._summarize(self._ob_recs, self._ob_steps, self._ob_offset, None))
        return self._ob_cache[1]

    def _discover(self, rec: dict, pos: int, added: dict[str, int]) -> None:
        """Register the numeric fields of a step record (at position ``pos`` of its batch; the
        fields it adds go into ``added``) that has keys not seen before, or a number where a key
        had only other values so far (a key first seen with a bool stays a flag)."""
        for name, raw in rec.items():
            if name in self._known:
                if name in self._text_names and number(raw) is not None:
                    self._text_names.discard(name)
                    self._add_field(name, pos, added)
                continue
            if number(raw) is None:
                if not isinstance(raw, bool):  # flags stay flags; other values are re-checked
                    self._text_names.add(name)
                self._known.add(name)
                continue
            self._known.add(name)
            self._text_names.discard(name)
            self._add_field(name, pos, added)

    def _add_field(self, name: str, pos: int, added: dict[str, int]) -> None:
        if name == TS:
            self._has_ts = True
        elif name not in self._field_set and len(self.fields) < MAX_FIELDS:
            self._field_set.add(name)
            self.fields.append(name)
            added[name] = pos

    def _mark(self, step: int, kind: str, name: str, value: Any, reason: str | None = None) -> None:
        if len(self.marks) >= MAX_MARKS:
            self.marks_dropped += 1
            return
        self.marks.append((step, kind, name, value, reason))
        self.mark_segments.append(self._segment)

    def _step_marks(self, rec: dict, step: int, later: list[str] | None = None) -> None:
        """The marks of one step record: its non-finite field values, then its flags. A loss-scale
        overflow (``skip_reason: "overflow"``) is a skip: its non-finite norms are no ``nonfinite``
        marks (a non-finite loss still is). ``later``: fields that later records of its batch
        added (not fields yet at this record)."""
        nonfinite_marked = False
        reason = rec.get("skip_reason")
        overflow = reason == OVERFLOW_REASON
        for name, raw in rec.items():
            if name in self._field_set and not (overflow and name != "loss") \
                    and not (later and name in later):
                v = number(raw)
                if v is not None and not math.isfinite(v):
                    self._mark(step, "nonfinite", name, v)
                    nonfinite_marked = True
        for flag, kind in MARK_FLAGS:
            if rec.get(flag) is True and not (kind == "nonfinite" and nonfinite_marked):
                name = "grad_norm" if "grad_norm" in rec else "loss"
                self._mark(step, kind, name, number(rec.get(name)),
                           reason if kind == "skip" and isinstance(reason, str) else None)

    def _summarize(self, recs: list[dict], steps: list[int], offset: int,
                   marked: set[int] | None) -> Summary:
        """The summary of consecutive step records, column by column (``marked``: positions whose
        marks are taken; the others get theirs here if a value turns out non-finite)."""
        out = Summary(offset)
        out.n = len(steps)
        ordered = sorted(steps)  # (one C call: a run of increasing ints is sorted in one pass)
        out.lo = ordered[0]
        out.hi = ordered[-1]
        cols, floats = (self._ob_cols, self._ob_floats) if recs is self._ob_recs else ({}, {})
        for name in self.series_names():
            if name in floats:
                got = summarize_floats(floats[name], steps)
                if got is not None:  # (else a non-finite value: summarized, and marked, below)
                    if got[0] is not None:
                        out.fields[name] = got[0]
                    continue
            values = cols.get(name)
            checked = values is not None and name not in self._ob_unchecked  # plain ints/floats only
            if values is None:
                values = list(map(dict.get, recs, repeat(name)))
            f, nonfinite = column_summary(values, steps, checked)
            if f is not None:
                out.fields[name] = f
            if nonfinite and marked is not None and name != TS:
                # Non-finite values where no mark was expected (a literal like 1e999): mark them.
                for i, r in enumerate(recs):
                    v = number(r.get(name))
                    if i not in marked and v is not None and not math.isfinite(v):
                        self._mark(steps[i], "nonfinite", name, v)
        return out
