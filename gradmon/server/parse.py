"""Decode a batch of run-log lines fast, with the results of ``jsonl.decode_record``.

Indexing a 10M-line run is dominated by per-line Python overhead, so a batch is decoded at once.
Each line that is a plain ``step`` record takes a fast path: read by the compiled line scanner
(``native.py``: the flat lines of printable ASCII, their records and each key's column, types and
float64 row taken in one pass; it reads the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` as
``decode_record`` does, as floats, and those records are checked for marks), else parsed by orjson
when installed, else scanned in place by the stdlib's C JSON scanner over the batch decoded in one
call (no per-line ``str``); then the batch is validated a column at a time with the rules of
``validate_record``. Any other line — non-step records, the strings ``"NaN"``/``"Infinity"``/
``"-Infinity"`` where no scanner read them (``decode_record`` turns them into floats), bare ``NaN``
tokens and records without ``type`` (other writers'), escapes, surrounding
blanks, bad UTF-8, anything malformed or invalid — is decoded by ``decode_record`` itself, so the
paths cannot disagree on what a valid record is. The raw line of each record is kept to be sent as
it is, strict JSON already; a normalized record (bare token, no ``type``) is re-encoded instead.
Pure: no I/O.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, count, islice, repeat
from operator import is_, is_not, itemgetter, lt, ne
from typing import Any

# The field-type rules of ``validate_record``, checked here a column at a time.
from gradmon.logformat.jsonl import STRICT_DECODER, RecordError, decode_record, encode_record, validate_record
from gradmon.logformat.schema import INT_FIELDS, INT_MAX, INT_MIN, MARK_FLAGS, NUMBER_FIELDS
from gradmon.logformat.values import FAST_TYPES
from gradmon.server.native import scanner as _native_scanner
from gradmon.server.steprecords import LineRecords, StepRecords, records_at, scanned_column

__all__ = ["KeyColumns", "ParsedLines", "parse_lines"]

# A strict scanner (RFC 8259): a line with a bare NaN/Infinity token fails here and takes the slow
# path (``decode_record`` reads it, and the record is re-encoded); no control characters in
# strings, so a value can never run past its line's end.
_SCAN = STRICT_DECODER.scan_once
# ``b"true" in blob`` by the regex engine: ~1.5x faster on a batch of lines (whose common letters
# slow the substring search down).
_has_true = re.compile(rb"true").search

try:  # optional: a faster C JSON parser (see benchmarks/README.md)
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_loads = None

# Keys that ``validate_record`` checks, with the value types it accepts (JSON values are exact
# types: ``int`` here never means ``bool``).
_TYPE_OK = {
    **{key: frozenset({int, type(None)}) for key in INT_FIELDS},
    **{key: frozenset({int, float, type(None)}) for key in NUMBER_FIELDS},
}
_TYPE_OK["step"] = frozenset({int})  # the fast path only takes step records, which need a step
# The same rules for records of the other kinds, whose ``step`` may be absent.
_OTHER_TYPE_OK = {**_TYPE_OK, "step": frozenset({int, type(None)})}
_NONE = type(None)
# The compiled scanner's type bits (csrc/scanlines.c) -> the set of types they stand for.
_TYPE_BITS = ((1, int), (2, float), (4, str), (8, bool), (16, _NONE))
_BOOL_BIT = 8
_INT = frozenset({int})
_NONFINITE_BIT = 32  # (the compiled scanner's: some float of the column is not finite)
_MASK_TYPES = [frozenset(t for bit, t in _TYPE_BITS if mask & bit) for mask in range(64)]
_MARK_FLAG_KEYS = tuple(flag for flag, _kind in MARK_FLAGS)


class KeyColumns:
    """The values of each key over a list of records (``None`` where a record has none), each
    taken once, when first asked for, and shared by whoever reads the batch next: the validation
    here, the pyramid's summaries (``steps.py``), the sidecar's rows (``columns.step_rows``) and the
    alarm rule. A column is a list nobody may change."""

    __slots__ = ("_floats", "_increasing", "_keys", "_no_bools", "_part_of", "_scanned", "_types", "_values",
                 "records")

    def __init__(self, records: Sequence[dict]) -> None:
        self.records = records
        self._values: dict[str, list[Any]] = {}
        self._types: dict[str, set[type]] = {}
        self._keys: set[str] | None = None
        self._no_bools = False  # proven: no record holds a bool (set with the keys, see _same_keys)
        self._increasing: bool | None = None
        self._part_of: tuple[KeyColumns, int, int] | None = None  # (whole, start, stop): sliced()
        self._floats: dict[str, bytes] | None = None  # prefill()
        self._scanned: dict[str, list[Any] | None] | None = None  # prefill(): the scanner's columns

    def sliced(self, start: int, stop: int) -> KeyColumns:
        """The columns of ``records[start:stop]``, each a slice of this one's (a mixed batch's
        runs of step records, read by the pyramid and the alarm rule, share the columns of its
        step records, taken once: a slice is a copy of pointers, a column ~20x faster to take)."""
        part = KeyColumns(self.records[start:stop])
        part._part_of = (self, start, stop)
        return part

    def prefill(self, columns: dict[str, list[Any] | None], types: dict[str, int],
                floats: dict[str, bytes]) -> None:
        """Take the columns and types of every key of the records as the compiled scanner found
        them (``native.py``: ``types`` as bit masks), and their float64 columns (:meth:`floats`).
        A column the scanner left to be made when read (``None``: every value a float) is made
        by :meth:`values` into ``columns``, which the records share (``steprecords.scanned_column``)."""
        self._floats = floats
        self._scanned = columns
        self._values.update((key, column) for key, column in columns.items() if column is not None)
        self._types.update((key, _MASK_TYPES[mask]) for key, mask in types.items())
        self._keys = set(columns)
        self._no_bools = not any(mask & _BOOL_BIT for mask in types.values())

    def floats(self, key: str) -> bytes | memoryview | None:
        """The key's column as native float64s, ``columns.MISSING_BITS`` where a record has no
        number there (``values.number``: a bool, text, null or no value), when the compiled scanner
        took it (else ``None``)."""
        if self._part_of is not None:
            whole, start, stop = self._part_of
            got = whole.floats(key)
            return None if got is None else memoryview(got)[start * 8:stop * 8]
        return self._floats.get(key) if self._floats is not None else None

    def float_piece(self, key: str, start: int, stop: int) -> bytes | memoryview | None:
        """:meth:`floats` of records ``[start, stop)``; rows of ``MISSING_BITS`` for a key that
        none of the records has, in a batch the compiled scanner took; ``None`` when it took none."""
        got = self.floats(key)
        if got is not None:
            return memoryview(got)[start * 8:stop * 8]
        whole = self._part_of[0] if self._part_of is not None else self
        if whole._floats is None or key in self.key_set():
            return None
        return _missing_row() * (stop - start)

    def bucket_columns(self, names: list[str], start: int, buckets: int,
                       size: int) -> list[list[bytes] | None] | None:
        """The summaries of ``buckets`` consecutive buckets of ``size`` records from ``start``,
        column-wise as ``pyramid.Level`` keeps them: per name of ``names``, ``None`` (no number
        there) or nine columns of a row per bucket (``pyramid.Block``), by the compiled scanner from
        :meth:`floats`, in one call; a bucket's row is ``column_summary``'s of its records. ``None``
        when it did not take some name that the records have, or some value is not finite (then the
        caller summarizes, and marks, in Python)."""
        if not names:  # (no field yet: nothing to summarize)
            return []
        keys = self.key_set()
        floats = [self.floats(name) if name in keys else None for name in names]
        native = _native_scanner()
        if native is None or any(f is None and name in keys for f, name in zip(floats, names)):
            return None
        return native.bucket_columns(names, floats, self.values("step"), start, buckets, size)

    def finite_buckets(self, names: list[str], start: int, buckets: int, size: int) -> int:
        """How many of ``buckets`` consecutive buckets of ``size`` records from ``start`` lie before
        the first record with a non-finite number in one of ``names``' float64 columns (those the
        compiled scanner took; 0 without it): the ones :meth:`bucket_columns` can summarize."""
        native = _native_scanner()
        columns = [self.floats(name) for name in names]
        if native is None or all(c is None for c in columns):
            return 0
        row = native.first_nonfinite(columns, start, start + buckets * size)
        return buckets if row < 0 else (row - start) // size

    def key_set(self) -> set[str]:
        """Every key of the records (a set nobody may change)."""
        if self._keys is None:
            keys = self._part_keys() if self._part_of is not None else None
            if keys is None:
                keys = self._same_keys()
            self._keys = keys if keys is not None else set().union(*self.records)
        return self._keys

    def _part_keys(self) -> set[str] | None:
        """A part's keys read off its whole's, when the whole knows its own (``None``: not
        known): a key none of whose values is ``None`` in the whole is in every record; another
        is in the part when one of its values there is not ``None``, or one of its records has it."""
        whole, start, stop = self._part_of  # type: ignore[misc]
        if whole._keys is None or not self.records:
            return None
        keys = set()
        for key in whole._keys:
            if _NONE not in whole.types(key):
                keys.add(key)
                continue
            piece = whole.values(key)[start:stop]
            if piece.count(None) < len(piece) or _has_key(self.records, key):
                keys.add(key)
        self._no_bools = whole._no_bools  # (no bool in the whole: none in a part of it)
        return keys

    def _same_keys(self) -> set[str] | None:
        """The first record's keys when every record has exactly those (the writer's common batch),
        else ``None``: every record has as many keys, and each of the first's keys is in every
        record (its column holds no ``None``: a ``None`` there is a key absent or a ``null``, not
        told apart). Costs one ``len`` per record besides the columns' types, which the readers of
        a batch take anyway; notes on the way whether some value is a bool."""
        recs = self.records
        if not recs:
            return None
        first = recs[0]
        n = len(first)
        if list(map(len, recs)).count(n) != len(recs):
            return None
        bools = False
        for key in first:
            types = self.types(key)
            if _NONE in types:
                return None
            bools = bools or bool in types
        self._no_bools = not bools
        return set(first)

    def no_bools(self) -> bool:
        """Whether no record is proven to hold a ``true`` or ``false`` (``False``: not known)."""
        self.key_set()
        return self._no_bools

    def increasing(self) -> bool:
        """Whether the records' ``step`` values increase strictly (each record has an int ``step``)."""
        if self._increasing is None:
            floats = self.floats("step")
            native = _native_scanner() if floats is not None and self.types("step") == _INT else None
            if native is not None:  # (the scanner's step column: ints up to 2^53, each exact)
                self._increasing = native.increasing(floats)
            else:
                steps = self.values("step")
                self._increasing = all(map(lt, steps, islice(steps, 1, None)))
        return self._increasing

    def values(self, key: str) -> list[Any]:
        got = self._values.get(key)
        if got is None:
            if self._part_of is not None:
                whole, start, stop = self._part_of
                got = self._values[key] = whole.values(key)[start:stop]
            elif self._scanned is not None and key in self._scanned:
                got = self._values[key] = scanned_column(self._scanned, self._floats, key)  # type: ignore[arg-type]
            else:
                got = self._values[key] = list(map(dict.get, self.records, repeat(key)))
        return got

    def piece(self, key: str, start: int, stop: int) -> list[Any]:
        """``values(key)[start:stop]`` (the column itself when that is all of it; a part's piece is
        sliced from the whole's column, without taking the part's own)."""
        if self._part_of is not None and key not in self._values:
            whole, at, _end = self._part_of
            n = len(self.records)
            return whole.values(key)[at + min(start, n):at + min(stop, n)]
        got = self.values(key)
        return got if start == 0 and stop == len(got) else got[start:stop]

    def types(self, key: str) -> set[type]:
        """The types of the key's values (``NoneType`` when some record has none)."""
        got = self._types.get(key)
        if got is None:
            whole = self._part_of[0] if self._part_of is not None and self.records else None
            if whole is not None and len(types := whole.types(key)) == 1:
                got = self._types[key] = types  # (one type in the whole: the same in any part of it)
            else:
                got = self._types[key] = set(map(type, self.values(key)))
        return got

    def known_plain(self, key: str) -> bool:
        """Whether every record is known to have a plain ``int`` or ``float`` there: :meth:`fast`
        for a whole; a part answers from its whole, without taking its own types (``False``: not
        known, a reader checks the values itself)."""
        if self._part_of is not None and key not in self._types:
            return not self.records or self._part_of[0].fast(key)
        return self.fast(key)

    def fast(self, key: str) -> bool:
        """Whether every record has a plain ``int`` or ``float`` there (no None, bool or text)."""
        part_of = self._part_of
        if part_of is not None and key not in self._types and self.records and part_of[0].fast(key):
            return True  # (plain in the whole: plain in any part of it)
        return self.types(key) <= FAST_TYPES


