"""HTTP responses of the one-port HTTP + WebSocket server (``websockets`` response objects):
their headers, gzip when the client takes it, the page's content security policy. Their JSON
bodies are ``jsontext.py``'s; what a request may ask for is ``targets.py``'s."""

from __future__ import annotations

import email.utils
import http
import mimetypes
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Response

from gradmon.server.jsontext import accepts_gzip, compress, json_body

__all__ = ["JSON_TYPE", "PAGE_CSP", "content_type", "encoded_json_response", "json_response", "response"]

# The page loads only its own assets; ECharts sets inline styles, hence 'unsafe-inline' for styles.
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data: blob:; connect-src 'self' ws: wss:; frame-ancestors 'none'; "
            "base-uri 'none'; form-action 'none'")


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
