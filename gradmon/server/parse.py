"""Decode a batch of run-log lines fast, with the results of ``jsonl.decode_line``.

Indexing a 10M-line run is dominated by per-line Python overhead, so a batch is decoded at once.
Each line that is a plain ``step`` record takes a fast path: parsed by orjson when installed,
else scanned in place by the stdlib's C JSON scanner over the batch decoded in one call (no
per-line ``str``); then the batch is validated a column at a time with the rules of
``validate_record``. Any other line — non-step records, the strings ``"NaN"``/``"Infinity"``/
``"-Infinity"`` (which ``decode_line`` turns into floats), escapes, surrounding blanks, bad
UTF-8, anything malformed or invalid — is decoded by ``decode_line`` itself, so the paths cannot
disagree on what a valid record is. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_not
from typing import Any

# The field-type rules of ``validate_record``, checked here a column at a time.
from gradmon.jsonl import STRICT_DECODER, RecordError, decode_line, validate_record
from gradmon.schema import INT_FIELDS, NUMBER_FIELDS

__all__ = ["ParsedLines", "parse_lines"]

# The scanner of ``decode_line`` (strict: no control characters in strings, so a value can never
# run past its line's end).
_SCAN = STRICT_DECODER.scan_once

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


@dataclass
class ParsedLines:
    """The valid records of a batch of lines, in file order."""

    records: list[dict] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # byte offset where each record's line starts
    raw: list[bytes] = field(default_factory=list)  # each record's line, without surrounding blanks
    # Indices (ascending) of records that may carry marks: decoded in full (they had non-finite
    # strings or odd spacing) or holding a ``true`` (a flag). No other record can have a flag set
    # or a non-finite value, except a number literal too large for a float (e.g. ``1e999``).
    check: list[int] = field(default_factory=list)
    malformed: int = 0
    end: int = 0  # byte offset after the last line


def parse_lines(lines: Sequence[tuple[int, bytes | None]], start: int, *,
                use_orjson: bool = True) -> ParsedLines:
    """Decode ``lines`` (``(end_offset, line)`` pairs as ``tail.LineSplitter.feed`` returns them;
    ``None``: an oversize line) whose first line starts at byte ``start``. ``use_orjson=False``
    forces the standard-library scanner (the result is the same)."""
    out = ParsedLines(end=start)
    if not lines:
        return out
    out.end = lines[-1][0]
    blob = b"\n".join([b"" if ln is None else ln for _e, ln in lines])
    if _orjson_loads is not None and use_orjson:
        # orjson allows blanks around a value (a line whose raw form must be stripped first):
        # look for them line by line only when the batch has any.
        blanks = b" " in blob or b"\t" in blob or b"\r" in blob  # (compact JSON has no blanks)
        decoded = _candidates_orjson(lines, blanks)
    else:
        decoded = _candidates_stdlib(lines, blob)
    # Lines that may hold the strings "NaN"/"Infinity"/"-Infinity" (an escape can spell them too)
    # go to decode_line, which turns them into floats.
    if b'NaN"' in blob or b'Infinity"' in blob or b"\\" in blob:
        for i, (_end, line) in enumerate(lines):
            if decoded[i] is not None and (b'NaN"' in line or b'Infinity"' in line or b"\\" in line):  # type: ignore[operator]
                decoded[i] = None
    flagged = {i for i, (_e, ln) in enumerate(lines) if ln is not None and b"true" in ln} \
        if b"true" in blob else set()
    slow = [i for i, r in enumerate(decoded) if r is None] if decoded.count(None) else []
    if _all_valid([r for r in decoded if r is not None] if slow else decoded):
        return _assemble(lines, start, decoded, slow, flagged, out)
    records, offsets, raw, check = out.records, out.offsets, out.raw, out.check
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
                raw.append(line)  # type: ignore[arg-type]
        if rec is None:
            try:
                rec = decode_line(line) if line is not None else None
            except (RecordError, RecursionError):
                rec = None
            if rec is None:
                out.malformed += 1
                offset = end
                continue
            check.append(len(records))
            raw.append(line.strip())  # type: ignore[union-attr]
        records.append(rec)
        offsets.append(offset)
        offset = end
    return out


def _assemble(lines: Sequence[tuple[int, bytes | None]], start: int, decoded: list[Any],
              slow: list[int], flagged: set[int], out: ParsedLines) -> ParsedLines:
    """The result when every fast-path record is valid: ``decode_line`` decides the lines at
    positions ``slow`` only (the common batch has none)."""
    raw: list[Any] = [ln for _e, ln in lines]
    offsets = [e for e, _ln in lines]  # each line starts where the one before ended
    offsets.pop()
    offsets.insert(0, start)
    check = set(flagged)
    bad: list[int] = []
    for i in slow:
        line = raw[i]
        try:
            rec = decode_line(line) if line is not None else None
        except (RecordError, RecursionError):
            rec = None
        if rec is None:
            bad.append(i)
            continue
        decoded[i] = rec
        raw[i] = line.strip()
        check.add(i)
    if bad:
        out.malformed = len(bad)
        drop = set(bad)
        keep = [i for i in range(len(lines)) if i not in drop]
        decoded = [decoded[i] for i in keep]
        raw = [raw[i] for i in keep]
        offsets = [offsets[i] for i in keep]
        check = {k for k, i in enumerate(keep) if i in check}
    out.records, out.raw, out.offsets, out.check = decoded, raw, offsets, sorted(check)
    return out


def _candidates_stdlib(lines: Sequence[tuple[int, bytes | None]], blob: bytes) -> list[Any]:
    """Per line: the ``step`` record it holds when the stdlib scanner reads it as one JSON object
    filling the whole line, else ``None`` (``decode_line`` decides)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if len(text) != len(blob):  # not ASCII (or not UTF-8): character and byte offsets differ
        return [None] * len(lines)
    scan = _SCAN
    decoded: list[Any] = []
    append = decoded.append
    pos = 0  # of the current line in ``text`` (the lines are joined by one "\n")
    for _end, line in lines:
        if line is None:
            append(None)
            pos += 1
            continue
        stop = pos + len(line)
        try:
            obj, e = scan(text, pos)
        except (StopIteration, ValueError, RecursionError):
            e = -1
        append(obj if e == stop and type(obj) is dict and obj.get("type") == "step" else None)
        pos = stop + 1
    return decoded