def _has_key(records: Sequence[dict], key: str) -> bool:
    """Whether one of ``records`` has ``key`` (the scanner's records say so without being made)."""
    if isinstance(records, StepRecords):
        return records.has_key(key)
    return any(map(dict.__contains__, records, repeat(key)))


@dataclass
class ParsedLines:
    """The valid records of a batch of lines, in file order."""

    # (a list, or the compiled scanner's steprecords.LineRecords / StepRecords, which read as one)
    records: Sequence[Any] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # byte offset where each record's line starts
    raw: list[bytes] = field(default_factory=list)  # each record's line, without surrounding blanks
    # Indices (ascending) of records that may carry marks: decoded in full (they had non-finite
    # strings or odd spacing) or with a mark flag set (``MARK_FLAGS``; read by the stdlib scanner:
    # whose line holds a ``true``). No other record can have a mark flag set or a non-finite
    # value, except (the stdlib scanner's) a number literal too large for a float (``1e999``).
    check: list[int] = field(default_factory=list)
    malformed: int = 0
    end: int = 0  # byte offset after the last line
    columns: KeyColumns | None = None  # of ``records`` (set by parse_lines)
    # Of the step records among ``records`` (in order), when taken already: a mixed batch's (one
    # with other records too) that the fast path validated (``None``: not taken).
    step_columns: KeyColumns | None = None


