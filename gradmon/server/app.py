"""The server: HTTP routes and the WebSocket stream on one port (``websockets`` asyncio API).

Everything runs on one asyncio loop: a tail task polls every run's file with ``os.stat`` every
``poll_interval`` (20 ms: one stat per run per tick; a stat costs ~1 µs, so even 100 runs cost
well under 1% of a core, and no inotify is needed for a ≤ 50 ms flush-to-browser latency); a
discovery task rescans the log root every ``discover_interval`` (1 s) for new runs and status
changes. History requests are answered from each run's index (``index.RunIndex``), reading the
file back only for zoomed ranges, in a worker thread.

No-gap/no-duplicate streaming: every ``records`` message carries ``prev`` and ``cursor`` (the
file positions before and after its records), and a history response's ``cursor`` is always a
position where a ``records`` message of the live stream starts. See docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gradmon.jsonl import RecordError, decode_line
from gradmon.server import auth
from gradmon.server.hub import CLIENT_QUEUE_BYTES, Client, dumps, records_message
from gradmon.server.index import merge_series, series_from_lines
from gradmon.server.responses import PAGE_CSP, HttpError, content_type, json_response, response, safe_relpath
from gradmon.server.runs import Run, discover_runs
from gradmon.server.tail import read_lines

__all__ = ["DEFAULT_PORT", "GradmonServer", "ServerHandle", "serve", "start_server"]

log = logging.getLogger("gradmon.server")

DEFAULT_PORT = 8686
POLL_INTERVAL_S = 0.02
DISCOVER_INTERVAL_S = 1.0
POLL_MAX_BYTES = 256 << 10  # per run per tick: bounds the loop's time on a huge backlog (~20 ms)
CATCH_UP_CHUNK = 1 << 20
MAX_WS_MESSAGE = 256 << 10  # client → server frames; anything bigger closes that connection (1009)
DEFAULT_POINTS = 2000
MAX_POINTS = 100_000
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

_NOT_BUILT_PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>gradmon</title></head>
<body style="font-family:sans-serif;max-width:40em;margin:3em auto">
<h1>gradmon: the dashboard is not built</h1>
<p>The server is running and its API answers (<a href="api/runs">/api/runs</a>), but the page's
assets are missing from <code>gradmon/static/</code>. Build them with <code>make dashboard</code>
(needs npm) and reload this page.</p></body></html>
"""


def _int_param(query: dict[str, list[str]], name: str, lo: int, hi: int) -> int | None:
    values = query.get(name)
    if not values or values[-1] == "":
        return None
    raw = values[-1]
    try:
        v = int(raw)
    except ValueError:
        raise HttpError(400, f"parameter {name!r} must be an integer, got {raw[:50]!r}") from None
    if not lo <= v <= hi:
        raise HttpError(400, f"parameter {name!r} must be in [{lo}, {hi}], got {v}")
    return v


