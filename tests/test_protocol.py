"""Message shapes of docs/protocol.md, and the per-client bounded queue (lagged) logic."""

from __future__ import annotations

import asyncio
import json
import math

from server_helpers import make_run

from gradmon.server.hub import Client, records_message
from gradmon.server.jsontext import dumps
from gradmon.server.runs import Run
from gradmon.server.stream import Action, RunStream


def test_records_message_embeds_raw_strict_lines():
    lines = [b'{"type":"step","step":1,"loss":"NaN"}', b'{"type":"eval","step":1,"acc":0.5}']
    msg = json.loads(records_message("a/b", "g1", 10, 99, lines))
    assert msg == {"type": "records", "run": "a/b", "prev": {"gen": "g1", "offset": 10},
                   "cursor": {"gen": "g1", "offset": 99},
                   "records": [{"type": "step", "step": 1, "loss": "NaN"},
                               {"type": "eval", "step": 1, "acc": 0.5}]}
    assert json.loads(records_message("r", "g", 5, 5, []))["records"] == []


def test_dumps_never_writes_bare_nan():
    text = dumps({"v": [math.nan, math.inf, -math.inf, 1.5]})
    assert text == '{"v":["NaN","Infinity","-Infinity",1.5]}'


def test_run_info_has_the_documented_keys(tmp_path):
    path = make_run(tmp_path, "exp1", 3)
    run = Run("exp1", str(path))
    run.poll()
    run.update_status()
    info = run.info()
    documented = {"name", "status", "records", "last_step", "first_ts", "last_ts", "header", "fields",
                  "cursor"}
    added = {"malformed", "eval_fields", "system_fields", "indexing", "file_bytes"}
    assert set(info) == documented | added
    assert info["status"] == "live" and info["records"] == 4 and info["last_step"] == 3
    assert info["fields"] == ["loss", "grad_norm"]
    assert info["cursor"] == {"gen": run.gen, "offset": path.stat().st_size}
    assert info["file_bytes"] == path.stat().st_size and info["indexing"] is False
    json.loads(dumps(info))  # serialisable


def test_client_queue_overflow_drops_backlog_and_sends_lagged_with_cursor():
    async def main():
        sent = []
        gate = asyncio.Event()

        async def send(text):
            await gate.wait()
            sent.append(json.loads(text))

        c = Client(send, max_bytes=1000)
        c.push(dumps({"type": "hello", "runs": []}))
        c.streams["a"] = RunStream("g", 0)
        for i in range(20):
            assert c.streams["a"].on_batch("g", i * 100, (i + 1) * 100, indexing=False) is Action.SEND
            accepted = c.push(records_message("a", "g", i * 100, (i + 1) * 100, [b'{"type":"x"}' * 10]), "a")
            if not accepted:
                break
        assert not accepted and c.lag_count == 1
        assert c.queued_bytes <= 1000
        task = asyncio.create_task(c.run_sender())
        gate.set()
        while len(sent) < 2:
            await asyncio.sleep(0.001)
        task.cancel()
        assert sent[0]["type"] == "hello"  # non-records messages are never dropped
        lagged_at = {"gen": "g", "offset": c.streams["a"].offset}
        assert sent[-1] == {"type": "lagged", "run": "a", "cursor": lagged_at}
        assert all(m["type"] != "records" for m in sent)
    asyncio.run(main())


def test_a_single_big_message_is_not_a_backlog():
    async def main():
        c = Client(lambda t: asyncio.sleep(0), max_bytes=10)
        assert c.push(records_message("a", "g", 0, 1, [b"{}"] * 100), "a")
        assert c.lag_count == 0
    asyncio.run(main())


def test_every_message_counts_and_a_client_that_never_reads_is_dropped():
    async def main():
        dropped = []
        c = Client(lambda t: asyncio.sleep(0), max_bytes=1000,
                   drop=lambda code, why: dropped.append((code, why)))
        c.streams["a"] = RunStream("g", 0)
        assert c.push(records_message("a", "g", 0, 10, [b'{"type":"x"}' * 30]), "a")
        err = dumps({"type": "error", "error": "e" * 200})
        assert c.push(err) and c.push(err)
        # the next control message does not fit: the records go first (one lagged for run a)...
        assert c.push(err) and c.lag_count == 1 and c.queued_bytes <= 1000
        assert [json.loads(t)["type"] for t, _r in c._queue] == ["error", "error", "lagged", "error"]
        assert not dropped
        # ...and when control messages alone overflow, the client is dropped and its queue freed
        while c.push(err):
            pass
        assert dropped == [(1008, "not reading: too many messages queued")] and c.dropped
        assert c.queued_bytes == 0 and not c.push(err) and len(dropped) == 1
    asyncio.run(main())


def test_bad_messages_are_allowed_in_a_burst_then_refused(monkeypatch):
    from gradmon.server import hub
    now = [100.0]
    monkeypatch.setattr(hub.time, "monotonic", lambda: now[0])
    c = Client(lambda t: asyncio.sleep(0))
    assert all(c.allow_bad_message() for _ in range(hub.BAD_MESSAGE_BURST))
    assert not c.allow_bad_message()
    now[0] += 2.0 / hub.BAD_MESSAGES_PER_S  # refilled at a steady rate
    assert c.allow_bad_message() and c.allow_bad_message() and not c.allow_bad_message()