def summarize_floats(floats: bytes | bytearray, steps: list[int]) -> list[list | None] | None:
    """``[pyramid.column_summary]`` of one bucket's float64 column (``KeyColumns.float_piece``s;
    ``steps``: its records' steps), by the compiled scanner; ``None`` when a value is not finite."""
    return _native_scanner().bucket_summaries(floats, steps, 0, 1, len(steps))  # type: ignore[union-attr]


def _missing_row() -> bytes:
    """One float64 ``MISSING_BITS`` (``columns.MISSING``), as the scanner writes it."""
    return struct.pack("<Q", _native_scanner().MISSING_BITS)  # type: ignore[union-attr]


def parse_lines(lines: Sequence[tuple[int, bytes | None]], start: int, *,
                use_orjson: bool = True, use_native: bool = True) -> ParsedLines:
    """Decode ``lines`` (``(end_offset, line)`` pairs as ``tail.LineSplitter.feed`` returns them;
    ``None``: an oversize line) whose first line starts at byte ``start``. ``use_orjson=False``
    forces the standard-library scanner, ``use_native=False`` orjson without the compiled scanner
    (``native.py``; the result is the same)."""
    out = ParsedLines(end=start)
    if not lines:
        return out
    out.end = lines[-1][0]
    texts = list(map(itemgetter(1), lines))
    by_orjson = _orjson_loads is not None and use_orjson
    scan = _native_scanner() if by_orjson and use_native else None
    blob = None
    nonfinite: list[int] = []  # the lines of the compiled scanner's step records with a non-finite value
    if scan is not None:  # (the scanner leaves every line it cannot read as orjson does undecided)
        decoded, typeless, kinds, slow, fast, scanned, nonfinite = _candidates_native(scan, texts)
        fast = KeyColumns(fast)
        if scanned is not None:
            fast.prefill(*scanned)
        elif kinds is not None:
            fast._values["type"] = kinds
    else:
        blob = b"\n".join(texts if None not in texts else [b"" if ln is None else ln for ln in texts])
        if by_orjson:
            # orjson allows blanks around a value (a line whose raw form must be stripped first):
            # look for them line by line only when the batch has any.
            blanks = b" " in blob or b"\t" in blob or b"\r" in blob  # (compact JSON has no blanks)
            decoded, typeless, kinds = _candidates_orjson(lines, texts, blanks)
        else:
            decoded, typeless = _candidates_stdlib(lines, blob)
            kinds = None
        # Lines that may hold the strings "NaN"/"Infinity"/"-Infinity" (an escape can spell them
        # too) go to decode_record, which turns them into floats. (a rare byte first: one memchr
        # rules out the common batch before a substring search, ~25 us each)
        if (b"N" in blob and b'NaN"' in blob) or (b"I" in blob and b'Infinity"' in blob) or b"\\" in blob:
            for i, (_end, line) in enumerate(lines):
                if decoded[i] is not None and _to_decode_record(line):  # type: ignore[arg-type]
                    decoded[i] = None
                    kinds = None
        # (kinds: every line a candidate, none dropped: no None to look for, which compares each record)
        slow = [i for i, r in enumerate(decoded) if r is None] \
            if kinds is None and decoded.count(None) else []
        fast = KeyColumns([r for r in decoded if r is not None] if slow else decoded)
        if kinds is not None:  # (the candidates' "type" column, taken already)
            fast._values["type"] = kinds
    valid = _all_valid(fast)
    # The fast path's records that may carry marks (those decode_record reads are checked anyway).
    # orjson's hold finite numbers only (it refuses 1e999 and NaN): only a mark flag set can give
    # them a mark, found in the flags' columns (none when no record holds a bool: their types say
    # so, taken anyway); the compiled scanner's also the non-finite floats it read from "NaN"
    # strings as decode_record does (``nonfinite``). The stdlib scanner reads 1e999 as inf: its
    # lines with a "true" (a flag or not, a text search) are all checked.
    if by_orjson:
        flagged = set() if fast.no_bools() else _mark_flagged(fast, slow)
        flagged.update(nonfinite)
    else:
        flagged = {i for i, (_e, ln) in enumerate(lines) if ln is not None and b"true" in ln} \
            if _has_true(blob) else set()
    if valid:
        slow_steps = _assemble(lines, texts, start, decoded, slow, flagged, typeless, out, scan)
        # (the common batch: the records are the ones validated, whose columns are taken already)
        if out.records is fast.records:
            out.columns = fast
        else:
            out.columns = KeyColumns(out.records)
            if not slow_steps:  # the fast path's records are the batch's step records
                out.step_columns = fast
                _other_kinds(out, len(out.records) - len(fast.records))
        return out
    records, offsets, raw, check = out.records, out.offsets, out.raw, out.check
    decoded = list(decoded)  # (the compiled scanner's records: made at once, not one by one)
    offset = start
    for i, (end, line) in enumerate(lines):
        rec = decoded[i]
        if rec is not None:  # some fast-path record is invalid: check each one
            try:
                validate_record(rec)
            except RecordError:
                rec = None
            else:
                if i in flagged:
                    check.append(len(records))
                raw.append(_typed(line) if i in typeless else line)  # type: ignore[arg-type]
        if rec is None:
            slow = _decode_slow(line)
            if slow is None:
                out.malformed += 1
                offset = end
                continue
            rec = slow[0]
            check.append(len(records))
            raw.append(slow[1])
        records.append(rec)
        offsets.append(offset)
        offset = end
    out.columns = KeyColumns(records)
    return out