class GradmonServer:
    """The server's state and behaviour; run it with :meth:`start` / :meth:`close` on a loop."""

    def __init__(self, logdir: str | os.PathLike, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, *, poll_interval: float = POLL_INTERVAL_S,
                 discover_interval: float = DISCOVER_INTERVAL_S, static_dir: Path | None = None,
                 client_queue_bytes: int = CLIENT_QUEUE_BYTES, poll_max_bytes: int = POLL_MAX_BYTES,
                 alerts: Any | None = None) -> None:
        self.root = os.path.realpath(os.fspath(logdir))
        self.host = host
        self.port = port
        self.token = token
        self.poll_interval = poll_interval
        self.discover_interval = discover_interval
        self.static_dir = Path(static_dir) if static_dir is not None else STATIC_DIR
        self.client_queue_bytes = client_queue_bytes
        self.poll_max_bytes = poll_max_bytes
        self.runs: dict[str, Run] = {}
        self._announced: set[str] = set()
        self.clients: set[Client] = set()
        self._tasks: list[asyncio.Task] = []
        self._server: Any = None
        self._static: dict[str, Path] = {}
        self._static_scanned = -math.inf
        self.requests = 0
        self.alerts = alerts  # gradmon.server.alerts.AlertSender (--alert-webhook), fed every batch

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Discover runs, read the head of each, and start listening."""
        self._apply_discovery(await asyncio.to_thread(discover_runs, self.root))
        for run in list(self.runs.values()):
            self._poll_run(run, 64 << 10)
        self._server = await ws_serve(
            self._ws_handler, self.host, self.port, process_request=self._process_request,
            max_size=MAX_WS_MESSAGE, max_queue=16, logger=logging.getLogger("gradmon.server.ws"),
        )
        sock = next(iter(self._server.sockets))
        self.port = sock.getsockname()[1]
        self._tasks = [asyncio.create_task(self._tail_loop()), asyncio.create_task(self._discover_loop())]
        if self.alerts is not None:
            self.alerts.start(self.url.split("?", 1)[0])  # the link in messages, without the token

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.alerts is not None:
            await self.alerts.close()

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            import socket

            host = socket.gethostname()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def stats(self) -> dict[str, Any]:
        """Per-run index statistics, client counts and the process RSS (for benchmarks)."""
        runs = {}
        for name, run in self.runs.items():
            idx = run.index
            runs[name] = {
                "records": idx.records, "step_records": idx.step_records, "malformed": idx.malformed,
                "offset": run.offset, "gen": run.gen, "indexing": run.indexing, "status": run.status,
                "levels": [lvl.size for lvl in idx.levels], "fields": len(idx.fields),
                "marks": len(idx.marks), "events": len(idx.events),
            }
        return {"runs": runs, "clients": len(self.clients), "requests": self.requests,
                "lagged": sum(c.lag_count for c in self.clients), "rss_bytes": _rss_bytes()}

    # ---- tailing and fan-out --------------------------------------------------------------

    async def _tail_loop(self) -> None:
        while True:
            busy = False
            tick = time.monotonic()
            for run in list(self.runs.values()):
                if self.runs.get(run.name) is not run:
                    continue
                busy |= self._poll_run(run, self.poll_max_bytes)
                if time.monotonic() - tick > 0.05:  # let the network side breathe
                    await asyncio.sleep(0)
                    tick = time.monotonic()
            await asyncio.sleep(0 if busy else self.poll_interval)

    def _poll_run(self, run: Run, max_bytes: int) -> bool:
        was_indexing = run.indexing
        try:
            reset, batch, more = run.poll(max_bytes)
        except Exception:  # an unreadable file must not stop the other runs
            log.exception("tailing %s failed", run.path)
            return False
        if reset:
            self._on_reset(run)
        if batch is not None:
            self._on_batch(run, batch)
            if self.alerts is not None:  # what the server read first (the backlog) is not news
                self.alerts.feed(run.name, batch.records, replay=was_indexing)
        elif run.name not in self._announced and run.gen is not None:
            self._announce(run)
        if was_indexing and not run.indexing:
            self._end_indexing(run)
        return more

    def _announce(self, run: Run) -> None:
        self._announced.add(run.name)
        run.update_status()
        for c in self.clients:
            c.pos[run.name] = (run.gen, 0)
            c.catching_up.discard(run.name)
        self._broadcast_runs()

    def _on_reset(self, run: Run) -> None:
        """The file was truncated or replaced: every client restarts this run at offset 0."""
        msg = dumps({"type": "reset", "run": run.name, "cursor": {"gen": run.gen, "offset": 0}})
        for c in self.clients:
            c.pos[run.name] = (run.gen, 0)
            c.catching_up.discard(run.name)
            c.held_back.discard(run.name)
            c.push(msg)
        if run.gen is None:
            self._announced.discard(run.name)

    def _end_indexing(self, run: Run) -> None:
        """The server has read a run's existing content: the clients whose stream of it was
        held back meanwhile get one ``lagged`` (refetch the history; the stream continues at
        ``cursor``)."""
        for c in self.clients:
            if run.name in c.held_back:
                c.held_back.discard(run.name)
                gen, off = c.pos.get(run.name, (run.gen, run.offset))
                c.push(dumps({"type": "lagged", "run": run.name, "cursor": {"gen": gen, "offset": off}}))

    def _on_batch(self, run: Run, batch: Any) -> None:
        if run.name not in self._announced:
            self._announce(run)
            for c in self.clients:
                c.pos[run.name] = (batch.gen, batch.prev)
        text: str | None = None
        for c in self.clients:
            if run.name in c.catching_up:
                continue
            if (run.indexing or run.name in c.held_back) and c.pos.get(run.name) == (batch.gen, batch.prev):
                # Part of a backlog that takes more than one read (what the file held when the
                # server started, e.g. 10M lines): streaming it to every page would cost far
                # more than the one history fetch that the `lagged` at its end asks for.
                c.pos[run.name] = (batch.gen, batch.cursor)
                c.held_back.add(run.name)
                continue
            if c.pos.get(run.name) != (batch.gen, batch.prev):
                self._start_catch_up(c, run.name)  # should not happen; recover from the file
                continue
            if text is None:
                text = records_message(run.name, batch.gen, batch.prev, batch.cursor, batch.lines)
            c.pos[run.name] = (batch.gen, batch.cursor)
            c.push(text, run.name)
        if batch.status_changing and run.update_status():
            self._broadcast_runs()

    def _broadcast_runs(self) -> None:
        msg = dumps({"type": "runs", "runs": self._run_infos()})
        for c in self.clients:
            c.push(msg)

    def _run_infos(self) -> list[dict[str, Any]]:
        return [self.runs[n].info() for n in sorted(self._announced) if n in self.runs]

    async def _discover_loop(self) -> None:
        while True:
            await asyncio.sleep(self.discover_interval)
            try:
                found = await asyncio.to_thread(discover_runs, self.root)
            except Exception:
                log.exception("discovering runs under %s failed", self.root)
                continue
            changed = self._apply_discovery(found)
            for name in self._announced:
                run = self.runs.get(name)
                if run is not None and run.update_status():
                    changed = True
            if changed:
                self._broadcast_runs()

    def _apply_discovery(self, found: dict[str, str]) -> bool:
        changed = False
        for name, path in found.items():
            run = self.runs.get(name)
            if run is None or run.path != path:
                self.runs[name] = Run(name, path)
                if run is not None:
                    changed |= self._forget(name)
        for name in [n for n in self.runs if n not in found]:
            if self.runs[name].missing or not os.path.exists(self.runs[name].path):
                del self.runs[name]
                changed |= self._forget(name)
        return changed

    def _forget(self, name: str) -> bool:
        for c in self.clients:
            c.pos.pop(name, None)
            c.catching_up.discard(name)
            c.held_back.discard(name)
        if name in self._announced:
            self._announced.discard(name)
            return True
        return False

    # ---- WebSocket ------------------------------------------------------------------------

    async def _ws_handler(self, ws: ServerConnection) -> None:
        client = Client(ws.send, self.client_queue_bytes)
        self.clients.add(client)
        for name in self._announced:
            run = self.runs[name]
            client.pos[name] = (run.gen, run.offset)
        client.push(dumps({"type": "hello", "runs": self._run_infos()}))
        sender = asyncio.create_task(self._run_sender(client))
        try:
            async for message in ws:
                self._on_client_message(client, message)
        except ConnectionClosed:
            pass
        finally:
            self.clients.discard(client)
            sender.cancel()
            for t in client.tasks:
                t.cancel()

    async def _run_sender(self, client: Client) -> None:
        with contextlib.suppress(ConnectionClosed):
            await client.run_sender()

    def _error(self, client: Client, message: str) -> None:
        client.push(dumps({"type": "error", "error": message}))

    def _on_client_message(self, client: Client, message: str | bytes) -> None:
        if isinstance(message, bytes):
            return self._error(client, "binary messages are not understood; send JSON text")
        try:
            msg = json.loads(message)
        except ValueError as exc:
            return self._error(client, f"message is not JSON: {exc}")
        if not isinstance(msg, dict):
            return self._error(client, "a message is a JSON object")
        kind = msg.get("type")
        if kind != "subscribe":
            return self._error(client, f"unknown message type {str(kind)[:50]!r} (expected 'subscribe')")
        runs = msg.get("runs")
        if not isinstance(runs, dict):
            return self._error(client, "'subscribe' needs 'runs': {run name: cursor or null}")
        for name, cur in runs.items():
            self._subscribe(client, str(name), cur)

    def _subscribe(self, client: Client, name: str, cur: Any) -> None:
        run = self.runs.get(name)
        if run is None or name not in self._announced:
            return self._error(client, f"unknown run {name[:200]!r}")
        client.held_back.discard(name)  # the stream restarts here
        if cur is None:
            client.pos[name] = (run.gen, run.offset)
            client.catching_up.discard(name)
            return None
        if (not isinstance(cur, dict) or not isinstance(cur.get("gen"), str)
                or not isinstance(cur.get("offset"), int) or isinstance(cur.get("offset"), bool)
                or cur["offset"] < 0):
            return self._error(client, f"bad cursor for run {name[:200]!r}: expected {{gen, offset}} or null")
        if cur["gen"] != run.gen:
            client.pos[name] = (run.gen, run.offset)
            client.catching_up.discard(name)
            client.push(dumps({"type": "reset", "run": name, "cursor": run.cursor()}))
            return None
        client.pos[name] = (cur["gen"], cur["offset"])
        self._start_catch_up(client, name)
        return None

    def _start_catch_up(self, client: Client, name: str) -> None:
        if name in client.catching_up:
            return  # the running task picks up the new position
        client.catching_up.add(name)
        task = asyncio.create_task(self._catch_up(client, name))
        client.tasks.add(task)
        task.add_done_callback(client.tasks.discard)

    async def _catch_up(self, client: Client, name: str) -> None:
        """Send a client the records of a run from its position to the run's, then go live."""
        try:
            checked: tuple[str, int] | None = None
            while name in client.catching_up:
                run = self.runs.get(name)
                if run is None or name not in client.pos:
                    break
                gen, pos = client.pos[name]
                if gen != run.gen:
                    break  # a reset was sent meanwhile
                if (gen, pos) != checked:
                    if not await asyncio.to_thread(_on_line_boundary, run.path, pos):
                        if client.pos.get(name) == (gen, pos):
                            client.pos[name] = (run.gen, run.offset)
                            client.push(dumps({"type": "reset", "run": name, "cursor": run.cursor()}))
                        break
                    checked = (gen, pos)
                    continue
                target = run.offset
                if pos == target:
                    break  # in step with the run: live from here on (synchronously, no gap)
                if pos > target:  # the server (re)starting is still indexing up to there
                    await asyncio.sleep(self.poll_interval)
                    continue
                await client.wait_below(client.max_bytes // 2)
                lines = await asyncio.to_thread(read_lines, run.path, pos, min(target, pos + CATCH_UP_CHUNK))
                if not lines:
                    lines = await asyncio.to_thread(read_lines, run.path, pos, target)
                if self.runs.get(name) is not run or client.pos.get(name) != (gen, pos) or run.gen != gen:
                    continue  # moved meanwhile (new subscribe, reset): start over from the new position
                if not lines:
                    break
                valid = []
                for _end, line in lines:
                    if line is None:
                        continue
                    try:
                        decode_line(line)
                    except RecordError:
                        continue
                    valid.append(line.strip())
                end = lines[-1][0]
                client.pos[name] = (gen, end)
                client.push(records_message(name, gen, pos, end, valid), name)
        finally:
            client.catching_up.discard(name)

    # ---- HTTP -----------------------------------------------------------------------------

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
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
        if self.token is None:
            if not auth.host_allowed(host, self.host):
                raise HttpError(403, f"Host {str(host)[:100]!r} is not this server; use http://127.0.0.1:{self.port}/")
            return None
        given = auth.request_token(query, self._header(request, "Authorization"),
                                   self._header(request, "Cookie"), self.port)
        if not auth.token_ok(self.token, given):
            raise HttpError(403, "missing or wrong token: open the URL that `gradmon serve` printed")
        return query["token"][0] if query.get("token") else None

    async def _route(self, request: Request, accept: str | None) -> Response | None:
        method = getattr(request, "method", "GET")
        raw = request.path
        if not raw.startswith("/") or len(raw) > 8192:
            raise HttpError(400, "bad request target")
        url = urlsplit(raw)
        path = url.path
        if method != "GET":
            raise HttpError(405, f"method {method} not allowed: the server is read-only", {"Allow": "GET"})
        query = parse_qs(url.query, keep_blank_values=True, max_num_fields=50) if url.query else {}
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
            return json_response(200, {"runs": self._run_infos()}, accept_encoding=accept)
        if path.startswith("/api/runs/"):
            return await self._run_route(path[len("/api/runs/"):], query, accept)
        raise HttpError(404, f"no such path: {path[:200]!r}")

    def _page(self, query_token: str | None) -> Response:
        headers = {"Cache-Control": "no-cache", "Content-Security-Policy": PAGE_CSP}
        if query_token is not None:
            headers["Set-Cookie"] = (f"{auth.cookie_name(self.port)}={query_token}; Path=/; HttpOnly; "
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
        path = self._static_files().get(name) or self._static_files(refresh=True).get(name)
        if path is None:
            raise HttpError(404, f"no such file: {name[:200]!r}")
        try:
            body = path.read_bytes()
        except OSError:
            raise HttpError(404, f"no such file: {name[:200]!r}") from None
        return response(200, body, content_type(name), {"Cache-Control": "no-cache"})

    async def _run_route(self, rest: str, query: dict[str, list[str]], accept: str | None) -> Response:
        history = False
        name = safe_relpath(rest)
        if name.endswith("/history") and name not in self._announced:
            name = name[: -len("/history")]
            history = True
        if name not in self._announced or name not in self.runs:
            raise HttpError(404, f"unknown run {name[:200]!r}")
        run = self.runs[name]
        if not history:
            return json_response(200, run.info(), accept_encoding=accept)
        points = _int_param(query, "points", 4, MAX_POINTS) or DEFAULT_POINTS
        start = _int_param(query, "start", -(2**62), 2**62)
        end = _int_param(query, "end", -(2**62), 2**62)
        if start is not None and end is not None and start > end:
            raise HttpError(400, f"start ({start}) is after end ({end})")
        for _attempt in range(3):
            body = await self._history(run, points, start, end)
            if body is not None:
                return json_response(200, body, accept_encoding=accept)
        raise HttpError(409, "the run's file keeps being replaced; retry")

    async def _history(self, run: Run, points: int, start: int | None, end: int | None) -> dict | None:
        """The history response, or None when the file was reset while it was being read."""
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        idx = run.index
        cursor = run.cursor()
        plan = idx.plan_history(lo, hi, points, cursor["offset"])
        # Everything but a file read is taken now, consistent with the cursor.
        body: dict[str, Any] = {
            "run": run.name,
            "cursor": cursor,
            "exact": plan.kind == "exact",
            "start": start if start is not None else idx.min_step,
            "end": end if end is not None else idx.max_step,
            "points": points,
            "eval": idx.eval_in(lo, hi),
            "system": idx.system_in(lo, hi, points),
            "layers": idx.layers,
            "marks": idx.marks_in(lo, hi),
            "events": idx.events_in(lo, hi),
            "headers": list(idx.headers),
            "malformed": idx.malformed,
            "marks_dropped": idx.marks_dropped,
            "events_dropped": idx.events_dropped,
        }
        series = plan.series
        if plan.kind == "pyramid" and plan.edges:
            edge_series = []
            for lo_b, hi_b, s_lo, s_hi in plan.edges:  # each: first/last/min/max of the steps kept
                lines = await asyncio.to_thread(read_lines, run.path, lo_b, min(hi_b, cursor["offset"]))
                edge_series.append(series_from_lines(lines, s_lo, s_hi, 4)[0])
            if run.gen != cursor["gen"] or run.index is not idx:
                return None
            for extra in edge_series:
                merge_series(series, extra)
        if plan.kind != "pyramid":
            hi_byte = min(plan.byte_hi, cursor["offset"])
            lines = await asyncio.to_thread(read_lines, run.path, plan.byte_lo, hi_byte)
            if run.gen != cursor["gen"] or run.index is not idx:
                return None
            series, exact = series_from_lines(lines, lo, hi, points, plan.byte_lo, plan.cutoffs)
            body["exact"] = exact
            if not exact:
                idx._add_marks_to(series, lo, hi)
        body["series"] = {n: {"step": s, "value": v} for n, (s, v) in series.items()}
        return body


def _on_line_boundary(path: str, offset: int) -> bool:
    """Whether ``offset`` is 0 or just after a ``\\n`` of the file (a valid cursor position)."""
    if offset == 0:
        return True
    try:
        with open(path, "rb") as f:
            f.seek(offset - 1)
            return f.read(1) == b"\n"
    except OSError:
        return False


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _resolve_token(host: str, token: str | None) -> str | None:
    if token is not None:
        if not token:
            raise ValueError("the token must not be empty")
        return token
    if host not in auth.LOOPBACK_HOSTS:
        return auth.new_token()  # exposed beyond loopback: never without a token
    return None


async def serve(logdir: str | os.PathLike, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                token: str | None = None, *, ready: Any | None = None, **kwargs: Any) -> None:
    """Serve until cancelled. ``ready(server)`` is called once listening (e.g. to print the URL).
    A ``host`` other than loopback gets a generated token unless ``token`` is given."""
    server = GradmonServer(logdir, host, port, _resolve_token(host, token), **kwargs)
    await server.start()
    try:
        if ready is not None:
            ready(server)
        await asyncio.Future()  # forever
    finally:
        await server.close()


class ServerHandle:
    """A server running on its own event loop in a background thread (see :func:`start_server`)."""

    def __init__(self, server: GradmonServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 stop_event: asyncio.Event) -> None:
        self.server = server
        self._loop = loop
        self._thread = thread
        self._stop_event = stop_event

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def token(self) -> str | None:
        return self.server.token

    def stats(self) -> dict[str, Any]:
        """:meth:`GradmonServer.stats`, taken on the server's loop."""
        return asyncio.run_coroutine_threadsafe(_call(self.server.stats), self._loop).result(timeout=30)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _call(fn: Any) -> Any:
    return fn()


def start_server(logdir: str | os.PathLike, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, **kwargs: Any) -> ServerHandle:
    """Start a server in a background thread and return once it listens (``port=0``: any free
    port; see ``handle.port`` / ``handle.url``). Raises what starting raised (e.g. port in use)."""
    server = GradmonServer(logdir, host, port, _resolve_token(host, token), **kwargs)
    started = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        box["loop"] = loop

        async def run() -> None:
            stop = asyncio.Event()
            box["stop"] = stop
            try:
                await server.start()
            except BaseException as exc:
                box["error"] = exc
                started.set()
                return
            started.set()
            try:
                await stop.wait()
            finally:
                await server.close()

        try:
            loop.run_until_complete(run())
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="gradmon-server", daemon=True)
    thread.start()
    started.wait()
    if "error" in box:
        thread.join()
        raise box["error"]
    return ServerHandle(server, box["loop"], thread, box["stop"])
