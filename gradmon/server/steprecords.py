"""A batch's step records as the compiled scanner read them: dicts made only when read.

The scanner (``csrc/scanlines.c``, ``scan_steps``) takes each key's column of a batch's step
records in one pass, and the index reads those columns (the pyramid, the sidecar's rows, the alarm
rule); a record is read one by one only where it may carry a mark, closes a bucket's tail or feeds
the webhook alerts: ~5 % of a cold index's records. Making every record's dict anyway was ~40 %
of the scan. So :class:`StepRecords` is a sequence of those dicts, each made from the columns the
first time it is read (in the key order of its line: the scanner's *shapes*) and kept, so that
reading it again gives the same object; a slice is a view of the same records. :class:`LineRecords`
is a batch's records line by line (``None`` where a line holds no step record, until the caller
puts the record it decoded there), the step records among them being a :class:`StepRecords`'.

Both read as lists (``len``, indexing, slices, iteration, ``==`` with a list) and pickle as lists.

A column whose every value is a float is not made by the scanner either (most of them, the lr,
the timings, the clip coefficient, are never read as objects while a run is indexed):
:func:`scanned_column` makes it from the float64 column the scanner took, the first time it is read.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["LineRecords", "StepRecords", "records_at", "scanned_column"]


def scanned_column(columns: dict[str, list[Any] | None], floats: dict[str, bytes], key: str) -> list[Any]:
    """The key's column of what ``scan_steps`` returned (``columns``, ``floats``): the list, made
    from its float64s the first time it is read where the scanner made none (every value a float:
    the same doubles, bit for bit), and kept in ``columns`` for whoever reads it next."""
    got = columns[key]
    if got is None:
        got = columns[key] = memoryview(floats[key]).cast("d").tolist()
    return got


def records_at(records: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    """``[records[i] for i in positions]``; of a :class:`LineRecords`, the records put at its
    holes (a batch's other kinds: a system record every step or two in a real run's log) are read
    at once, without a look at the step records around them."""
    if not isinstance(records, LineRecords):
        return list(map(records.__getitem__, positions))
    got = list(map(records._put.get, positions))
    if None in got:  # (a step record, or a hole nothing was put at: read one by one)
        got = [records[i] if rec is None else rec for i, rec in zip(positions, got)]
    return got


class _Rows:
    """What the records of one batch share: the columns, the shapes and the dicts made so far."""

    __slots__ = ("build", "columns", "floats", "keys", "made", "rows", "starts", "views")

    def __init__(self, columns: dict[str, list[Any] | None], floats: dict[str, bytes],
                 shapes: list[tuple[int, tuple[str, ...]]], rows: int, build: Any) -> None:
        self.columns = columns  # (None: a column of floats not made yet, see scanned_column)
        self.floats = floats
        self.starts = [first for first, _keys in shapes]
        self.keys = [keys for _first, keys in shapes]
        self.rows = rows
        self.build = build  # the scanner's build_records(keys, columns, start, stop)
        self.made: list[dict | None] | None = None  # per row, once a record is read
        self.views: dict[str, memoryview] = {}

    def one(self, r: int) -> dict:
        made = self.made
        if made is None:
            made = self.made = [None] * self.rows
        rec = made[r]
        if rec is None:
            keys = self.keys[bisect_right(self.starts, r) - 1]
            columns = self.columns
            # (a column of floats not made yet gives this record its value alone: a batch's few
            # records read one by one, a spike's, do not make every column)
            rec = made[r] = dict(zip(keys, [col[r] if (col := columns[k]) is not None else
                                            self.view(k)[r] for k in keys]))
        return rec

    def view(self, key: str) -> memoryview:
        """The key's float64 column as a sequence of floats (made once: a diverged run's batch reads
        thousands of records one by one)."""
        got = self.views.get(key)
        if got is None:
            got = self.views[key] = memoryview(self.floats[key]).cast("d")
        return got

    def column(self, key: str) -> list[Any]:
        return scanned_column(self.columns, self.floats, key)

    def piece(self, key: str, lo: int, hi: int) -> list[Any]:
        """Rows ``[lo, hi)`` of the key's column; of a column of floats not made yet, only those
        rows' values are made (the column stays unmade)."""
        col = self.columns[key]
        return col[lo:hi] if col is not None else self.view(key)[lo:hi].tolist()

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int, tuple[str, ...]]]:
        """``(lo, hi, keys)``: rows ``[start, stop)`` cut where the shape changes."""
        s = bisect_right(self.starts, start) - 1
        lo = start
        while lo < stop:
            hi = min(stop, self.starts[s + 1]) if s + 1 < len(self.starts) else stop
            yield lo, hi, self.keys[s]
            lo = hi
            s += 1

    def fill(self, start: int, stop: int) -> list[dict]:
        """Rows ``[start, stop)``, each made if it was not yet (a run of one shape in one call)."""
        made = self.made
        if made is None:
            made = self.made = [None] * self.rows
        for lo, hi, keys in self.runs(start, stop):
            if None in made[lo:hi]:
                if 2 * (hi - lo) >= self.rows:  # (most of the batch: whole columns, kept for later readers)
                    built = self.build(keys, [self.column(k) for k in keys], lo, hi)
                else:  # (a few records, an open bucket's piece: no column of floats made whole for them)
                    built = self.build(keys, [self.piece(k, lo, hi) for k in keys], 0, hi - lo)
                if made[lo:hi].count(None) == hi - lo:
                    made[lo:hi] = built
                else:  # (some were read already: those stay the objects handed out)
                    for i, rec in enumerate(built, lo):
                        if made[i] is None:
                            made[i] = rec
        return made[start:stop]  # type: ignore[return-value]