def _assemble(lines: Sequence[tuple[int, bytes | None]], texts: list[bytes | None], start: int,
              decoded: list[Any], slow: list[int], flagged: set[int], typeless: set[int],
              out: ParsedLines, scan: Any = None) -> bool:
    """The result when every fast-path record is valid, into ``out``: ``decode_record`` decides
    the lines at positions ``slow`` only (the common batch has none; ``scan``: the compiled
    scanner, which reads those of them it decides, records of other kinds, for ``decode_record``
    to validate only). ``texts``: the lines' bytes. Returns whether some of the records it decoded
    are step records."""
    raw: list[Any] = list(texts) if typeless or slow else texts
    for i in typeless:
        if decoded[i] is not None:
            raw[i] = _typed(raw[i])
    offsets = list(map(itemgetter(0), lines))  # each line starts where the one before ended
    offsets.pop()
    offsets.insert(0, start)
    check = set(flagged)
    bad: list[int] = []
    slow_steps = False
    scanned = scan.scan_records([raw[i] for i in slow]) if scan is not None and slow else None
    valid = scanned is not None and _others_valid([r for r in scanned if r is not None])
    if valid and None not in scanned:  # (every one read by the scanner and valid: no loop per record)
        check.update(slow)
        if isinstance(decoded, LineRecords):
            decoded.put(slow, scanned)
        else:
            any(map(decoded.__setitem__, slow, scanned))  # (the loops in C: map, any)
        any(map(raw.__setitem__, slow, map(bytes.strip, map(raw.__getitem__, slow))))
        slow_steps = "step" in map(itemgetter("type"), scanned)
    else:
        for k, i in enumerate(slow):
            rec = scanned[k] if scanned is not None else None
            if rec is None:
                got = _decode_slow(raw[i])
            else:  # (read by the scanner: validated above, all at once, else here)
                got = (rec, raw[i].strip()) if valid else _validated(rec, raw[i])
            if got is None:
                bad.append(i)
                continue
            decoded[i], raw[i] = got
            slow_steps = slow_steps or got[0].get("type") == "step"
            check.add(i)
    if bad:
        out.malformed = len(bad)
        drop = set(bad)
        keep = [i for i in range(len(lines)) if i not in drop]
        made = list(decoded)  # (the compiled scanner's records: made at once, not one by one)
        decoded = [made[i] for i in keep]
        raw = [raw[i] for i in keep]
        offsets = [offsets[i] for i in keep]
        check = {k for k, i in enumerate(keep) if i in check}
    out.records, out.raw, out.offsets, out.check = decoded, raw, offsets, sorted(check)
    return slow_steps


