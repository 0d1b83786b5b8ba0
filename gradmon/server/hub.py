"""Fan-out of messages to WebSocket clients, each with its own bounded queue.

Producers never wait on a client: ``Client.push`` only appends to the client's queue, and each
client has one sender task that drains it. A client whose queue exceeds its byte budget (it reads
too slowly or not at all) loses its queued records and gets a ``lagged`` message per run instead,
carrying the cursor where its stream continues; it never delays other clients nor grows memory.

Each client tracks, per run, the cursor up to which it has been sent records (``pos``), and
whether it follows the run live or is being caught up from the file (``catching_up``).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable
from typing import Any, Callable

from gradmon.jsonl import to_jsonable

__all__ = ["CLIENT_QUEUE_BYTES", "Client", "dumps", "records_message"]

CLIENT_QUEUE_BYTES = 8 << 20  # per-client backlog before it is dropped (lagged)


def dumps(obj: Any) -> str:
    """Strict JSON text (non-finite numbers as strings, never bare NaN)."""
    return json.dumps(to_jsonable(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def records_message(run: str, gen: str, prev: int, cursor: int, lines: list[bytes]) -> str:
    """A ``records`` message built around the raw record lines (already strict JSON, validated
    by the tailer), so records are never decoded and re-encoded for sending."""
    head = dumps({"type": "records", "run": run, "prev": {"gen": gen, "offset": prev},
                  "cursor": {"gen": gen, "offset": cursor}})
    body = b",".join(lines).decode("utf-8")
    return f"{head[:-1]},\"records\":[{body}]}}"


class Client:
    """One WebSocket client: a bounded outgoing queue and its per-run stream positions."""

    def __init__(self, send: Callable[[str], Awaitable[None]], max_bytes: int = CLIENT_QUEUE_BYTES) -> None:
        self._send = send
        self.max_bytes = max_bytes
        self._queue: deque[tuple[str, str | None]] = deque()  # (text, run if records)
        self.queued_bytes = 0
        self._wake = asyncio.Event()
        self.pos: dict[str, tuple[str | None, int]] = {}  # run -> (gen, offset) sent up to
        self.catching_up: set[str] = set()
        self.held_back: set[str] = set()  # runs whose initial reading was not streamed (see app)
        self.tasks: set[asyncio.Task] = set()  # catch-up tasks, cancelled with the connection
        self.lag_count = 0
        self.sent = 0

    def push(self, text: str, run: str | None = None) -> bool:
        """Queue a message (``run`` given for a ``records`` message of that run). Returns False when
        the backlog overflowed: then queued records are dropped and ``lagged`` messages queued."""
        # One message alone may exceed the budget (a big batch): only a backlog overflows.
        if run is not None and self.queued_bytes and self.queued_bytes + len(text) > self.max_bytes:
            self._lag(extra_run=run)
            return False
        self._queue.append((text, run))
        self.queued_bytes += len(text)
        self._wake.set()
        return True

    def _lag(self, extra_run: str) -> None:
        lagged = {extra_run}
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
            gen, off = self.pos.get(run, (None, 0))
            text = dumps({"type": "lagged", "run": run, "cursor": {"gen": gen, "offset": off}})
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
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            text, _run = self._queue.popleft()
            self.queued_bytes -= len(text)
            await self._send(text)
            self.sent += 1