class _ListLike(Sequence):
    """A sequence that compares, pickles and prints as the list of its items."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (_ListLike, list)):
            return list(self) == list(other)
        return NotImplemented

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class StepRecords(_ListLike):
    """The step records ``[start, stop)`` of a batch, as dicts made when read (module docstring).
    ``StepRecords.scanned(columns, floats, shapes, rows, build)`` takes what ``scan_steps``
    returned."""

    __slots__ = ("_rows", "_start", "_stop")

    def __init__(self, rows: _Rows, start: int, stop: int) -> None:
        self._rows = rows
        self._start = start
        self._stop = stop

    @classmethod
    def scanned(cls, columns: dict[str, list[Any] | None], floats: dict[str, bytes],
                shapes: list[tuple[int, tuple[str, ...]]], rows: int, build: Any) -> StepRecords:
        return cls(_Rows(columns, floats, shapes, rows, build), 0, rows)

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, stride = i.indices(len(self))
            if stride != 1:
                return list(self)[i]
            return StepRecords(self._rows, self._start + start, self._start + max(start, stop))
        n = self._stop - self._start
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("step record index out of range")
        return self._rows.one(self._start + i)

    def __iter__(self) -> Iterator[dict]:
        return iter(self._rows.fill(self._start, self._stop))

    def __reversed__(self) -> Iterator[dict]:  # (one record made at a time: the last ones are read)
        one = self._rows.one
        return (one(r) for r in range(self._stop - 1, self._start - 1, -1))

    def shape_runs(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """``(start, stop, keys)``: the runs of records with the same keys in the same order (no
        record made)."""
        at = self._start
        return [(lo - at, hi - at, keys) for lo, hi, keys in self._rows.runs(at, self._stop)]

    def has_key(self, key: str) -> bool:
        """Whether one of the records has ``key``, from their shapes (no record made)."""
        return any(key in keys for _lo, _hi, keys in self._rows.runs(self._start, self._stop))


class LineRecords(_ListLike):
    """A batch's records line by line: the step record of a line that holds one (``steps``, in
    order), ``None`` at ``holes`` (the other lines' positions, ascending) until one is put there."""

    __slots__ = ("_holes", "_listed", "_n", "_put", "_steps")

    def __init__(self, steps: StepRecords, holes: list[int], n: int) -> None:
        self._steps = steps
        self._holes = holes
        self._n = n
        self._put: dict[int, Any] = {}
        self._listed: list[Any] | None = None  # (every line, once iterated: a batch's columns each iterate)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, stride = i.indices(self._n)
            return self._lines(start, max(start, stop)) if stride == 1 else list(self)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("record index out of range")
        if i in self._put:
            return self._put[i]
        h = bisect_left(self._holes, i)
        if h < len(self._holes) and self._holes[h] == i:
            return None
        return self._steps[i - h]

    def __setitem__(self, i: int, value: Any) -> None:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("record assignment index out of range")
        self._put[i] = value
        self._listed = None

    def put(self, positions: Sequence[int], values: Sequence[Any]) -> None:
        """``self[i] = value`` for each pair, at once (``positions`` ascending, each in range:
        the records a batch decoded at its holes)."""
        if positions and not 0 <= positions[0] <= positions[-1] < self._n:
            raise IndexError("record assignment index out of range")
        self._put.update(zip(positions, values))
        self._listed = None

    def __iter__(self) -> Iterator[Any]:
        if self._listed is None:
            self._listed = self._lines(0, self._n)
        return iter(self._listed)

    def _lines(self, start: int, stop: int) -> list[Any]:
        """Lines ``[start, stop)`` as a list, in time of their number: only their step records are
        made (a batch's non-finite steps, decoded one by one, are each read as such a slice by the
        alarm rule)."""
        holes = self._holes
        h0, h1 = bisect_left(holes, start), bisect_left(holes, stop)
        steps = list(self._steps[start - h0:stop - h1])
        out: list[Any] = []
        at = start  # the next line
        r = 0  # the next step record
        for h in holes[h0:h1]:
            out.extend(steps[r:r + h - at])
            r += h - at
            out.append(None)
            at = h + 1
        out.extend(steps[r:])
        put = self._put
        if len(put) <= stop - start:
            for i, value in put.items():
                if start <= i < stop:
                    out[i - start] = value
        else:
            for i in range(start, stop):
                if i in put:
                    out[i - start] = put[i]
        return out