def _other_kinds(out: ParsedLines, others: int) -> None:
    """Give ``out.columns`` its ``type`` column when the batch's records are step records except
    ``others`` of them, which ``decode_record`` decoded (so each is in ``out.check``): without a
    look at every record."""
    kinds = ["step"] * len(out.records)
    checked = list(map(dict.get, records_at(out.records, out.check), repeat("type")))
    not_step = list(map(ne, checked, repeat("step")))
    found = list(compress(out.check, not_step))
    any(map(kinds.__setitem__, found, compress(checked, not_step)))  # (the loop in C)
    if len(found) == others:  # (else leave the column to be taken: a guard, never expected)
        out.columns._values["type"] = kinds  # type: ignore[union-attr]


def _mark_flagged(columns: KeyColumns, holes: list[int]) -> set[int]:
    """The positions of the records (of ``columns``) with a mark flag set (``true``), as positions
    in the batch, whose lines at ``holes`` (ascending) hold none of these records."""
    keys = columns.key_set()
    found: set[int] = set()
    for flag in _MARK_FLAG_KEYS:
        if flag in keys and bool in columns.types(flag):
            found.update(compress(count(), map(is_, columns.values(flag), repeat(True))))
    if not found or not holes:
        return found
    return set(_lines_of(sorted(found), holes))


