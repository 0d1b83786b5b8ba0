"""Many real ``websockets`` clients in one child process, measuring record latency.

``python -m benchmarks.ws_clients --url ws://127.0.0.1:P/ws --clients N --until T --ready FILE --out FILE``

``stalled_client`` / ``send_text_frame``: a raw client that never reads (the abuse of issue #14 B),
for the benchmarks and the tests.

Every client connects, waits for the server's ``hello``; when all have, ``FILE`` (``--ready``) is
created so the writer can start. With ``--idle`` the clients read nothing after the ``hello``
(open pages nobody looks at: the server still sends to them, the kernel buffers it). For each
record carrying ``bench_wts`` (the writer's ``time.time()`` at write) a client notes ``receive
time - bench_wts``. At wall time ``T`` all clients close (or as soon as the ``--stop`` file
exists) and the summary (counts and latency percentiles over all clients) is written. With
``--samples`` it also holds each record's ``[bench_wts, latency]`` and, per run, when a ``hello`` or
``runs`` message first listed it as indexed (``indexed_at``: the server sends a ``runs`` message as
a run's backlog ends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

from benchmarks.stats import latency_summary


def stalled_client(port: int, rcvbuf: int = 4096) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads, with a tiny receive
    buffer so the server's sends stall quickly instead of after megabytes of kernel buffering."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(15)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % port)
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)  # byte by byte: nothing after the handshake is read
    if not head.startswith(b"HTTP/1.1 101"):
        s.close()
        raise ConnectionError(f"handshake refused: {head[:100]!r}")
    return s


def send_text_frame(sock: socket.socket, text: str) -> None:
    """Send one masked WebSocket text frame on a raw socket (see :func:`stalled_client`)."""
    from websockets.frames import Frame, Opcode

    sock.sendall(Frame(Opcode.TEXT, text.encode()).serialize(mask=True))


def _stopped(until: float, stop_file: str | None) -> bool:
    return time.time() >= until or (stop_file is not None and os.path.exists(stop_file))


async def _client(
    url: str,
    hello: asyncio.Event,
    latencies: list[float],
    counts: dict[str, int],
    until: float,
    stop_file: str | None,
    idle: bool = False,
    stamps: list[float] | None = None,
    indexed_at: dict[str, float] | None = None,
) -> None:
    import websockets

    # An idle client's unread frames fill its queue, so its reading pauses and the server's close frame
    # is never read: its close waits out close_timeout (the default 10 s was ~9 s of every idle case).
    async with websockets.connect(url, max_size=None, open_timeout=60, close_timeout=1 if idle else 10) as ws:
        if idle:
            counts["hello"] = counts.get("hello", 0) + (json.loads(await ws.recv()).get("type") == "hello")
            hello.set()
            while not _stopped(until, stop_file):
                await asyncio.sleep(0.2)
            return
        while not _stopped(until, stop_file):
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=0.2)
            except asyncio.TimeoutError:
                continue
            now = time.time()
            msg = json.loads(raw)
            kind = msg.get("type")
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "hello":
                hello.set()
            if kind in ("hello", "runs") and indexed_at is not None:  # (both list the runs)
                for run in msg.get("runs", []):
                    name = run.get("name") if isinstance(run, dict) else None
                    if isinstance(name, str) and run.get("indexing") is False:
                        indexed_at.setdefault(name, now)
            elif kind == "records":
                for rec in msg.get("records", []):
                    wts = rec.get("bench_wts") if isinstance(rec, dict) else None
                    if isinstance(wts, (int, float)):
                        latencies.append(now - wts)
                        if stamps is not None:
                            stamps.append(wts)


async def run_clients(
    url: str, n: int, until: float, ready_file: str | None, stop_file: str | None = None, idle: bool = False,
    samples: bool = False,
) -> dict[str, Any]:
    """``samples``: the result also holds ``samples``, each record's ``[bench_wts, latency]``, and
    ``indexed_at``, per run the wall time a ``hello`` or ``runs`` message first listed it as indexed."""
    latencies: list[float] = []
    stamps: list[float] | None = [] if samples else None
    indexed_at: dict[str, float] | None = {} if samples else None
    counts: dict[str, int] = {}
    hellos = [asyncio.Event() for _ in range(n)]
    tasks = []
    for i in range(n):
        client = _client(url, hellos[i], latencies, counts, until, stop_file, idle, stamps, indexed_at)
        tasks.append(asyncio.create_task(client))
        if i % 50 == 49:  # connect in waves: a thousand handshakes at once only measure the backlog
            await asyncio.sleep(0.05)
    errors: list[str] = []
    try:
        await asyncio.wait_for(
            asyncio.gather(*(h.wait() for h in hellos)), timeout=max(1.0, until - time.time())
        )
        if ready_file:
            with open(ready_file, "w", encoding="utf-8") as f:
                f.write(str(time.time()))
    except asyncio.TimeoutError:
        errors.append(f"only {sum(h.is_set() for h in hellos)} of {n} clients got hello")
    for res in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(res, BaseException):
            errors.append(f"{type(res).__name__}: {res}")
    out: dict[str, Any] = {"clients": n, "messages": counts, "received": len(latencies), "errors": errors[:5]}
    if latencies:
        out.update(latency_summary(latencies))
    if stamps is not None:
        out["samples"] = [[w, v] for w, v in zip(stamps, latencies)]
        out["indexed_at"] = indexed_at
    return out


def _main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--until", type=float, required=True, help="wall-clock time (time.time()) to stop")
    p.add_argument("--ready", default=None)
    p.add_argument("--stop", default=None, help="stop as soon as this file exists")
    p.add_argument("--out", required=True)
    p.add_argument("--idle", action="store_true", help="read nothing after the hello")
    p.add_argument("--samples", action="store_true", help="keep each record's [bench_wts, latency]")
    a = p.parse_args()
    result = asyncio.run(run_clients(a.url, a.clients, a.until, a.ready, a.stop, a.idle, a.samples))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
