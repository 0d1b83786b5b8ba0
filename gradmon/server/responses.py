"""HTTP responses and request parsing helpers for the one-port HTTP + WebSocket server. Pure."""

from __future__ import annotations

import email.utils
import gzip
import http
import json
import mimetypes
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

from gradmon.logformat.jsonl import to_jsonable
from gradmon.server.hub import dumps

try:  # optional: encodes a history answer's series ~10x faster (benchmarks/README.md)
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_dumps = None

__all__ = [
    "MAX_QUERY_FIELDS", "MAX_TARGET", "PAGE_CSP", "HttpError", "accepts_gzip", "compress", "content_type",
    "encoded_json_response", "int_param", "json_body", "json_response", "response", "safe_relpath",
    "split_target", "strict_json",
]

MAX_TARGET = 8192  # bytes of a request target (path and query)
MAX_QUERY_FIELDS = 50
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # ASCII digits only: int() would take "1_000" and "٣"
_PLAIN_NUMBERS = frozenset({int, float})
_GZIP_MIN = 32 << 10  # compress JSON bodies above this size when the client accepts gzip

# The page loads only its own assets; ECharts sets inline styles, hence 'unsafe-inline' for styles.
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data: blob:; connect-src 'self' ws: wss:; frame-ancestors 'none'; "
            "base-uri 'none'; form-action 'none'")


class HttpError(Exception):
    """A request refused with a 4xx status and a message for the JSON error body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def accepts_gzip(accept_encoding: str | None) -> bool:
    return bool(accept_encoding) and "gzip" in accept_encoding.lower()  # type: ignore[union-attr]


def compress(body: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
    """``body`` gzip-compressed when the client accepts it and it is large enough to gain."""
    if gzip_ok and len(body) >= _GZIP_MIN:
        return gzip.compress(body, compresslevel=5), True
    return body, False


def strict_json(obj: Any) -> str:
    """``hub.dumps(obj)`` (strict JSON, non-finite numbers as strings; keys must be strings), each
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


def response(status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None,
             accept_encoding: str | None = None, gzipped: bool = False) -> Response:
    """A complete HTTP response (the connection closes after it). ``gzipped``: ``body`` is
    compressed already (see :func:`compress`); else it is compressed here when worth it."""
    h = Headers()
    h["Date"] = email.utils.formatdate(usegmt=True)
    h["Connection"] = "close"
    h["Content-Type"] = content_type
    h["X-Content-Type-Options"] = "nosniff"
    h["Referrer-Policy"] = "no-referrer"
    if not gzipped:
        body, gzipped = compress(body, accepts_gzip(accept_encoding))
    if gzipped:
        h["Content-Encoding"] = "gzip"
        h["Vary"] = "Accept-Encoding"
    h["Content-Length"] = str(len(body))
    for k, v in (headers or {}).items():
        h[k] = v
    return Response(status, http.HTTPStatus(status).phrase, h, body)


JSON_TYPE = "application/json; charset=utf-8"


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None,
                  accept_encoding: str | None = None) -> Response:
    """A strict-JSON response (non-finite numbers as strings), never cached."""
    body, gzipped = json_body(obj, accepts_gzip(accept_encoding))
    return encoded_json_response(status, body, gzipped, headers)


def encoded_json_response(status: int, body: bytes, gzipped: bool,
                          headers: dict[str, str] | None = None) -> Response:
    """A JSON response from a body encoded already (:func:`json_body`), never cached."""
    hdrs = {"Cache-Control": "no-store", **(headers or {})}
    return response(status, body, JSON_TYPE, hdrs, gzipped=gzipped)


def content_type(name: str) -> str:
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype in ("application/javascript", "application/json"):
        ctype += "; charset=utf-8"
    return ctype


def safe_relpath(raw: str) -> str:
    """Percent-decode a relative URL path and refuse anything that could leave its directory:
    ``..`` or ``.`` segments, empty segments, absolute paths, backslashes, NUL. Raises 400."""
    try:
        name = unquote(raw, errors="strict") if "%" in raw else raw
    except UnicodeDecodeError:
        raise HttpError(400, f"invalid path encoding: {raw[:200]!r}") from None
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name
            or any(seg in ("", ".", "..") for seg in name.split("/"))):
        raise HttpError(400, f"invalid path: {raw[:200]!r}")
    return name


def split_target(raw: str) -> tuple[str, dict[str, list[str]]]:
    """The path and the parsed query of a request target; ``400`` for anything malformed (not
    absolute, too long, a netloc that is not one, more than ``MAX_QUERY_FIELDS`` fields)."""
    if not raw.startswith("/") or len(raw) > MAX_TARGET:
        raise HttpError(400, "bad request target")
    try:
        url = urlsplit(raw)
        query = parse_qs(url.query, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS) \
            if url.query else {}
    except ValueError as exc:  # e.g. "//[" (an IPv6 netloc) or too many fields
        raise HttpError(400, f"bad request target: {exc}") from None
    return url.path, query


def int_param(query: dict[str, list[str]], name: str, lo: int, hi: int) -> int | None:
    """An optional integer query parameter (the last one given) in ``[lo, hi]``; ``400`` otherwise."""
    values = query.get(name)
    if not values or values[-1] == "":
        return None
    raw = values[-1]
    if not _INTEGER.fullmatch(raw):
        raise HttpError(400, f"parameter {name!r} must be an integer, got {raw[:50]!r}")
    v = int(raw)
    if not lo <= v <= hi:
        raise HttpError(400, f"parameter {name!r} must be in [{lo}, {hi}], got {v}")
    return v