def _to_decode_record(line: bytes) -> bool:
    """Whether a line may hold the strings ``decode_record`` turns into floats, or escapes
    (which can spell them): such lines are decoded by it, never on the fast path."""
    return b'NaN"' in line or b'Infinity"' in line or b"\\" in line


def _typed(line: bytes) -> bytes:
    """A fast-path line of a step record without ``type`` (``{...}``, no blanks around, not
    empty), given ``"type": "step"`` first: strict JSON as it is sent on."""
    return b'{"type":"step",' + line[1:]


def _step_record(obj: Any, i: int, typeless: set[int]) -> dict | None:
    """``obj`` when it is a step record; another writer's step record (no ``type``, an integer
    ``step``) given ``"type": "step"`` (its index noted in ``typeless``); else ``None``."""
    if type(obj) is not dict:
        return None
    kind = obj.get("type")
    if kind == "step":
        return obj
    if kind is None and "type" not in obj and type(obj.get("step")) is int:
        typeless.add(i)
        return {"type": "step", **obj}
    return None


def _validated(rec: dict, line: bytes) -> tuple[dict, bytes] | None:
    """``_decode_slow`` of a line the compiled scanner decided (``rec``: what ``decode_record``
    reads there, never normalized: a flat record with a ``type``, no NaN or Infinity in it)."""
    try:
        return validate_record(rec), line.strip()
    except RecordError:
        return None


def _decode_slow(line: bytes | None) -> tuple[dict, bytes] | None:
    """``decode_record`` of a line off the fast path: the record and the line to pass on (the line
    itself, stripped, or the record re-encoded when it was normalized); ``None`` when invalid."""
    if line is None:
        return None
    try:
        rec, normalized = decode_record(line)
    except (RecordError, RecursionError):
        return None
    return rec, (encode_record(rec).rstrip("\n").encode("utf-8") if normalized else line.strip())


