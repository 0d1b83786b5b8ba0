"""Request targets and query parameters, checked: what an HTTP request may ask for, refused with
a 4xx :class:`HttpError` otherwise. Pure (the history worker reads its query with these)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["MAX_QUERY_FIELDS", "MAX_TARGET", "HttpError", "int_param", "safe_relpath", "split_target"]

MAX_TARGET = 8192  # bytes of a request target (path and query)
MAX_QUERY_FIELDS = 50
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # ASCII digits only: int() would take "1_000" and "٣"


class HttpError(Exception):
    """A request refused with a 4xx status and a message for the JSON error body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


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
