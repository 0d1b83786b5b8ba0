"""A real `gradmon serve` (port 0, 127.0.0.1) and real `websockets` clients: streaming, history +
cursor with no gap and no duplicate, restart, truncation, slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import threading
import time

import pytest
from server_helpers import (
    DEADLINE_S,
    StreamFollower,
    append,
    get_json,
    header,
    make_run,
    recv_json,
    recv_until,
    step,
    wait_for,
)
from websockets.asyncio.client import connect

from benchmarks.ws_clients import stalled_client
from gradmon.server import start_server
from gradmon.server.app import POLL_IDLE_MAX_BYTES, POLL_MAX_BYTES, POLL_MIN_BYTES, GradmonServer


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "logs"


def _server(logdir, **kw):
    kw.setdefault("discover_interval", 0.1)
    return start_server(logdir, port=0, **kw)


def _ws_url(h, path="/ws"):
    return f"ws://127.0.0.1:{h.port}{path}"


def test_appended_records_arrive_over_websocket(logdir):
    path = make_run(logdir, "exp1", 3)
    with _server(logdir) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                hello = await recv_json(ws)
                assert hello["type"] == "hello"
                (info,) = hello["runs"]
                assert info["name"] == "exp1" and info["last_step"] == 3 and info["records"] == 4
                follow = StreamFollower({"exp1": info["cursor"]})
                append(path, [step(4), step(5, loss=math.nan, nonfinite=True)])
                seen = []
                await recv_until(ws, lambda m: follow.feed(m) and 5 in follow.steps("exp1"), seen=seen)
                assert follow.steps("exp1") == [4, 5]
                assert follow.records["exp1"][1]["loss"] == "NaN"  # strict JSON on the wire
                assert follow.cursors["exp1"]["offset"] == path.stat().st_size
        asyncio.run(main())


def test_history_then_subscribe_has_no_gap_and_no_duplicate(logdir):
    path = make_run(logdir, "exp1", 300)
    with _server(logdir) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["last_step"] == 300)
        stop = threading.Event()

        def writer():  # appends while the client fetches history and subscribes
            i = 301
            while not stop.is_set() and i <= 900:
                append(path, [step(i)])
                i += 1

        t = threading.Thread(target=writer)

        async def main():
            async with connect(_ws_url(h)) as ws:
                await recv_json(ws)  # hello
                t.start()
                status, hist = get_json(h.port, "/api/runs/exp1/history?points=100000")
                assert status == 200 and hist["exact"] is True
                hist_steps = hist["series"]["loss"]["step"]
                assert hist_steps == list(range(1, len(hist_steps) + 1))
                await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": hist["cursor"]}}))
                follow = StreamFollower({"exp1": hist["cursor"]})
                t.join()
                # On a loaded machine the writer can finish before the history is read: then the
                # history holds every step and no push is due (waiting for step 900 would hang).
                if hist_steps[-1] < 900:
                    await recv_until(ws, lambda m: follow.feed(m) and 900 in follow.steps("exp1"))
                assert hist_steps + follow.steps("exp1") == list(range(1, 901))
        try:
            asyncio.run(main())
        finally:
            stop.set()


def test_reconnect_with_cursor_after_server_restart(logdir):
    path = make_run(logdir, "exp1", 50)
    with _server(logdir) as h:
        _, hist = get_json(h.port, "/api/runs/exp1/history")
    cursor = hist["cursor"]
    append(path, [step(i) for i in range(51, 61)])
    with _server(logdir) as h2:
        async def main():
            async with connect(_ws_url(h2)) as ws:
                hello = await recv_json(ws)
                assert hello["runs"][0]["cursor"]["gen"] == cursor["gen"]  # stable across restarts
                await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": cursor}}))
                follow = StreamFollower({"exp1": cursor})
                await recv_until(ws, lambda m: follow.feed(m) and 60 in follow.steps("exp1"))
                assert follow.steps("exp1") == list(range(51, 61))
        asyncio.run(main())


def test_subscribe_with_foreign_generation_or_mid_line_offset_gets_reset(logdir):
    make_run(logdir, "exp1", 5)
    with _server(logdir) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                info = (await recv_json(ws))["runs"][0]
                other = {"gen": "other", "offset": 10}
                await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": other}}))
                msg = await recv_until(ws, lambda m: m["type"] == "reset")
                assert msg["cursor"] == info["cursor"]
                bad = {"gen": info["cursor"]["gen"], "offset": 7}  # inside the header line
                await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": bad}}))
                msg = await recv_until(ws, lambda m: m["type"] == "reset")
                assert msg["cursor"] == info["cursor"]
        asyncio.run(main())


def test_truncation_sends_reset_then_new_records_from_offset_zero(logdir):
    path = make_run(logdir, "exp1", 20)
    with _server(logdir) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                info = (await recv_json(ws))["runs"][0]
                path.write_text("")  # truncated...
                append(path, [header("again"), step(1)])  # ...and restarted
                msg = await recv_until(ws, lambda m: m["type"] == "reset")
                assert msg["run"] == "exp1" and msg["cursor"]["offset"] == 0
                assert msg["cursor"]["gen"] != info["cursor"]["gen"]
                follow = StreamFollower({"exp1": msg["cursor"]})
                await recv_until(ws, lambda m: follow.feed(m) and 1 in follow.steps("exp1"))
                assert [r["type"] for r in follow.records["exp1"]] == ["header", "step"]
        asyncio.run(main())
        _, hist = get_json(h.port, "/api/runs/exp1/history")
        assert hist["series"]["loss"]["step"] == [1]


def test_new_run_appears_then_streams_from_its_start(logdir):
    logdir.mkdir()
    with _server(logdir) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                assert (await recv_json(ws))["runs"] == []
                make_run(logdir, "sweep/a", 2)
                seen = []
                msg = await recv_until(ws, lambda m: m["type"] == "runs", seen=seen)
                (info,) = msg["runs"]
                assert info["name"] == "sweep/a"
                rec = await recv_until(ws, lambda m: m["type"] == "records", seen=seen)
                assert rec["prev"]["offset"] == 0
                assert [r["type"] for r in rec["records"]][:1] == ["header"]
        asyncio.run(main())


def test_slow_client_does_not_delay_a_fast_one(logdir):
    path = make_run(logdir, "exp1", 1)
    with _server(logdir, client_queue_bytes=256 << 10) as h:
        stalled = stalled_client(h.port)

        async def main():
            async with connect(_ws_url(h)) as fast:
                info = (await recv_json(fast))["runs"][0]
                follow = StreamFollower({"exp1": info["cursor"]})
                pad = "x" * 4000
                last = 1
                while h.stats()["lagged"] == 0 and last < 20_000:  # the stalled client never reads
                    first, last = last + 1, last + 30
                    append(path, [step(i, note=pad) for i in range(first, last + 1)])
                    target = last
                    await recv_until(fast, lambda m, t=target: follow.feed(m) and t in follow.steps("exp1"))
                assert h.stats()["lagged"] >= 1
                assert follow.steps("exp1") == list(range(2, last + 1))  # the fast one got everything
                assert h.stats()["clients"] == 2
        try:
            asyncio.run(main())
        finally:
            stalled.close()


def test_history_marks_and_downsampling_keep_spikes_and_nan(logdir):
    recs = [header()]
    for i in range(1, 5001):
        extra = {}
        if i == 1234:
            extra = {"grad_norm": 1e9, "spike": True}
        if i == 4321:
            extra = {"loss": math.nan, "nonfinite": True, "skipped": True}
        recs.append(step(i, **extra))
    recs.append({"type": "eval", "step": 5000, "loss": 0.5, "accuracy": 0.9})
    recs.append({"type": "event", "kind": "spike", "step": 1234, "message": "spike"})
    append(logdir / "exp1" / "metrics.jsonl", recs)
    with _server(logdir) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["last_step"] == 5000)
        for query in ("?points=40", "?points=400", "?points=4000", "?points=40&start=1000&end=2000"):
            status, hist = get_json(h.port, "/api/runs/exp1/history" + query)
            assert status == 200
            g = hist["series"]["grad_norm"]
            loss = hist["series"]["loss"]
            if "start" not in query:
                assert dict(zip(g["step"], g["value"]))[1234] == 1e9
                assert dict(zip(loss["step"], loss["value"]))[4321] == "NaN"
                assert hist["eval"]["accuracy"] == {"step": [5000], "value": [0.9]}
                kinds = {(m["step"], m["kind"]) for m in hist["marks"]}
                assert {(1234, "spike"), (4321, "nonfinite"), (4321, "skip")} <= kinds
            else:
                assert 1234 in g["step"] and all(1000 <= s <= 2000 for s in g["step"])
                assert [m["step"] for m in hist["marks"]] == [1234]
            assert hist["exact"] is False
            assert len(g["step"]) <= int(query.split("points=")[1].split("&")[0]) + 4
        _, hist = get_json(h.port, "/api/runs/exp1/history?start=100&end=199&points=200")
        assert hist["exact"] is True and hist["series"]["loss"]["step"] == list(range(100, 200))
        assert hist["start"] == 100 and hist["end"] == 199


def test_finished_status_is_pushed(logdir):
    path = make_run(logdir, "exp1", 2)
    with _server(logdir) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                assert (await recv_json(ws))["runs"][0]["status"] == "live"
                append(path, [{"type": "end", "ts": 1.0e9, "status": "finished", "steps": 2}])
                msg = await recv_until(ws, lambda m: m["type"] == "runs")
                assert msg["runs"][0]["status"] == "finished"
        asyncio.run(main())


def test_cli_serves_and_prints_the_url_without_numpy_or_mindspore(logdir):
    make_run(logdir, "exp1", 2)
    code = ("import sys, runpy; sys.argv = ['gradmon', 'serve', sys.argv[1], '--port', '0'];"
            "import threading, os;"
            "threading.Timer(0.5, lambda: print('MODULES', 'numpy' in sys.modules,"
            " 'mindspore' in sys.modules, flush=True)).start();"
            "runpy.run_module('gradmon', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", code, str(logdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = modules = None
        deadline = time.monotonic() + 30
        while (url is None or modules is None) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("gradmon: open "):
                url = line.split("open ", 1)[1].strip()
            if line.startswith("MODULES"):
                modules = line.split()[1:]
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert modules == ["False", "False"]
        port = int(url.rsplit(":", 1)[1].strip("/"))
        status, body = get_json(port, "/api/runs")
        assert status == 200 and body["runs"][0]["name"] == "exp1"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_history_has_a_ts_series_for_wall_clock_axes(logdir):
    recs = [header()] + [step(i, ts=1.0e9 + 2.0 * i + (3600.0 if i > 2500 else 0.0)) for i in range(1, 5001)]
    append(logdir / "exp1" / "metrics.jsonl", recs)
    true_ts = {r["step"]: r["ts"] for r in recs[1:]}
    with _server(logdir) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["last_step"] == 5000)
        assert "ts" not in get_json(h.port, "/api/runs/exp1")[1]["fields"]
        _, exact = get_json(h.port, "/api/runs/exp1/history?start=2400&end=2600&points=1000")
        assert exact["exact"] is True
        ts = exact["series"]["ts"]
        assert ts["step"] == exact["series"]["loss"]["step"] == list(range(2400, 2601))
        assert ts["value"] == [true_ts[s] for s in ts["step"]]
        for query in ("?points=40", "?points=400", "?points=40&start=1000&end=4000"):
            _, hist = get_json(h.port, "/api/runs/exp1/history" + query)
            assert hist["exact"] is False
            ts = hist["series"]["ts"]
            assert ts["step"] == sorted(ts["step"]) and len(ts["step"]) <= int(query[8:].split("&")[0]) + 8
            assert all(true_ts[s] == v for s, v in zip(ts["step"], ts["value"]))  # true times, not made up
            assert ts["step"][0] == hist["start"] and ts["step"][-1] == hist["end"]  # the range's ends


def test_resumed_run_history_shows_each_step_once_latest_segment_wins(logdir):
    path = logdir / "exp1" / "metrics.jsonl"
    append(path, [header("a")] + [step(i, loss=1.0) for i in range(1, 3001)])
    append(path, [header("b")] + [step(i, loss=2.0) for i in range(2001, 4001)])  # resumed from 2000
    # rolled back to 1000, 500 steps trained again (an overflow among them): 1501-2000 stay a's
    append(path, [header("c")] + [step(i, loss=3.0) for i in range(1001, 1501)])
    append(path, [step(1501, loss=3.0, grad_norm="Infinity", skipped=True, skip_reason="overflow")])

    def expected(s):
        return 3.0 if 1001 <= s <= 1501 else 2.0 if s > 2000 else 1.0

    with _server(logdir) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["records"] == 5504)
        for query in ("?points=100000", "?points=400", "?points=40&start=1500&end=3500"):
            _, hist = get_json(h.port, "/api/runs/exp1/history" + query)
            loss = hist["series"]["loss"]
            assert loss["step"] == sorted(set(loss["step"])), query
            assert all(v == expected(s) for s, v in zip(loss["step"], loss["value"])), query
            assert len(hist["headers"]) == 3
            assert hist["latest_segment"] == {"first_step": 1001, "last_step": 1501}
            assert hist["marks"] == [{"step": 1501, "kind": "skip", "field": "grad_norm", "value": "Infinity",
                                      "reason": "overflow"}]  # a skip, not a non-finite value
        assert hist["exact"] is False and get_json(h.port, "/api/runs/exp1/history")[1]["end"] == 4000
        _, full = get_json(h.port, "/api/runs/exp1/history?points=100000")
        assert full["exact"] is True and full["series"]["loss"]["step"] == list(range(1, 4001))


def test_backlog_read_at_start_is_not_streamed_but_ends_with_one_lagged(logdir):
    path = make_run(logdir, "exp1", 20_000)  # ~2 MB, read 256 bytes per tick: many ticks
    with _server(logdir, poll_max_bytes=256, poll_idle_max_bytes=256) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                hello = await recv_json(ws)
                (info,) = hello["runs"]
                assert info["indexing"] is True and info["records"] < 20_001  # connected mid-way
                seen = []
                lagged = await recv_until(ws, lambda m: m["type"] == "lagged", seen=seen, timeout=60)
                assert not [m for m in seen if m["type"] == "records"]  # no backlog streamed
                assert lagged["run"] == "exp1" and lagged["cursor"]["offset"] == path.stat().st_size
                _, hist = get_json(h.port, "/api/runs/exp1/history?points=40")
                assert hist["cursor"] == lagged["cursor"]
                follow = StreamFollower({"exp1": lagged["cursor"]})
                append(path, [step(20_001)])  # live again: streamed from the lagged cursor on
                await recv_until(ws, lambda m: follow.feed(m) and 20_001 in follow.steps("exp1"))
                assert follow.steps("exp1") == [20_001]
        asyncio.run(main())


def test_the_run_list_is_pushed_again_when_the_backlog_is_read(logdir):
    # A list read mid-indexing says indexing and a partial count; the page sizes its full-resolution
    # history from it, so it needs the list again, whole, once the backlog is read.
    make_run(logdir, "exp1", 5_000)
    with _server(logdir, poll_max_bytes=256, poll_idle_max_bytes=256) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                (info,) = (await recv_json(ws))["runs"]
                assert info["indexing"] is True and info["records"] < 5_001
                msg = await recv_until(ws, lambda m: m["type"] == "runs", timeout=60)
                (info,) = msg["runs"]
                assert info["indexing"] is False and info["records"] == 5_001  # the header and 5,000 steps
        asyncio.run(main())


def test_while_a_backlog_is_read_clients_learn_how_far_it_has_come(logdir):
    # A big run's first index takes a while (a minute for 10M steps): its curves end where the
    # reading is, and the page says how far that is from the run's entry and `indexing` messages.
    path = make_run(logdir, "exp1", 20_000)  # ~2 MB, read 256 bytes per tick: many ticks
    size = path.stat().st_size
    interval = 0.05
    with _server(logdir, poll_max_bytes=256, poll_idle_max_bytes=256, progress_interval=interval) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                (info,) = (await recv_json(ws))["runs"]
                assert info["indexing"] is True and info["file_bytes"] == size
                assert 0 < info["cursor"]["offset"] < size
                seen = []
                await recv_until(ws, lambda m: m["type"] == "lagged", seen=seen, timeout=60)
                sent = [m["runs"] for m in seen if m["type"] == "indexing"]
                assert len(sent) >= 3 and all(len(runs) == 1 for runs in sent)
                progress = [runs[0] for runs in sent]
                assert {(p["name"], p["file_bytes"]) for p in progress} == {("exp1", size)}
                offsets = [p["offset"] for p in progress]
                assert offsets == sorted(offsets) and offsets[0] < offsets[-1] < size  # moving, not done
                for p in progress:  # each says what was indexed up to its offset: the header and steps
                    assert p["records"] == p["last_step"] + 1
                    assert 0 < p["last_step"] < 20_000
                # none once the backlog is read: the run's entry says the rest
                _, entry = get_json(h.port, "/api/runs/exp1")
                assert entry["indexing"] is False and entry["cursor"]["offset"] == entry["file_bytes"] == size
        asyncio.run(main())


def test_indexing_messages_are_paced(logdir):
    make_run(logdir, "exp1", 60_000)  # ~6 MB at 256 bytes per tick: seconds of indexing
    interval = 0.3
    with _server(logdir, poll_max_bytes=256, poll_idle_max_bytes=256, progress_interval=interval) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                await recv_json(ws)  # hello
                arrived = []
                while True:
                    msg = await recv_json(ws, 60)
                    if msg["type"] == "lagged":
                        break
                    if msg["type"] == "indexing":
                        arrived.append((time.monotonic(), msg["runs"][0]["offset"]))
                assert len(arrived) >= 2
                span = arrived[-1][0] - arrived[0][0]
                # sent at least `interval` apart: n messages span at least (n - 1) intervals, less
                # what delivery can shorten (the first delayed, the last not)
                assert span >= (len(arrived) - 1) * interval - 0.2, (span, len(arrived))
        asyncio.run(main())


class _GatedPool:
    """A worker pool whose calls wait for the test to open the gate (then run in the caller's thread)."""

    def __init__(self):
        self.entered = threading.Event()
        self.gate = threading.Event()

    def call(self, fn, arg, early=False):
        self.entered.set()
        assert self.gate.wait(DEADLINE_S)
        return fn(arg)

    def warm(self):
        pass  # nothing to start: the calls run in the caller's thread


def test_history_work_does_not_hold_the_event_loop(logdir):
    """While a history answer is being computed (held in the worker here), live records keep
    arriving and other requests are answered (#14 D)."""
    path = make_run(logdir, "exp1", 3000)
    pool = _GatedPool()
    with _server(logdir, workers=pool) as h:
        async def main():
            async with connect(_ws_url(h)) as ws:
                info = (await recv_json(ws))["runs"][0]
                follow = StreamFollower({"exp1": info["cursor"]})
                zoom = asyncio.create_task(asyncio.to_thread(
                    get_json, h.port, "/api/runs/exp1/history?start=100&end=2100&points=400"))
                assert await asyncio.to_thread(pool.entered.wait, DEADLINE_S)
                append(path, [step(3001), step(3002)])
                await recv_until(ws, lambda m: follow.feed(m) and 3002 in follow.steps("exp1"))
                assert (await asyncio.to_thread(get_json, h.port, "/api/runs"))[0] == 200
                assert not zoom.done()
                pool.gate.set()
                status, hist = await zoom
                assert status == 200 and hist["series"]["loss"]["step"][0] == 100
        asyncio.run(main())


async def _largest_slice(server: GradmonServer, names: list[str]) -> int:
    """Yield to the loop until the runs are indexed; the most bytes they read between two yields
    (the slices of the loop's work on their backlogs)."""
    runs = [server.runs[n] for n in names]
    offsets = [r.offset for r in runs]
    most = 0
    while any(r.indexing for r in runs):
        await asyncio.sleep(0)
        now = [r.offset for r in runs]
        most = max(most, sum(now) - sum(offsets))
        offsets = now
    return most


@pytest.mark.parametrize("page", [False, True])
def test_indexing_yields_to_the_loop_after_each_bounded_slice(logdir, tmp_path, page):
    """Two big backlogs are read one bounded slice at a time, the loop serving everything else
    between two slices (#14 D): while a page is connected, never more than the paced slice size
    (``pacing.SlicePacer``, timed on these very slices, between POLL_MIN_BYTES and
    POLL_IDLE_MAX_BYTES) is indexed without a yield (its live pushes wait for a slice); while none
    is, up to POLL_IDLE_MAX_BYTES, fewer and bigger slices (the lines here are ~110 bytes)."""
    staging = tmp_path / "staging"  # (the runs appear whole once the page is there, or not)
    paths = [make_run(staging, name, 20_000) for name in ("a", "b")]  # ~2.2 MB each
    logdir.mkdir()

    async def main():
        server = GradmonServer(logdir, port=0, index_sidecars=False, discover_interval=0.02)
        sizes = []  # what each tick allowed a run's slice
        slice_bytes = server.slice_bytes
        server.slice_bytes = lambda: sizes.append(slice_bytes()) or sizes[-1]
        await server.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if page:
                    ws = await stack.enter_async_context(connect(f"ws://127.0.0.1:{server.port}/ws"))
                    await ws.recv()  # (hello: the client is registered)
                for p in paths:
                    p.parent.rename(logdir / p.parent.name)
                while len(server.runs) < 2:
                    await asyncio.sleep(0)
                sizes.clear()
                most = await _largest_slice(server, ["a", "b"])
                assert bool(server.sessions.clients) == page
            if page:
                assert 0 < most <= max(sizes) + 200  # (+ the partial line a slice ended in)
                assert min(sizes) >= POLL_MIN_BYTES and max(sizes) <= POLL_IDLE_MAX_BYTES
                assert server.pacer.seconds_per_byte is not None  # (the slices were timed)
            else:
                assert set(sizes) == {POLL_IDLE_MAX_BYTES}
                assert server.pacer.seconds_per_byte is None
                assert POLL_MAX_BYTES + 200 < most <= POLL_IDLE_MAX_BYTES + 200
            assert sum(r.offset for r in server.runs.values()) == sum(
                (logdir / n / "metrics.jsonl").stat().st_size for n in ("a", "b"))
        finally:
            await server.close()
    asyncio.run(main())


def test_a_given_poll_max_bytes_is_not_paced(logdir):
    """``poll_max_bytes`` given: the slices of a connected page's backlog are that size, whatever
    the pacer measured; by default (``None``) they are the pacer's."""
    logdir.mkdir()
    fixed = GradmonServer(logdir, port=0, poll_max_bytes=4096)
    paced = GradmonServer(logdir, port=0)
    for server in (fixed, paced):
        assert server.slice_bytes() == POLL_IDLE_MAX_BYTES  # (no client: the idle slices)
        server.sessions.clients.add(object())  # (a client connected, as far as slicing goes)
        server.pacer.note(64 << 10, 0.0002)  # (64 KiB in 0.2 ms: ~320 KiB a millisecond)
    assert fixed.slice_bytes() == 4096
    assert paced.slice_bytes() == paced.pacer.size() > POLL_MAX_BYTES


def test_logs_of_other_writers_are_served_as_step_records(logdir):
    """A hand-written callback's log (#11): no header, no `type`, Python's json.dumps (bare NaN,
    Infinity) — indexed as step records, and streamed as strict JSON with "type": "step"."""
    path = logdir / "theirs" / "metrics.jsonl"
    path.parent.mkdir(parents=True)

    def write(step, loss):
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "loss": loss, "lr": 1e-3, "throughput": 512.0}) + "\n")

    for i in range(1, 6):
        write(i, math.nan if i == 3 else 1.0 / i)
    with _server(logdir) as h:
        info = wait_for(lambda: get_json(h.port, "/api/runs/theirs")[1])
        assert info["last_step"] == 5 and info["malformed"] == 0
        assert info["fields"] == ["loss", "lr", "throughput"]
        _, hist = get_json(h.port, "/api/runs/theirs/history")
        assert hist["series"]["loss"] == {"step": [1, 2, 3, 4, 5], "value": [1.0, 0.5, "NaN", 0.25, 0.2]}
        assert hist["marks"] == [{"step": 3, "kind": "nonfinite", "field": "loss", "value": "NaN"}]

        async def main():
            async with connect(_ws_url(h)) as ws:
                follow = StreamFollower({"theirs": (await recv_json(ws))["runs"][0]["cursor"]})
                write(6, math.inf)
                while not follow.feed(_strict(await asyncio.wait_for(ws.recv(), DEADLINE_S))):
                    pass
                assert follow.records["theirs"] == [
                    {"type": "step", "step": 6, "loss": "Infinity", "lr": 0.001, "throughput": 512.0}]
        asyncio.run(main())


def _strict(text):
    """Parse as a browser does: a bare NaN/Infinity token is an error."""
    def refuse(token):
        raise AssertionError(f"bare {token} sent to a browser")
    return json.loads(text, parse_constant=refuse)