def _candidates_orjson(lines: Sequence[tuple[int, bytes | None]], blanks: bool) -> list[Any]:
    """As :func:`_candidates_stdlib`, parsed by orjson. Where orjson and the stdlib differ, the
    line is not a candidate or the difference cannot matter: orjson refuses lone surrogates and
    ``1e999`` (left to ``decode_line``), and reads integers beyond 64 bits as floats, which
    ``validate_record`` refuses in integer fields (then ``decode_line`` decides) and which the
    index turns into floats anyway: the one difference in the result, a step record's huge
    integer value given as a float. Non-step records are left to ``decode_line`` (kept whole)."""
    loads = _orjson_loads
    texts = [ln for _e, ln in lines]
    try:  # the common batch, without a Python loop per line: every line parses
        objs = list(map(loads, texts))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        pass
    else:
        if set(map(type, objs)) == {dict}:
            kinds = list(map(dict.get, objs, repeat("type")))
            not_candidates = [i for i, k in enumerate(kinds) if k != "step"] \
                if kinds.count("step") != len(objs) else []  # other records are decode_line's
            if blanks:  # (bytes.strip returns the very same object when there is nothing to strip)
                padded = list(map(is_not, texts, map(bytes.strip, texts)))  # type: ignore[arg-type]
                if True in padded:
                    not_candidates += [i for i, p in enumerate(padded) if p]
            for i in not_candidates:
                objs[i] = None
            return objs
    decoded: list[Any] = []
    append = decoded.append
    for _end, line in lines:
        try:
            obj = loads(line)  # type: ignore[misc]
        except (ValueError, TypeError):
            append(None)
            continue
        ok = type(obj) is dict and obj.get("type") == "step"
        if ok and blanks:
            ok = line[:1] == b"{" and line[-1:] == b"}"  # type: ignore[index]
        append(obj if ok else None)
    return decoded


def _all_valid(recs: list[Any]) -> bool:
    """Whether ``validate_record`` accepts every one of ``recs`` (step records from the fast
    path), checked a column at a time."""
    if not recs:
        return True
    keys = set().union(*recs)
    keys.add("step")
    return all(set(map(type, map(dict.get, recs, repeat(key)))) <= ok  # (no Python loop per record)
               for key, ok in _TYPE_OK.items() if key in keys)
