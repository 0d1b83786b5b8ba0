"""Access checks: token, Host (DNS rebinding) and Origin (cross-site WebSocket). Pure functions.

- With a token, a request must carry it: ``?token=T``, the header ``Authorization: token T`` or
  the cookie ``gradmon-token-<port>`` that the server sets when the page is opened with the token.
- Without a token (loopback only), the ``Host`` header must name a loopback address: a page of
  another site whose DNS name is rebound to 127.0.0.1 is refused.
- A WebSocket handshake whose ``Origin`` is not the server itself is refused (a page of another
  site must not read the stream through the user's browser).
"""

from __future__ import annotations

import hmac
import secrets
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

__all__ = [
    "LOOPBACK_HOSTS",
    "cookie_name",
    "host_allowed",
    "new_token",
    "origin_allowed",
    "request_token",
    "token_ok",
]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def new_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_name(port: int) -> str:
    """Cookies ignore ports: one name per port keeps two servers on one host apart."""
    return f"gradmon-token-{port}"


def _hostname(host_header: str) -> str:
    try:
        return (urlsplit(f"//{host_header}").hostname or "").lower()
    except ValueError:
        return ""


def host_allowed(host_header: str | None, bound_host: str) -> bool:
    """Whether the ``Host`` header names this server (loopback, or the address it is bound to)."""
    if not host_header:
        return False
    name = _hostname(host_header)
    return name in LOOPBACK_HOSTS or name == bound_host.lower().strip("[]")


def origin_allowed(origin: str | None, host_header: str | None) -> bool:
    """Absent ``Origin`` (not a browser) or the same ``host:port`` as ``Host``."""
    if origin is None:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host_header:
        return False
    return parts.netloc.lower() == host_header.lower()


def request_token(query: dict[str, list[str]], authorization: str | None, cookie: str | None,
                  port: int) -> str | None:
    """The token a request carries: query ``token``, ``Authorization: token T``, or the cookie."""
    if query.get("token"):
        return query["token"][0]
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip()
    if cookie:
        try:
            jar = SimpleCookie(cookie)
        except CookieError:
            return None
        morsel = jar.get(cookie_name(port))
        if morsel is not None:
            return morsel.value
    return None


def token_ok(expected: str | None, given: str | None) -> bool:
    """Constant-time token comparison; no token expected means open access."""
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
