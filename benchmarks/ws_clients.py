"""Many real ``websockets`` clients in one child process, measuring record latency.

``python -m benchmarks.ws_clients --url ws://127.0.0.1:P/ws --clients N --until T --ready FILE --out FILE``

Every client connects, waits for the server's ``hello``; when all have, ``FILE`` (``--ready``) is
created so the writer can start. For each record carrying ``bench_wts`` (the writer's
``time.time()`` at write) a client notes ``receive time - bench_wts``. At wall time ``T`` all
clients close (or as soon as the ``--stop`` file exists) and the summary (counts and
latency percentiles over all clients) is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from benchmarks.stats import latency_summary


def _stopped(until: float, stop_file: str | None) -> bool:
    return time.time() >= until or (stop_file is not None and os.path.exists(stop_file))


async def _client(
    url: str,
    hello: asyncio.Event,
    latencies: list[float],
    counts: dict[str, int],
    until: float,
    stop_file: str | None,
) -> None:
    import websockets

    async with websockets.connect(url, max_size=None, open_timeout=30) as ws:
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
            elif kind == "records":
                for rec in msg.get("records", []):
                    wts = rec.get("bench_wts") if isinstance(rec, dict) else None
                    if isinstance(wts, (int, float)):
                        latencies.append(now - wts)


async def run_clients(
    url: str, n: int, until: float, ready_file: str | None, stop_file: str | None = None
) -> dict[str, Any]:
    latencies: list[float] = []
    counts: dict[str, int] = {}
    hellos = [asyncio.Event() for _ in range(n)]
    tasks = [
        asyncio.create_task(_client(url, hellos[i], latencies, counts, until, stop_file)) for i in range(n)
    ]
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
    return out


def _main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--until", type=float, required=True, help="wall-clock time (time.time()) to stop")
    p.add_argument("--ready", default=None)
    p.add_argument("--stop", default=None, help="stop as soon as this file exists")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    result = asyncio.run(run_clients(a.url, a.clients, a.until, a.ready, a.stop))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
