"""Strict JSON Lines encoding and decoding of run-log records (see docs/format.md).

Pure functions, no I/O: the writer, the reader, the server and the tests share them.

Python's :func:`json.dumps` writes ``NaN`` and ``Infinity`` as bare tokens, which RFC 8259 does
not allow and which make a browser's ``JSON.parse`` throw. Here non-finite floats become the
strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, and decoding turns them back into floats.

Reading is lenient where other writers differ (docs/format.md, "Reading logs of other writers"):
the bare tokens are read as the floats they mean, and a JSON object without ``type`` but with an
integer ``step`` is a step record. Such a line is *normalized*: whoever passes it on re-encodes
the record (:func:`decode_record` says so) instead of copying the line.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from typing import Any

from gradmon.logformat.schema import INT_FIELDS, INT_MAX, INT_MIN, NUMBER_FIELDS, TEXT_KEYS

__all__ = [
    "NONFINITE_STRINGS",
    "STRICT_DECODER",
    "RecordError",
    "decode_line",
    "decode_record",
    "encode_record",
    "nonfinite_name",
    "to_jsonable",
    "validate_record",
]

NONFINITE_STRINGS: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}



class RecordError(ValueError):
    """A line that is not a valid run-log record."""


def nonfinite_name(x: float) -> str:
    """A non-finite float's name in strict JSON (``NONFINITE_STRINGS``' keys)."""
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


_PLAIN_NUMBERS = frozenset({int, float})


def to_jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data: non-finite floats as strings, numpy scalars and arrays
    as Python numbers and lists, tuples as lists, other objects as their ``str``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else nonfinite_name(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and set(map(type, value)) <= _PLAIN_NUMBERS:
        # The common list (a history series): numbers only; when their sum is finite so is each one.
        with contextlib.suppress(OverflowError):  # (an integer too big for a float)
            if math.isfinite(sum(value)):
                return list(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    # numpy (and MindSpore, via asnumpy) values without importing numpy here.
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return to_jsonable(tolist())
    item = getattr(value, "item", None)
    if callable(item):
        return to_jsonable(item())
    return str(value)


def encode_record(record: Mapping[str, Any]) -> str:
    """Encode one record as a strict JSON line, newline included.

    The result never contains a bare ``NaN``/``Infinity`` token nor a raw newline, so one
    ``write()`` of it is one complete line.
    """
    return json.dumps(to_jsonable(record), ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


def _reject_constant(token: str) -> Any:
    raise RecordError(f"non-standard JSON token {token}")


# RFC 8259 JSON: the bare tokens NaN / Infinity / -Infinity raise RecordError. (Strict about
# control characters in strings too, so a value can never run past its line's end.)
STRICT_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_nonfinite(value: Any) -> Any:
    if isinstance(value, str):
        return NONFINITE_STRINGS.get(value, value)
    if isinstance(value, dict):
        return {k: (v if k in TEXT_KEYS else _decode_nonfinite(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_nonfinite(v) for v in value]
    return value


def _step_without_type(record: Any) -> bool:
    """A record of another writer: an object without ``type`` whose ``step`` is an integer."""
    return isinstance(record, dict) and "type" not in record and type(record.get("step")) is int


def validate_record(record: Any) -> dict[str, Any]:
    """Check the fields every reader relies on; return the record or raise :class:`RecordError`."""
    if not isinstance(record, dict):
        raise RecordError(f"a record is a JSON object, got {type(record).__name__}")
    kind = record.get("type")
    if not isinstance(kind, str) or not kind:
        raise RecordError("record has no string 'type'")
    for key in INT_FIELDS:
        v = record.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise RecordError(f"field {key!r} must be an integer, got {v!r:.40}")
        if v is not None and not INT_MIN <= v <= INT_MAX:
            raise RecordError(f"field {key!r} is outside the signed 64-bit integers, got {v!r:.40}")
    for key in NUMBER_FIELDS:
        v = record.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise RecordError(f"field {key!r} must be a number, got {v!r:.40}")
    if kind == "step" and not isinstance(record.get("step"), int):
        raise RecordError("a step record needs an integer 'step'")
    return record


def decode_record(line: str | bytes) -> tuple[dict[str, Any], bool]:
    """Decode and validate one line (with or without its newline); return the record and whether
    it was *normalized*: the line held a bare ``NaN``/``Infinity``/``-Infinity`` token or had no
    ``type`` (a step record of another writer, given ``"type": "step"`` first), so it is not a
    strict record as it stands and is re-encoded (:func:`encode_record`) wherever it is passed on.

    Raises :class:`RecordError` for anything that is not a valid record: not UTF-8, not JSON, not
    an object, no ``type`` (nor an integer ``step``), or known fields of the wrong type.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"not UTF-8: {exc}") from None
    bare: list[str] = []
    try:
        raw = json.loads(line, parse_constant=lambda token: bare.append(token) or float(token))
    except ValueError as exc:
        raise RecordError(f"not JSON: {exc}") from None
    record = _decode_nonfinite(raw)
    normalized = bool(bare)
    if _step_without_type(record):
        record = {"type": "step", **record}
        normalized = True
    return validate_record(record), normalized


def decode_line(line: str | bytes) -> dict[str, Any]:
    """The record of one line, see :func:`decode_record`."""
    return decode_record(line)[0]
