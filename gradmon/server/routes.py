"""The HTTP side of the server: access checks, routes, the page and its static files, run entries
and history answers (docs/protocol.md). Every request goes through :meth:`HttpRoutes.process_request`
(websockets' ``process_request`` hook) before any WebSocket handshake: a bad request gets a
``4xx`` JSON error, only a bug a ``500``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from gradmon.server import auth
from gradmon.server.history import HistoryOptions, answer, build_job
from gradmon.server.jsontext import accepts_gzip
from gradmon.server.responses import PAGE_CSP, content_type, encoded_json_response, json_response, response
from gradmon.server.targets import HttpError, safe_relpath, split_target

if TYPE_CHECKING:
    from gradmon.server.runs import Run
    from gradmon.server.served import RouteHost

__all__ = ["STATIC_DIR", "HttpRoutes"]

log = logging.getLogger("gradmon.server")

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

_NOT_BUILT_PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>gradmon</title></head>
<body style="font-family:sans-serif;max-width:40em;margin:3em auto">
<h1>gradmon: the dashboard is not built</h1>
<p>The server is running and its API answers (<a href="api/runs">/api/runs</a>), but the page's
assets are missing from <code>gradmon/static/</code>. Build them with <code>make dashboard</code>
(needs npm) and reload this page.</p></body></html>
"""


class HttpRoutes:
    """Answers the HTTP requests of one server (its runs, token, static directory, workers).

    ``server``: anything with the attributes of :class:`~gradmon.server.served.RouteHost` (the
    ``GradmonServer`` that owns these routes, or a fake in tests).
    """

    def __init__(self, server: RouteHost, static_dir: Path | None = None) -> None:
        self.server = server
        self.static_dir = Path(static_dir) if static_dir is not None else STATIC_DIR
        self._static: dict[str, Path] = {}
        self._static_scanned = -math.inf
        self.requests = 0

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """websockets' hook: a response, or ``None`` to let a WebSocket handshake proceed."""
        self.requests += 1
        try:
            accept = ",".join(request.headers.get_all("Accept-Encoding"))
            return await self._route(request, accept)
        except HttpError as exc:
            return json_response(exc.status, {"error": exc.message}, exc.headers)
        except Exception:
            log.exception("request %s failed", request.path[:200])
            return json_response(500, {"error": "internal error; see the server log"})

    @staticmethod
    def _header(request: Request, name: str) -> str | None:
        """A request header that must appear at most once (400 when repeated)."""
        values = request.headers.get_all(name)
        if len(values) > 1:
            raise HttpError(400, f"repeated header {name}")
        return values[0] if values else None

    def _check_access(self, request: Request, query: dict[str, list[str]]) -> str | None:
        """Refuse (403) a request without the token or with a foreign Host; return the query token
        when it was given and valid (the page then gets it as a cookie)."""
        host = self._header(request, "Host")
        server = self.server
        if server.token is None:
            if not auth.host_allowed(host, server.host):
                raise HttpError(403, f"Host {str(host)[:100]!r} is not this server; "
                                     f"use http://127.0.0.1:{server.port}/")
            return None
        given = auth.request_token(query, self._header(request, "Authorization"),
                                   self._header(request, "Cookie"), server.port)
        if not auth.token_ok(server.token, given):
            raise HttpError(403, "missing or wrong token: open the URL that `gradmon serve` printed")
        return query["token"][0] if query.get("token") else None

    async def _route(self, request: Request, accept: str | None) -> Response | None:
        method = getattr(request, "method", "GET")
        path, query = split_target(request.path)
        if method != "GET":
            raise HttpError(405, f"method {method} not allowed: the server is read-only", {"Allow": "GET"})
        query_token = self._check_access(request, query)
        if path == "/ws":
            if not auth.origin_allowed(self._header(request, "Origin"), self._header(request, "Host")):
                raise HttpError(403, "cross-origin WebSocket refused")
            return None  # the WebSocket handshake proceeds
        if path in ("/", "/index.html"):
            return self._page(query_token)
        if path.startswith("/static/"):
            return self._static_file(path[len("/static/"):])
        if path == "/api/runs":
            return json_response(200, {"runs": self.server.run_infos()}, accept_encoding=accept)
        if path.startswith("/api/runs/"):
            return await self._run_route(path[len("/api/runs/"):], query, accept)
        raise HttpError(404, f"no such path: {path[:200]!r}")

    def _page(self, query_token: str | None) -> Response:
        headers = {"Cache-Control": "no-cache", "Content-Security-Policy": PAGE_CSP}
        if query_token is not None:
            headers["Set-Cookie"] = (f"{auth.cookie_name(self.server.port)}={query_token}; Path=/; HttpOnly; "
                                     "SameSite=Strict")
        index = self._static_files().get("index.html")
        if index is None:
            return response(503, _NOT_BUILT_PAGE, "text/html; charset=utf-8", headers)
        return response(200, index.read_bytes(), "text/html; charset=utf-8", headers)

    def _static_files(self, refresh: bool = False) -> dict[str, Path]:
        """Regular files under the static directory, by relative path (the only files served)."""
        now = time.monotonic()
        if refresh and now - self._static_scanned < 1.0:
            return self._static
        if refresh or not self._static:
            files: dict[str, Path] = {}
            root = self.static_dir.resolve() if self.static_dir.exists() else None
            if root is not None:
                for p in root.rglob("*"):
                    try:
                        real = p.resolve()
                    except OSError:
                        continue
                    if p.is_file() and real.is_relative_to(root):
                        files[p.relative_to(root).as_posix()] = real
            self._static = files
            self._static_scanned = now
        return self._static

    def _static_file(self, raw: str) -> Response:
        name = safe_relpath(raw)
        # The page is laid out as its URLs are (index.html, assets in static/: dashboard/build.mjs),
        # so /static/<file> is the file at static/<file>, as it is when index.html opens from disk.
        key = f"static/{name}"
        path = self._static_files().get(key) or self._static_files(refresh=True).get(key)
        if path is None:
            raise HttpError(404, f"no such file: {name[:200]!r}")
        try:
            body = path.read_bytes()
        except OSError:
            raise HttpError(404, f"no such file: {name[:200]!r}") from None
        return response(200, body, content_type(name), {"Cache-Control": "no-cache"})

    async def _run_route(self, rest: str, query: dict[str, list[str]], accept: str | None) -> Response:
        name = safe_relpath(rest)
        history = name.endswith("/history") and self.server.run(name) is None
        if history:
            name = name[: -len("/history")]
        run = self.server.run(name)
        if run is None:
            raise HttpError(404, f"unknown run {name[:200]!r}")
        if not history:
            return json_response(200, run.info(), accept_encoding=accept)
        return await self._history(run, HistoryOptions.from_query(query), accepts_gzip(accept))

    async def _history(self, run: Run, options: HistoryOptions, gzip_ok: bool) -> Response:
        for _attempt in range(3):
            idx = run.index
            job = build_job(run, options, gzip_ok)
            # Reading, decoding and encoding run in a worker process: live pushes do not wait.
            # (In this process while the worker is still starting: a restarted server's first answer.)
            body, gzipped = await asyncio.to_thread(self.server.workers.call, answer, job, early=True)
            if run.gen == job.cursor["gen"] and run.index is idx:
                return encoded_json_response(200, body, gzipped)
        raise HttpError(409, "the run's file keeps being replaced; retry")
