"""Helpers the server tests import (no tests here): run logs, raw HTTP, waiting on WS messages."""

from __future__ import annotations

import asyncio
import bisect
import http.client
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable
from unittest import mock

from gradmon.logformat.jsonl import encode_record
from gradmon.server import history
from gradmon.server.history import HistoryOptions, answer_series, build_job
from gradmon.server.index import RunIndex

DEADLINE_S = 15.0


def header(run_id: str = "r0") -> dict:
    return {"type": "header", "schema": 1, "run_id": run_id, "start_time": 1.0e9, "host": "h", "pid": 1}


def step(i: int, **kw: Any) -> dict:
    rec = {"type": "step", "step": i, "epoch": 1, "ts": 1.0e9 + i, "loss": 1.0 / i,
           "grad_norm": 1.0 + (i % 5)}
    rec.update(kw)
    return rec


def append(path: Path, records: list[dict]) -> None:
    """Append records, one write() + flush per line, as the writer does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(encode_record(r))
            f.flush()


def make_run(root: Path, name: str, n: int, start: int = 1) -> Path:
    p = root / name / "metrics.jsonl"
    append(p, ([header(name)] if start == 1 else []) + [step(i) for i in range(start, start + n)])
    return p


def request(port: int, path: str, method: str = "GET", headers: dict | None = None,
            body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request (the path is sent exactly as given)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        hdrs = headers or {}
        conn.putrequest(method, path, skip_host="Host" in hdrs, skip_accept_encoding=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(port: int, path: str, **kw: Any) -> tuple[int, Any]:
    status, _h, body = request(port, path, **kw)
    return status, json.loads(body)


async def recv_json(ws: Any, timeout: float = DEADLINE_S) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def recv_until(ws: Any, pred: Callable[[dict], bool], timeout: float = DEADLINE_S,
                     seen: list | None = None) -> dict:
    """Receive messages until one satisfies ``pred`` (deadline ``timeout``); keep all in ``seen``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no matching message before the deadline")
        msg = await recv_json(ws, left)
        if seen is not None:
            seen.append(msg)
        if pred(msg):
            return msg


def wait_for(cond: Callable[[], Any], timeout: float = DEADLINE_S, interval: float = 0.01) -> Any:
    """Poll a condition until it holds (deadline), for synchronous checks."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met before the deadline")
        time.sleep(interval)


class StreamFollower:
    """A client that applies a ``records`` message exactly when its ``prev`` is its cursor."""

    def __init__(self, cursors: dict[str, dict]) -> None:
        self.cursors = dict(cursors)
        self.records: dict[str, list[dict]] = {name: [] for name in cursors}

    def feed(self, msg: dict) -> bool:
        if msg.get("type") != "records" or msg["run"] not in self.cursors:
            return False
        if msg["prev"] != self.cursors[msg["run"]]:
            return False
        self.records[msg["run"]].extend(msg["records"])
        self.cursors[msg["run"]] = msg["cursor"]
        return True

    def steps(self, run: str) -> list[int]:
        return [r["step"] for r in self.records[run] if r["type"] == "step"]


def lines_of(records: list[dict], start: int = 0, width: int | None = None) -> list[tuple[int, bytes]]:
    """The records as a file's lines: ``(end_offset, line)`` pairs as ``tail.read_lines`` gives
    them. ``width``: pad each line to that many bytes (newline included), so record ``i`` starts at
    byte ``start + i * width``."""
    pairs, end = [], start
    for r in records:
        line = encode_record(r).rstrip("\n").encode()
        if width is not None:
            line = line[:-1] + b',"pad":"' + b"x" * (width - len(line) - 10) + b'"}'
            assert len(line) + 1 == width, "record too long for the width"
        end += len(line) + 1
        pairs.append((end, line))
    return pairs


def index_of(records: list[dict], batch: int = 1000) -> RunIndex:
    """A run index of these records, fed as the tailer feeds it (batches of lines)."""
    idx = RunIndex()
    pairs = lines_of(records)
    for k in range(0, len(pairs), batch):
        idx.add_lines(pairs[k:k + batch], pairs[k - 1][0] if k else 0)
    return idx


def answer_from_memory(idx: RunIndex, pairs: list[tuple[int, bytes]], start: int, end: int, points: int,
                       ) -> tuple[Any, dict, bool]:
    """``(plan, series, exact)`` as the server answers a history request (``history.build_job``
    then ``answer_series``), the run's file being ``pairs`` in memory."""
    ends = [e for e, _ in pairs]

    def read(_path: str, lo: int, hi: int, *_a: Any) -> list[tuple[int, bytes]]:
        return pairs[bisect.bisect_right(ends, lo):bisect.bisect_right(ends, hi)]

    run = SimpleNamespace(name="r", path="<memory>", index=idx,
                          cursor=lambda: {"gen": "g", "offset": ends[-1]})
    job = build_job(run, HistoryOptions(points, start, end))
    with mock.patch.object(history, "read_lines", read):
        series, exact = answer_series(job)
    return job.plan, series, exact


def line_pairs(lines: list[bytes]) -> list[tuple[int, bytes]]:
    """``(end_offset, line)`` for each of ``lines`` as a tailer reads them (one newline after each)."""
    out, end = [], 0
    for ln in lines:
        end += len(ln) + 1
        out.append((end, ln))
    return out