def _candidates_stdlib(lines: Sequence[tuple[int, bytes | None]], blob: bytes) -> tuple[list[Any], set[int]]:
    """Per line: the ``step`` record it holds (:func:`_step_record`) when the stdlib scanner reads
    it as one JSON object filling the whole line, else ``None`` (``decode_record`` decides); and
    the positions of the records that had no ``type``."""
    typeless: set[int] = set()
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if len(text) != len(blob):  # not ASCII (or not UTF-8): character and byte offsets differ
        return [None] * len(lines), typeless
    scan = _SCAN
    decoded: list[Any] = []
    append = decoded.append
    pos = 0  # of the current line in ``text`` (the lines are joined by one "\n")
    for i, (_end, line) in enumerate(lines):
        if line is None:
            append(None)
            pos += 1
            continue
        stop = pos + len(line)
        try:
            obj, e = scan(text, pos)
        except (StopIteration, ValueError, RecursionError):
            e = -1
        append(_step_record(obj, i, typeless) if e == stop else None)
        pos = stop + 1
    return decoded, typeless


def _candidates_orjson(lines: Sequence[tuple[int, bytes | None]], texts: list[bytes | None],
                       blanks: bool) -> tuple[list[Any], set[int], list[Any] | None]:
    """As :func:`_candidates_stdlib`, parsed by orjson, and the candidates' ``type`` values when
    every line is one (else ``None``). Where orjson and the stdlib differ, the line is not a
    candidate or the difference cannot matter: orjson refuses lone surrogates and
    ``1e999`` (left to ``decode_record``), and reads integers beyond 64 bits as floats, which
    ``validate_record`` refuses in integer fields (then ``decode_record`` decides) and which the
    index turns into floats anyway: the one difference in the result, a step record's huge
    integer value given as a float. Non-step records are left to ``decode_record``."""
    loads = _orjson_loads
    typeless: set[int] = set()
    try:  # the common batch, without a Python loop per line: every line parses
        objs = list(map(loads, texts))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        pass
    else:
        if set(map(type, objs)) == {dict}:
            kinds = list(map(dict.get, objs, repeat("type")))
            not_candidates = []
            if kinds.count("step") != len(objs):  # other records are decode_record's
                for i, k in enumerate(kinds):
                    if k != "step" and (rec := _step_record(objs[i], i, typeless)) is not None:
                        objs[i] = rec  # another writer's step record
                    elif k != "step":
                        not_candidates.append(i)
            if blanks:  # (bytes.strip returns the very same object when there is nothing to strip)
                padded = list(map(is_not, texts, map(bytes.strip, texts)))  # type: ignore[arg-type]
                if True in padded:
                    not_candidates += [i for i, p in enumerate(padded) if p]
            for i in not_candidates:
                objs[i] = None
            return objs, typeless, kinds if not not_candidates and not typeless else None
    decoded: list[Any] = []
    append = decoded.append
    for i, (_end, line) in enumerate(lines):
        try:
            obj = loads(line)  # type: ignore[misc]
        except (ValueError, TypeError):
            append(None)
            continue
        ok = not blanks or (line[:1] == b"{" and line[-1:] == b"}")  # type: ignore[index]
        append(_step_record(obj, i, typeless) if ok else None)
    return decoded, typeless, None


