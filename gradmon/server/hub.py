"""Fan-out of messages to WebSocket clients, each with its own bounded queue.

Producers never wait on a client: ``Client.push`` only appends to the client's queue, and each
client has one sender task that drains it. Every message counts against the client's byte
budget. A client whose queue exceeds it (it reads too slowly or not at all) loses its queued
records and gets a ``lagged`` message per run instead, carrying the cursor where its stream
continues; it never delays other clients nor grows memory. When the messages that cannot be
dropped (``hello``, ``runs``, ``reset``, ``lagged``, ``error``) alone exceed the budget, the client
is not reading at all: it is dropped (its queue freed, its connection closed).

Each client keeps, per run, its stream state (``stream.RunStream``): the cursor up to which it has
been sent records and whether it follows the run live, is caught up from the file, or is held
back while the run is indexed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable
from typing import Any, Callable

from gradmon.server.jsontext import dumps
from gradmon.server.stream import Position, RunStream

__all__ = [
    "BAD_MESSAGE_BURST", "CLIENT_QUEUE_BYTES", "DIRECT_WRITE_LIMIT", "Client", "dumps", "indexing_message",
    "lagged_message", "records_message", "reset_message",
]

CLIENT_QUEUE_BYTES = 8 << 20  # per-client backlog before it is dropped (lagged)
# A message is written to a connection at once (no queue, no task switch) while the bytes its
# socket has not taken yet stay below this; above, it waits in the client's queue.
DIRECT_WRITE_LIMIT = 64 << 10
# Bad client messages a connection may send in a burst, and how many more per second after that;
# beyond, the connection is closed (1008): a client that keeps sending garbage costs nothing more.
BAD_MESSAGE_BURST = 20
BAD_MESSAGES_PER_S = 1.0


def reset_message(run: str, at: Position) -> str:
    return dumps({"type": "reset", "run": run, "cursor": at.cursor()})


def lagged_message(run: str, at: Position) -> str:
    return dumps({"type": "lagged", "run": run, "cursor": at.cursor()})


def indexing_message(progress: list[dict[str, Any]]) -> str:
    """How far the server has read the runs whose backlog it is still reading (``Run.progress``)."""
    return dumps({"type": "indexing", "runs": progress})


def records_message(run: str, gen: str | None, prev: int, cursor: int, lines: list[bytes]) -> str:
    """A ``records`` message built around the raw record lines (already strict JSON, validated
    by the tailer), so records are never decoded and re-encoded for sending."""
    head = dumps({"type": "records", "run": run, "prev": {"gen": gen, "offset": prev},
                  "cursor": {"gen": gen, "offset": cursor}})
    body = b",".join(lines).decode("utf-8")
    return f"{head[:-1]},\"records\":[{body}]}}"


class Client:
    """One WebSocket client: a bounded outgoing queue and its per-run stream positions."""

    def __init__(self, send: Callable[[str], Awaitable[None]], max_bytes: int = CLIENT_QUEUE_BYTES,
                 drop: Callable[[int, str], None] | None = None, connection: Any = None) -> None:
        self._send = send
        self.connection = connection  # the websockets connection, for direct writes (broadcast)
        self._drop = drop  # closes the connection (code, reason); called once
        self.dropped: str | None = None  # why the client was dropped
        self.max_bytes = max_bytes
        self._bad_tokens = float(BAD_MESSAGE_BURST)
        self._bad_time = time.monotonic()
        self._queue: deque[tuple[str, str | None]] = deque()  # (text, run if records)
        self.queued_bytes = 0
        self._wake = asyncio.Event()
        self.streams: dict[str, RunStream] = {}  # run name -> this client's stream of it
        self.tasks: set[asyncio.Task] = set()  # catch-up tasks, cancelled with the connection
        self.lag_count = 0
        self.sent = 0

    def push(self, text: str, run: str | None = None) -> bool:
        """Queue a message (``run`` given for a ``records`` message of that run). Returns False when
        it was not queued: the backlog overflowed (queued records are then dropped and ``lagged``
        messages queued) or the client was dropped."""
        if self.dropped is not None:
            return False
        # One message alone may exceed the budget (a big batch): only a backlog overflows.
        if self.queued_bytes and self.queued_bytes + len(text) > self.max_bytes:
            if run is not None:
                self._lag(extra_run=run)
                return False
            if any(r is not None for _t, r in self._queue):  # records can be refetched: drop them first
                self._lag(extra_run=None)
            if self.queued_bytes + len(text) > self.max_bytes:
                self.drop(1008, "not reading: too many messages queued")
                return False
        self._queue.append((text, run))
        self.queued_bytes += len(text)
        self._wake.set()
        return True

    def can_write_now(self) -> bool:
        """Whether a message may bypass the queue (``websockets.broadcast``): nothing queued before
        it (a message the sender took is on the socket already) and the socket keeps up."""
        if self._queue or self.dropped is not None or self.connection is None:
            return False
        return self.connection.transport.get_write_buffer_size() < DIRECT_WRITE_LIMIT

    def drop(self, code: int, reason: str) -> None:
        """Give up on this client: free its queue and close its connection (once)."""
        if self.dropped is not None:
            return
        self.dropped = reason
        self._queue.clear()
        self.queued_bytes = 0
        self._wake.set()
        if self._drop is not None:
            self._drop(code, reason)

    def allow_bad_message(self) -> bool:
        """Count one bad message from the client; False once it has sent too many (a burst of
        ``BAD_MESSAGE_BURST``, then ``BAD_MESSAGES_PER_S``)."""
        now = time.monotonic()
        self._bad_tokens = min(float(BAD_MESSAGE_BURST),
                               self._bad_tokens + (now - self._bad_time) * BAD_MESSAGES_PER_S)
        self._bad_time = now
        if self._bad_tokens < 1.0:
            return False
        self._bad_tokens -= 1.0
        return True

    def _lag(self, extra_run: str | None) -> None:
        lagged = {extra_run} if extra_run is not None else set()
        kept: deque[tuple[str, str | None]] = deque()
        for text, run in self._queue:
            if run is None:
                kept.append((text, run))
            else:
                lagged.add(run)
        self._queue = kept
        self.queued_bytes = sum(len(t) for t, _ in kept)
        self.lag_count += 1
        for run in sorted(lagged):
            stream = self.streams.get(run)
            text = lagged_message(run, stream.position if stream is not None else Position(None, 0))
            self._queue.append((text, None))
            self.queued_bytes += len(text)
        self._wake.set()

    async def wait_below(self, limit: int) -> None:
        """Wait until the backlog is under ``limit`` bytes (for producers that can wait)."""
        while self.queued_bytes >= limit:
            self._wake.set()
            await asyncio.sleep(0.005)

    async def run_sender(self) -> None:
        """Send queued messages in order, forever (cancelled when the connection ends)."""
        while self.dropped is None:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
                if self.dropped is not None:
                    return
            text, _run = self._queue.popleft()
            self.queued_bytes -= len(text)
            await self._send(text)
            self.sent += 1
