"""HTTP responses and request parsing helpers for the one-port HTTP + WebSocket server. Pure."""

from __future__ import annotations

import email.utils
import gzip
import http
import mimetypes
from typing import Any
from urllib.parse import unquote

from websockets.datastructures import Headers
from websockets.http11 import Response

from gradmon.server.hub import dumps

__all__ = ["PAGE_CSP", "HttpError", "content_type", "json_response", "response", "safe_relpath"]

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


def response(status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None,
             accept_encoding: str | None = None) -> Response:
    """A complete HTTP response (the connection closes after it)."""
    h = Headers()
    h["Date"] = email.utils.formatdate(usegmt=True)
    h["Connection"] = "close"
    h["Content-Type"] = content_type
    h["X-Content-Type-Options"] = "nosniff"
    h["Referrer-Policy"] = "no-referrer"
    if accept_encoding and "gzip" in accept_encoding.lower() and len(body) >= _GZIP_MIN:
        body = gzip.compress(body, compresslevel=5)
        h["Content-Encoding"] = "gzip"
        h["Vary"] = "Accept-Encoding"
    h["Content-Length"] = str(len(body))
    for k, v in (headers or {}).items():
        h[k] = v
    return Response(status, http.HTTPStatus(status).phrase, h, body)


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None,
                  accept_encoding: str | None = None) -> Response:
    """A strict-JSON response (non-finite numbers as strings), never cached."""
    hdrs = {"Cache-Control": "no-store"}
    hdrs.update(headers or {})
    return response(status, dumps(obj).encode("utf-8"), "application/json; charset=utf-8", hdrs,
                    accept_encoding)


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
