"""Strict JSON text: the WebSocket messages' and the HTTP bodies' (non-finite numbers as strings,
never a bare NaN), and gzip for big bodies. Pure: neither websockets nor asyncio is imported here,
so the history worker (``worker.py``), which encodes each history answer, starts without them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from typing import Any

from gradmon.logformat.jsonl import to_jsonable

try:  # optional: encodes a history answer's series ~10x faster (benchmarks/README.md)
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_dumps = None

__all__ = ["accepts_gzip", "compress", "dumps", "finite_json", "json_body", "strict_json"]

_PLAIN_NUMBERS = frozenset({int, float})
_GZIP_MIN = 32 << 10  # compress JSON bodies above this size when the client accepts gzip


def dumps(obj: Any) -> str:
    """Strict JSON text (non-finite numbers as strings, never bare NaN)."""
    return json.dumps(to_jsonable(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def accepts_gzip(accept_encoding: str | None) -> bool:
    return bool(accept_encoding) and "gzip" in accept_encoding.lower()  # type: ignore[union-attr]


def compress(body: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
    """``body`` gzip-compressed when the client accepts it and it is large enough to gain."""
    if gzip_ok and len(body) >= _GZIP_MIN:
        return gzip.compress(body, compresslevel=5), True
    return body, False


def strict_json(obj: Any) -> str:
    """``dumps(obj)`` (strict JSON, non-finite numbers as strings; keys must be strings), each
    part in one C call where it is plain JSON data already (finite numbers), which is what
    ``to_jsonable`` would leave unchanged: only the parts holding something else (a series with a
    NaN mark's point) go through it. A 10M-step run's full-range answer took ~50 ms in
    ``to_jsonable`` for ~10 ms of encoding."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):  # NaN or infinity, or a value JSON has no type for: split
        pass
    if isinstance(obj, Mapping):
        return "{" + ",".join(f"{strict_json(str(k))}:{strict_json(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        if set(map(type, obj)) <= _PLAIN_NUMBERS:  # (x - x is 0 unless x is NaN or infinite)
            return strict_json([x if x - x == 0 else to_jsonable(x) for x in obj])
        return "[" + ",".join(map(strict_json, obj)) + "]"
    return dumps(obj)


def finite_json(obj: Any) -> bytes | None:
    """``obj`` as JSON by orjson, for data the caller knows to hold no NaN or infinity (orjson
    would write them as ``null``): plain dicts with string keys, lists, strings and numbers.
    ``None`` when orjson is not installed or refuses ``obj`` (an integer beyond 64 bits): then
    :func:`strict_json`. orjson writes a few floats in another form than the stdlib (``1e-7``,
    ``0.00001`` for ``1e-07``, ``1e-05``): the same numbers."""
    if _orjson_dumps is None:
        return None
    try:
        return _orjson_dumps(obj)
    except TypeError:  # (orjson.JSONEncodeError)
        return None


def json_body(obj: Any, gzip_ok: bool, encoded: dict[str, list[bytes] | bytes] | None = None,
              ) -> tuple[bytes, bool]:
    """Strict JSON bytes of ``obj`` (non-finite numbers as strings), compressed as :func:`compress`.
    ``encoded``: keys of the dict ``obj`` whose value is encoded already (strict JSON), given here
    whole (``bytes``) or as a list of items encoded each (``obj`` holds a placeholder there, for the
    keys' order)."""
    if not encoded:
        return compress(strict_json(obj).encode("utf-8"), gzip_ok)
    items = [strict_json(key).encode("utf-8") + b":" +
             (_encoded_value(encoded[key]) if key in encoded else strict_json(value).encode("utf-8"))
             for key, value in obj.items()]
    return compress(b"{" + b",".join(items) + b"}", gzip_ok)


def _encoded_value(value: list[bytes] | bytes) -> bytes:
    return value if isinstance(value, bytes) else b"[" + b",".join(value) + b"]"
