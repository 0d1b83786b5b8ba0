"""The server: the WebSocket stream and the HTTP routes on one port (``websockets`` asyncio API).

Everything runs on one asyncio loop: a tail task polls every run's file with ``os.stat`` every
``poll_interval`` (one stat per run per tick, so no inotify is needed for a flush-to-browser
latency within a few ticks); a discovery task rescans the log root every ``discover_interval``
for new runs and status changes. Nothing on the loop may take long, so that live pushes never
wait: a backlog (a big file read at start) is indexed one bounded slice at a time with a yield
after each (sized to take under a millisecond while a client is connected, ``pacing.py``; bigger
while none is: no push can wait then), and history answers are planned on the loop but read back,
decoded and encoded in a worker process (``routes``, ``history``, ``worker``). Records go to every
client that keeps up in one ``broadcast`` (no task switch per client); the others get them through
their queue.

The no-gap/no-duplicate rules of each client's stream of each run are ``stream.RunStream``'s;
the server only carries their actions out: this class for the events of the runs (new records,
resets, the end of indexing), ``sessions.Sessions`` for those of the clients (``subscribe``,
catch-ups). See docs/protocol.md.

Run it with ``await serve(...)`` inside an event loop, or ``start_server(...)`` in a background
thread (:class:`ServerHandle`). A host other than loopback always gets a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.server import broadcast
from websockets.asyncio.server import serve as ws_serve

from gradmon.server import auth
from gradmon.server.hub import (
    CLIENT_QUEUE_BYTES,
    Client,
    dumps,
    indexing_message,
    lagged_message,
    records_message,
    reset_message,
)
from gradmon.server.pacing import SlicePacer
from gradmon.server.routes import HttpRoutes
from gradmon.server.runs import Batch, Run, discover_runs
from gradmon.server.sessions import Sessions
from gradmon.server.stream import Action, Position, RunStream
from gradmon.server.worker import WorkerPool, shared_pool

__all__ = [
    "DEFAULT_PORT", "POLL_IDLE_MAX_BYTES", "POLL_MAX_BYTES", "POLL_MIN_BYTES", "GradmonServer",
    "ServerHandle", "resolve_token", "serve", "start_server",
]

log = logging.getLogger("gradmon.server")

DEFAULT_PORT = 8686
POLL_INTERVAL_S = 0.02
DISCOVER_INTERVAL_S = 1.0
# While a page is connected, a backlog slice (per run per tick) is sized to take about
# pacing.SLICE_BUDGET_S on the loop (a live push may wait for it): at least POLL_MIN_BYTES, at most
# POLL_IDLE_MAX_BYTES. POLL_MAX_BYTES: a run's head, read at start before listening.
POLL_MIN_BYTES = 32 << 10
POLL_MAX_BYTES = 64 << 10
# While no page is connected: no live push waits behind a slice then (an HTTP request would: ~8 ms
# here), and per-slice work is ~10 % of a cold index. 512 KiB measured best of 128 KiB to 4 MiB
# (bigger ones were slower again: RESULTS.md, stop 46).
POLL_IDLE_MAX_BYTES = 512 << 10
WARM_DELAY_S = 0.5  # after listening, the history worker starts (see GradmonServer._warm_workers)
MAX_WS_MESSAGE = 256 << 10  # client → server frames; anything bigger closes that connection (1009)
# While a backlog is read (a big run's first index: a minute for 10M steps), the pages learn how far
# it has come this often (their curves hold only what had been read when fetched; the page says so).
INDEXING_PROGRESS_S = 1.0


class GradmonServer:
    """The server's state and behaviour; run it with :meth:`start` / :meth:`close` on a loop."""

    def __init__(self, logdir: str | os.PathLike, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, *, poll_interval: float = POLL_INTERVAL_S,
                 discover_interval: float = DISCOVER_INTERVAL_S, static_dir: Path | None = None,
                 client_queue_bytes: int = CLIENT_QUEUE_BYTES, poll_max_bytes: int | None = None,
                 poll_idle_max_bytes: int = POLL_IDLE_MAX_BYTES,
                 workers: WorkerPool | None = None, alerts: Any | None = None,
                 index_sidecars: bool = True, index_dir: str | os.PathLike | None = None,
                 progress_interval: float = INDEXING_PROGRESS_S) -> None:
        self.root = os.path.realpath(os.fspath(logdir))
        self.host = host
        self.port = port
        self.token = token
        self.poll_interval = poll_interval
        self.discover_interval = discover_interval
        self.client_queue_bytes = client_queue_bytes
        self.poll_max_bytes = poll_max_bytes  # (None: paced, see slice_bytes)
        self.poll_idle_max_bytes = poll_idle_max_bytes
        self.pacer = SlicePacer(min(POLL_MIN_BYTES, poll_idle_max_bytes), poll_idle_max_bytes)
        self.progress_interval = progress_interval
        self.workers = workers if workers is not None else shared_pool()
        self.index_sidecars = index_sidecars  # keep each run's index beside its log (sidecar.py) ...
        self.index_dir = None if index_dir is None else os.path.abspath(os.fspath(index_dir))  # ... or here
        self._said_read_only = False  # (the hint that --index-dir keeps such runs' index: once)
        self.http = HttpRoutes(self, static_dir)
        self.runs: dict[str, Run] = {}
        self._announced: set[str] = set()  # runs listed to clients (their file has a complete line)
        self._progress_sent = -float("inf")  # (monotonic) when the last ``indexing`` message went out
        self.sessions = Sessions(self)
        self._tasks: list[asyncio.Task] = []
        self._server: Any = None
        self.alerts = alerts  # gradmon.server.alerts.AlertSender (--alert-webhook), fed every batch

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Discover runs, read the head of each, and start listening."""
        self._apply_discovery(await asyncio.to_thread(discover_runs, self.root))
        for run in list(self.runs.values()):
            # (the head of each: listening comes first)
            self._poll_run(run, self.poll_max_bytes or POLL_MAX_BYTES)
        self._server = await ws_serve(
            self.sessions.handler, self.host, self.port, process_request=self.http.process_request,
            max_size=MAX_WS_MESSAGE, max_queue=16, logger=logging.getLogger("gradmon.server.ws"),
            compression=None,  # per-connection deflate would double the CPU of each fan-out
        )
        warm = asyncio.create_task(self._warm_workers())
        sock = next(iter(self._server.sockets))
        self.port = sock.getsockname()[1]
        self._tasks = [asyncio.create_task(self._tail_loop()), asyncio.create_task(self._discover_loop()),
                       warm]
        if self.alerts is not None:
            self.alerts.start(self.url.split("?", 1)[0])  # the link in messages, without the token

    async def _warm_workers(self) -> None:
        """Start the history worker shortly after the server listens: not on the first history
        request (a page's first chart would wait for it), and not during the start, where its own
        start (~0.1 s quiet, up to ~0.9 s on a loaded machine) slowed a warm restart (~0.1-0.3 s)
        and its first answer (72 -> 36 ms, 10M steps, 6 alternating starts). History answers run
        in this process until it is up (``WorkerPool.call(early=True)``)."""
        await asyncio.sleep(WARM_DELAY_S)
        await asyncio.to_thread(self.workers.warm)

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
        for run in self.runs.values():  # what was read since the last checkpoint, for the next start
            run.close()

    @property
    def clients(self) -> set[Client]:
        return self.sessions.clients

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def run(self, name: str) -> Run | None:
        """The run of that name when it is listed to clients."""
        return self.runs.get(name) if name in self._announced else None

    def run_infos(self) -> list[dict[str, Any]]:
        """The ``/api/runs`` entries (``hello`` and ``runs`` messages too)."""
        return [self.runs[n].info() for n in sorted(self._announced) if n in self.runs]

    def stats(self) -> dict[str, Any]:
        """Per-run index statistics, client counts and the process RSS (for benchmarks)."""
        runs = {name: {**run.index.stats(), "offset": run.offset, "gen": run.gen, "indexing": run.indexing,
                       "status": run.status, "restored": run.restored,
                       "sidecar_rows": run.sidecar.rows if run.sidecar is not None else None}
                for name, run in self.runs.items()}
        return {"runs": runs, "requests": self.http.requests, **self.sessions.stats(),
                "rss_bytes": _rss_bytes()}

    # ---- tailing and fan-out --------------------------------------------------------------

    async def _tail_loop(self) -> None:
        while True:
            busy = False
            for run in list(self.runs.values()):
                if self.runs.get(run.name) is not run:
                    continue
                read_from = run.offset
                paced = self.poll_max_bytes is None and bool(self.sessions.clients)
                started = time.perf_counter() if paced else 0.0
                busy |= self._poll_run(run, self.slice_bytes())
                if paced:
                    self.pacer.note(run.offset - read_from, time.perf_counter() - started)
                if run.offset != read_from:
                    # A slice read (of a backlog: a big file being indexed, its last one too): let
                    # the senders, the requests and the other runs go before the next slice.
                    await asyncio.sleep(0)
            await asyncio.sleep(0 if busy else self.poll_interval)

    def slice_bytes(self) -> int:
        """The most bytes a run's poll reads in one tick: while a client is connected (its live
        pushes wait for the slice) ``poll_max_bytes``, or by default what ``pacer`` says takes
        about ``pacing.SLICE_BUDGET_S``; ``poll_idle_max_bytes`` while none is."""
        if not self.sessions.clients:
            return self.poll_idle_max_bytes
        return self.poll_max_bytes if self.poll_max_bytes is not None else self.pacer.size()

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
            self._announce(run, Position(run.gen, 0))
        if run.indexing and run.name in self._announced:
            self._send_progress()
        if was_indexing and not run.indexing:
            for c in self.sessions.clients:
                stream = c.streams.get(run.name)
                lagged = stream.on_indexed() if stream is not None else None
                if lagged is not None:
                    c.push(lagged_message(run.name, lagged.position))
            # The list a client read while the backlog was read said `indexing` and a partial count:
            # a page that sized its history request from it (exact smoothing) learns the whole run.
            if run.name in self._announced:
                self._broadcast_runs()
        return more and not run.waiting  # (a slice still on the disk: the next tick, not at once)

    def _send_progress(self) -> None:
        """Tell every client how far the backlogs being read have come: at most once per
        ``progress_interval`` (the runs' entries say the rest when each backlog ends)."""
        now = time.monotonic()
        if now - self._progress_sent < self.progress_interval or not self.sessions.clients:
            return
        self._progress_sent = now
        progress = [run.progress() for name in sorted(self._announced)
                    if (run := self.runs.get(name)) is not None and run.indexing]
        msg = indexing_message(progress)
        for c in self.sessions.clients:
            c.push(msg)

    def _announce(self, run: Run, start: Position) -> None:
        """List a run to every client (``runs``); each streams it from ``start``."""
        self._announced.add(run.name)
        run.update_status()
        for c in self.sessions.clients:
            c.streams[run.name] = RunStream(*start)
        self._broadcast_runs()

    def _on_reset(self, run: Run) -> None:
        """The file was truncated or replaced: every client restarts this run at offset 0."""
        for c in self.sessions.clients:
            stream = c.streams.setdefault(run.name, RunStream(run.gen, 0))
            c.push(reset_message(run.name, stream.on_reset(run.gen).position))
        if run.gen is None:
            self._announced.discard(run.name)

    def _on_batch(self, run: Run, batch: Batch) -> None:
        if run.name not in self._announced:
            self._announce(run, Position(batch.gen, batch.prev))
        text: str | None = None
        direct: list[Client] = []
        for c in self.sessions.clients:
            stream = c.streams.get(run.name)
            if stream is None:
                continue
            action = stream.on_batch(batch.gen, batch.prev, batch.cursor, run.indexing)
            if action is Action.START_CATCH_UP:
                self.sessions.start_catch_up(c, run.name, stream)
            elif action is Action.SEND:
                if text is None:
                    text = records_message(run.name, batch.gen, batch.prev, batch.cursor, batch.lines)
                if c.can_write_now():
                    direct.append(c)
                else:
                    c.push(text, run.name)
        if direct:  # framed and written once per connection, no task switch per client
            broadcast([c.connection for c in direct], text)
            for c in direct:
                c.sent += 1
        if batch.status_changing and run.update_status():
            self._broadcast_runs()

    def _broadcast_runs(self) -> None:
        msg = dumps({"type": "runs", "runs": self.run_infos()})
        for c in self.sessions.clients:
            c.push(msg)

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

    def _hint_read_only(self, run: Run) -> None:
        """Say once that a run's sidecar cannot be written (its directory, or the index directory,
        is read-only): it is indexed again at every start (a big run's first index takes seconds to
        minutes), and how to keep its index."""
        if not run.read_only or self._said_read_only:
            return
        self._said_read_only = True
        if self.index_dir is None:
            log.warning("%s is in a directory this server cannot write: its index is kept in memory and "
                        "built again at every start; --index-dir DIR keeps it in DIR", run.path)
        else:
            log.warning("the index directory %s cannot be written: runs are indexed in memory, again at "
                        "every start", self.index_dir)

    def _apply_discovery(self, found: dict[str, str]) -> bool:
        changed = False
        for name, path in found.items():
            run = self.runs.get(name)
            if run is None or run.path != path:
                self.runs[name] = Run(name, path, self.index_sidecars, self.index_dir)
                self._hint_read_only(self.runs[name])
                if run is not None:
                    run.close()
                    changed |= self._forget(name)
        for name in [n for n in self.runs if n not in found]:
            if self.runs[name].missing or not os.path.exists(self.runs[name].path):
                self.runs.pop(name).close()
                changed |= self._forget(name)
        return changed

    def _forget(self, name: str) -> bool:
        for c in self.sessions.clients:
            c.streams.pop(name, None)
        if name in self._announced:
            self._announced.discard(name)
            return True
        return False


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def resolve_token(host: str, token: str | None) -> str | None:
    """The token to require: the one given, a new one for a non-loopback ``host``, else none."""
    if token is not None:
        if not token:
            raise ValueError("the token must not be empty")
        return token
    if host not in auth.LOOPBACK_HOSTS:
        return auth.new_token()  # exposed beyond loopback: never without a token
    return None


async def serve(logdir: str | os.PathLike, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                token: str | None = None, *, ready: Any | None = None,
                stop_signals: tuple[int, ...] = (), **kwargs: Any) -> None:
    """Serve until cancelled, or until one of ``stop_signals`` arrives (then return normally, the
    server closed in order). ``ready(server)`` is called once listening (e.g. to print the URL).
    A ``host`` other than loopback gets a generated token unless ``token`` is given."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    # On the loop, not a raising handler: an exception raised by a signal handler lands in whatever
    # frame runs, and one that lands in a weakref callback or __del__ is printed and dropped.
    for signum in stop_signals:
        loop.add_signal_handler(signum, stopped.set)
    try:
        server = GradmonServer(logdir, host, port, resolve_token(host, token), **kwargs)
        await server.start()
        try:
            if ready is not None:
                ready(server)
            await stopped.wait()
        finally:
            await server.close()
    finally:
        for signum in stop_signals:
            loop.remove_signal_handler(signum)


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
    server = GradmonServer(logdir, host, port, resolve_token(host, token), **kwargs)
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