def _candidates_native(scan: Any, texts: list[bytes | None]) -> tuple[
        Sequence[Any], set[int], list[Any] | None, list[int], Sequence[dict], tuple[dict, dict, dict] | None,
        list[int]]:
    """As :func:`_candidates_orjson`, by the compiled scanner (``native.py``), and besides: the
    positions of the lines without a candidate (ascending), the candidates (the lines' records
    without the ``None``), the candidates' columns, types and float64 columns that the scanner
    took on the way (``None``: a line it left undecided is a candidate too), and the positions of
    the lines whose step record holds a non-finite float (a ``"NaN"`` string, read as
    ``decode_record`` reads it). The lines it leaves undecided (nested values, escapes, non-ASCII,
    no ``type``...) are parsed here by orjson, as there."""
    shapes, undecided, columns, types, floats, rows, holes = scan.scan_steps(texts)
    nonfinite = _lines_of(_nonfinite_rows(scan, types, floats, rows), holes)
    steps: Any = StepRecords.scanned(columns, floats, shapes, rows, scan.build_records)
    decoded: Any = LineRecords(steps, holes, len(texts)) if holes else steps
    typeless: set[int] = set()
    scanned: tuple[dict, dict, dict] | None = (columns, types, floats) if rows else None
    loads = _orjson_loads
    more = False
    for i in undecided:
        line = texts[i]
        if line is None or _to_decode_record(line):
            continue
        try:
            obj = loads(line)  # type: ignore[misc]
        except (ValueError, TypeError):
            continue
        # (a dict with blanks around it: its raw form must be stripped first, decode_record's)
        if line[:1] == b"{" and line[-1:] == b"}" and (rec := _step_record(obj, i, typeless)) is not None:
            decoded[i] = rec
            more = True
    if more:  # (some undecided line is a candidate: the scanner's columns are not the candidates')
        scanned = None
        decoded = list(decoded)
        holes = [i for i, r in enumerate(decoded) if r is None]
        steps = [r for r in decoded if r is not None]
    if not holes:
        return (decoded, typeless, ["step"] * len(decoded) if not typeless else None, holes, decoded, scanned,
                nonfinite)
    return decoded, typeless, None, holes, steps, scanned, nonfinite


def _nonfinite_rows(scan: Any, types: dict[str, int], floats: dict[str, bytes], rows: int) -> list[int]:
    """The rows (step records, ascending) where one of the scanner's float64 columns holds a
    non-finite number: only the columns whose types say they have one are looked at (the common
    batch has none)."""
    columns = [floats[key] for key, mask in types.items() if mask & _NONFINITE_BIT]
    found: list[int] = []
    row = scan.first_nonfinite(columns, 0, rows) if columns else -1
    while row >= 0:
        found.append(row)
        row = scan.first_nonfinite(columns, row + 1, rows)
    return found


def _lines_of(rows: list[int], holes: list[int]) -> list[int]:
    """The line positions of step records ``rows`` (ascending), whose lines at ``holes`` (ascending)
    hold none of them: each row plus the holes before its line."""
    out, j, n = [], 0, len(holes)
    for k in rows:
        i = k + j
        while j < n and holes[j] <= i:
            j += 1
            i += 1
        out.append(i)
    return out


def _others_valid(records: list[dict]) -> bool:
    """Whether ``validate_record`` accepts every one of ``records`` (records of kinds other than
    ``step`` that the compiled scanner read), checked a column at a time; ``False`` also when one
    of them is a step record (each is then validated alone). (Their integers are within the
    64-bit range: the scanner takes integers up to 2^53 only.)"""
    columns = KeyColumns(records)
    kinds = columns.values("type")
    if not records or columns.types("type") != {str} or "" in kinds or "step" in kinds:
        return False
    keys = columns.key_set()
    return all(columns.types(key) <= ok for key, ok in _OTHER_TYPE_OK.items() if key in keys)


def _all_valid(columns: KeyColumns) -> bool:
    """Whether ``validate_record`` accepts every one of ``columns.records`` (step records from
    the fast path), checked a column at a time."""
    recs = columns.records
    if not recs:
        return True
    keys = columns.key_set()
    return all(columns.types(key) <= ok  # (no Python loop per record)
               for key, ok in _TYPE_OK.items() if key in keys or key == "step") \
        and all(_int64s(columns, key) for key in INT_FIELDS if key in keys)


def _int64s(columns: KeyColumns, key: str) -> bool:
    """Whether the key's integers (of a column of ints and ``None``, as validated) are within
    ``INT_MIN..INT_MAX``: known without a look when the compiled scanner read them (it takes
    integers up to 2^53 only); else their min and max, in C (of increasing steps, their ends: the
    index asks whether they increase anyway)."""
    if columns.floats(key) is not None:
        return True
    values = columns.values(key)
    if _NONE in columns.types(key):
        values = [v for v in values if v is not None]
    if not values:
        return True
    if key == "step" and columns.increasing():
        return values[0] >= INT_MIN and values[-1] <= INT_MAX
    return min(values) >= INT_MIN and max(values) <= INT_MAX
