"""Running a server: ``serve()`` inside an event loop, or ``start_server()`` in a background thread
(:class:`ServerHandle`). A host other than loopback always gets a token."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from gradmon.server import auth
from gradmon.server.app import DEFAULT_PORT, GradmonServer

__all__ = ["ServerHandle", "resolve_token", "serve", "start_server"]


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
                token: str | None = None, *, ready: Any | None = None, **kwargs: Any) -> None:
    """Serve until cancelled. ``ready(server)`` is called once listening (e.g. to print the URL).
    A ``host`` other than loopback gets a generated token unless ``token`` is given."""
    server = GradmonServer(logdir, host, port, resolve_token(host, token), **kwargs)
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
