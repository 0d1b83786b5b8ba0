"""The WebSocket side of the server: one session per connection, from ``hello`` to close.

A session feeds the client's messages (``subscribe``) to its per-run streams
(``stream.RunStream``) and carries out what they ask: ``reset`` messages, catch-ups read back
from the file. Bad messages get one bounded ``error`` each; a client that keeps sending them, or
that does not read (its queue overflows with messages that cannot be dropped), is closed. The
server's fan-out of new records is ``GradmonServer``'s (app.py), which creates the sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gradmon.server.hub import Client, records_message, reset_message
from gradmon.server.jsontext import dumps
from gradmon.server.parse import parse_lines
from gradmon.server.stream import Action, Check, CursorError, Position, Reset, RunStream, Step, parse_cursor
from gradmon.server.tail import read_lines

if TYPE_CHECKING:
    from gradmon.server.served import SessionHost

__all__ = ["MAX_ERROR_TEXT", "MAX_SUBSCRIBE_RUNS", "Sessions"]

MAX_SUBSCRIBE_RUNS = 2_000  # runs one `subscribe` may name (discovery lists at most 2000 runs)
MAX_ERROR_TEXT = 1_000  # characters of an `error` message's text


class Sessions:
    """The connected clients of one server and their WebSocket sessions.

    ``server``: anything with the attributes of :class:`~gradmon.server.served.SessionHost` (the
    ``GradmonServer`` that owns the sessions, or a fake in tests).
    """

    def __init__(self, server: SessionHost) -> None:
        self.server = server
        self.clients: set[Client] = set()
        self._closing: set[asyncio.Task] = set()  # closing the connections of dropped clients
        self.dropped = 0  # connections closed for abuse (not reading, garbage)

    def stats(self) -> dict[str, Any]:
        return {"clients": len(self.clients), "lagged": sum(c.lag_count for c in self.clients),
                "dropped": self.dropped,
                "max_queued_bytes": max((c.queued_bytes for c in self.clients), default=0)}

    async def handler(self, ws: ServerConnection) -> None:
        """One WebSocket connection, from ``hello`` to close (websockets' handler)."""
        client = Client(ws.send, self.server.client_queue_bytes,
                        lambda code, why: self._close_ws(ws, code, why), ws)
        self.clients.add(client)
        for info in (infos := self.server.run_infos()):
            client.streams[info["name"]] = RunStream(**info["cursor"])
        client.push(dumps({"type": "hello", "runs": infos}))
        sender = asyncio.create_task(self._run_sender(client))
        try:
            async for message in ws:
                self._on_client_message(client, message)
                if client.dropped is not None:
                    await ws.wait_closed()  # closed with its code by _close_ws (not 1000 on return)
                    break
        except ConnectionClosed:
            pass
        finally:
            self.clients.discard(client)
            self.dropped += client.dropped is not None
            sender.cancel()
            for t in client.tasks:
                t.cancel()

    async def _run_sender(self, client: Client) -> None:
        with contextlib.suppress(ConnectionClosed):
            await client.run_sender()

    def _close_ws(self, ws: ServerConnection, code: int, reason: str) -> None:
        """Close a dropped client's connection: a close frame when it reads, else (after a second)
        the TCP connection is aborted."""
        async def close() -> None:
            try:
                await asyncio.wait_for(ws.close(code, reason), 1.0)
            except (asyncio.TimeoutError, ConnectionClosed, OSError):
                ws.transport.abort()

        task = asyncio.create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _error(self, client: Client, message: str) -> None:
        """Answer one bad client message with one bounded ``error``; close a client that keeps
        sending them."""
        if not client.allow_bad_message():
            client.drop(1008, "too many bad messages")
            return
        client.push(dumps({"type": "error", "error": message[:MAX_ERROR_TEXT]}))

    def _on_client_message(self, client: Client, message: str | bytes) -> None:
        if isinstance(message, bytes):
            return self._error(client, "binary messages are not understood; send JSON text")
        try:
            msg = json.loads(message)
        except (ValueError, RecursionError) as exc:
            return self._error(client, f"message is not JSON: {str(exc)[:200]}")
        if not isinstance(msg, dict):
            return self._error(client, "a message is a JSON object")
        kind = msg.get("type")
        if kind != "subscribe":
            return self._error(client, f"unknown message type {str(kind)[:50]!r} (expected 'subscribe')")
        runs = msg.get("runs")
        if not isinstance(runs, dict):
            return self._error(client, "'subscribe' needs 'runs': {run name: cursor or null}")
        if len(runs) > MAX_SUBSCRIBE_RUNS:
            return self._error(client, f"'subscribe' names {len(runs)} runs; at most {MAX_SUBSCRIBE_RUNS}")
        unknown: list[str] = []
        bad: list[str] = []
        for name, raw in runs.items():
            run = self.server.run(name)
            if run is None:
                unknown.append(name)
                continue
            try:
                cursor = parse_cursor(raw)
            except CursorError:
                bad.append(name)
                continue
            stream = client.streams.setdefault(name, RunStream(run.gen, run.offset))
            action = stream.on_subscribe(cursor, Position(run.gen, run.offset))
            if isinstance(action, Reset):
                client.push(reset_message(name, action.position))
            elif action is Action.START_CATCH_UP:
                self.start_catch_up(client, name, stream)
        if unknown or bad:
            self._error(client, "; ".join(
                f"{what} ({len(names)}): {_names(names)}"
                for what, names in (("unknown runs", unknown),
                                    ("bad cursors, expected {gen, offset} or null, for runs", bad))
                if names))

    def start_catch_up(self, client: Client, name: str, stream: RunStream) -> None:
        task = asyncio.create_task(self._catch_up(client, name, stream, stream.catch_up_token))
        client.tasks.add(task)
        task.add_done_callback(client.tasks.discard)

    async def _catch_up(self, client: Client, name: str, stream: RunStream, token: int) -> None:
        """Carry out a stream's catch-up: the checks and file reads it asks for, until it is live."""
        while True:
            run = self.server.runs.get(name)
            if run is None or client.streams.get(name) is not stream:
                return
            step = stream.next_step(token, Position(run.gen, run.offset))
            if step is Step.DONE:
                return
            if step is Step.WAIT:  # the server (re)starting has not read that far yet
                await asyncio.sleep(self.server.poll_interval)
            elif isinstance(step, Check):
                on_boundary = await asyncio.to_thread(_on_line_boundary, run.path, step.offset)
                reset = stream.on_checked(step, on_boundary, Position(run.gen, run.offset))
                if reset is not None:
                    client.push(reset_message(name, reset.position))
            else:
                await client.wait_below(client.max_bytes // 2)
                lines = await asyncio.to_thread(read_lines, run.path, step.start, step.end)
                if not lines:  # a line longer than a chunk
                    lines = await asyncio.to_thread(read_lines, run.path, step.start, run.offset)
                end = lines[-1][0] if lines else step.start
                if stream.on_read(step, end) is Action.SEND:  # the records as the tailer sent them
                    derived = run.index.derived.between(step.start, end)
                    raw = run.lines_to_send(parse_lines(lines, step.start), derived)
                    client.push(records_message(name, step.gen, step.start, end, raw), name)


def _names(names: list[str], shown: int = 5) -> str:
    """A bounded list of run names for an error message."""
    out = ", ".join(repr(str(n)[:100]) for n in names[:shown])
    return out + (f" and {len(names) - shown} more" if len(names) > shown else "")


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
