"""Webhook alerts (gradmon/server/alerts.py): messages, the per-run watch, and the sender against a
real local HTTP receiver (one that answers, one that returns 500, one that hangs)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from operator import attrgetter
from typing import Any

import pytest
from server_helpers import DEADLINE_S, lines_of

from gradmon.server.alerts import (
    Alert,
    AlertSender,
    RateLimiter,
    RunWatch,
    check_url,
    combine,
    payload,
    run_link,
)
from gradmon.server.derived import splice
from gradmon.server.index import RunIndex


class Receiver:
    """A webhook on 127.0.0.1: records every POST body; ``mode`` is "ok" (200), "fail" (500) or
    "hang" (holds the request until ``release()``)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.bodies: list[Any] = []
        self.attempts = 0
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.attempts += 1
                if receiver.mode == "hang":
                    receiver._release.wait(DEADLINE_S)
                if receiver.mode == "fail":
                    self.send_response(500)
                else:
                    receiver.bodies.append(json.loads(body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?key=secret"

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch):
    # The sender honours the proxy environment (httpx): a proxy set where the tests run must not
    # carry posts meant for 127.0.0.1 (test_alerts_proxy.py sets its own).
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    made: list[Receiver] = []

    def make(mode: str = "ok") -> Receiver:
        made.append(Receiver(mode))
        return made[-1]

    yield make
    for r in made:
        r.close()


def alert(run: str = "exp1", step: int = 7, **kw: Any) -> Alert:
    fields = {"kind": "alarm", "reason": "nonfinite", "value": math.nan, "message": "non-finite loss (nan)",
              "link": None, **kw}
    return Alert(run, step=step, **fields)


def steps_records(n: int, start: int = 1, ts: float | None = None, **kw: Any) -> list[dict]:
    ts0 = time.time() if ts is None else ts
    return [{"type": "step", "step": i, "ts": ts0 + i, "loss": 1.0, "grad_norm": 1.0 + 0.1 * (i % 3), **kw}
            for i in range(start, start + n)]


# ------------------------------------------------------------------------------ messages


def test_payload_shapes_for_each_format():
    a = alert(link="http://127.0.0.1:8686/?run=exp1")
    assert set(payload("slack", [a])) == {"text"}
    text = payload("slack", [a])["text"]
    assert "exp1" in text and "step 7" in text and "nonfinite" in text and "?run=exp1" in text
    assert payload("feishu", [a]) == {"msg_type": "text", "content": {"text": text}}
    assert payload("dingtalk", [a]) == {"msgtype": "text", "text": {"content": text}}
    body = payload("json", [a])
    assert body["alerts"][0] == {"run": "exp1", "kind": "alarm", "step": 7, "reason": "nonfinite",
                                 "value": "nan", "message": "non-finite loss (nan)",
                                 "link": "http://127.0.0.1:8686/?run=exp1"}
    for fmt in ("slack", "feishu", "dingtalk", "json"):
        json.dumps(payload(fmt, [a]), allow_nan=False)  # strict JSON: NaN is text
    with pytest.raises(ValueError, match="alert format"):
        payload("teams", [a])


def test_abort_text_and_merged_messages():
    abort = alert(kind="abort", reason="abort", value=None, message="10 consecutive bad steps")
    assert "run exp1 aborted at step 7: 10 consecutive bad steps" in combine([abort])
    many = [alert(step=i) for i in range(15)]
    text = combine(many, dropped=3)
    assert text.startswith("[gradmon] 15 alerts:") and "... and 5 more" in text
    assert "3 more alerts were dropped" in text and text.count("step ") == 10


def test_links_and_urls():
    assert run_link("http://h:1/", "sweep/lr 3") == "http://h:1/?run=sweep%2Flr%203"
    assert run_link("http://h:1/?token=t", "a") == "http://h:1/?token=t&run=a"
    assert run_link(None, "a") is None
    assert check_url("https://hooks.example.com/x") == "https://hooks.example.com/x"
    for bad in ("ftp://x/y", "hooks.example.com/x", "http:///nohost"):
        with pytest.raises(ValueError, match="http"):
            check_url(bad)


def test_rate_limiter_bursts_then_spaces_messages():
    limiter = RateLimiter(per_minute=6, burst=2)
    assert limiter.wait_time(100.0) == 0.0
    limiter.take(100.0)
    limiter.take(100.0)
    assert limiter.wait_time(100.0) == pytest.approx(10.0)
    assert limiter.wait_time(105.0) == pytest.approx(5.0)
    assert limiter.wait_time(130.0) == 0.0
    with pytest.raises(ValueError):
        RateLimiter(0, 1)


# ------------------------------------------------------------------------------ run watch


def ingested(records: list[dict]) -> list[dict]:
    """The records as the server hands them to the sender: through a run's index, with the alarm
    events its ingest derived spliced in at their places."""
    idx = RunIndex()
    pairs = lines_of(records)
    parsed = idx.add_lines(pairs, 0)
    return splice(parsed.records, parsed.offsets, idx.derived.between(0, pairs[-1][0]), attrgetter("event"))


def test_watch_alerts_the_alarms_the_server_derived_for_logs_without_the_rule():
    watch = RunWatch("exp1", link="L")
    records = ingested([{"type": "header", "schema": 1}, *steps_records(30),
                        {"type": "step", "step": 31, "loss": math.nan, "grad_norm": math.nan},
                        {"type": "step", "step": 32, "loss": math.nan, "grad_norm": 1.0}])
    assert [r["kind"] for r in records if r["type"] == "event"] == ["alarm"]  # one incident, one alarm
    out = [a for r in records for a in watch.observe(r, True)]
    [a] = out
    assert (a.run, a.kind, a.step, a.reason, a.link) == ("exp1", "alarm", 31, "nonfinite", "L")
    # an alarm event written into such a segment (not by the rule's writer) is not a second alert
    assert watch.observe({"type": "event", "kind": "alarm", "step": 31, "reason": "nonfinite"}, True) == []


def test_watch_trusts_a_writer_that_logs_alarms():
    watch = RunWatch("exp1")
    watch.observe({"type": "header", "schema": 1, "alarm_rule": {"window": 200}}, True)
    assert watch.observe({"type": "step", "step": 1, "loss": math.nan}, True) == []  # the writer judges
    alarm = {"type": "event", "kind": "alarm", "step": 5, "reason": "grad_norm_spike", "value": 40.0,
             "baseline": 1.0, "message": "gradient norm 40 is 40x its running median 1"}
    [a] = watch.observe(alarm, True)
    assert (a.step, a.reason, a.value) == (5, "grad_norm_spike", 40.0)
    assert watch.observe({**alarm, "source": "server"}, True) == []  # never derived for such a segment
    assert watch.observe({**alarm, "reason": "abort"}, True) == []  # the abort event itself alerts
    [b] = watch.observe({"type": "event", "kind": "abort", "step": 9, "message": "stopped"}, True)
    assert (b.kind, b.step, b.message) == ("abort", 9, "stopped")
    assert watch.observe({"type": "event", "kind": "spike", "step": 9}, True) == []  # detector flags: no


def test_watch_history_is_not_news():
    watch = RunWatch("exp1")
    written = steps_records(100)
    written[30]["grad_norm"] = 500.0  # an old incident, closed before step 101
    history = ingested(written)
    assert [r["step"] for r in history if r.get("kind") == "alarm"] == [31]
    assert all(watch.observe(r, False) == [] for r in history)
    # a spike right after the history, judged by the server against the run's whole baseline
    spike = {"type": "step", "step": 101, "loss": 1.0, "grad_norm": 60.0}
    [new] = [r for r in ingested([*written, spike]) if r.get("kind") == "alarm" and r["step"] == 101]
    [a] = watch.observe(new, True)
    assert a.reason == "grad_norm_spike" and a.step == 101


# ------------------------------------------------------------------------------ the sender


async def _until(cond, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met before the deadline")
        await asyncio.sleep(0.01)


def _foreign_log_with_nan(start: int = 1, n: int = 30) -> list[dict]:
    records = [{"type": "header", "schema": 1}, *steps_records(n, start)]
    bad = {"type": "step", "step": start + n, "ts": time.time(), "loss": math.nan, "grad_norm": 1.0}
    return ingested([*records, bad])


def test_sender_posts_one_message_per_alarm(receiver):
    hook = receiver("ok")

    async def main():
        sender = AlertSender(hook.url, fmt="json", link="http://dash/")
        sender.feed("exp1", _foreign_log_with_nan())  # before start: queued
        sender.start()
        await _until(lambda: len(hook.bodies) == 1)
        abort = {"type": "event", "kind": "abort", "step": 31, "ts": time.time(), "message": "m"}
        sender.feed("exp1", [abort])
        # The receiver records a body before it answers: wait for the sender to read the answer too.
        await _until(lambda: len(hook.bodies) == 2 and sender.stats()["sent"] == 2)
        await sender.close()
        return sender.stats()

    stats = asyncio.run(main())
    first, second = hook.bodies
    assert first["alerts"][0]["run"] == "exp1" and first["alerts"][0]["step"] == 31
    assert first["alerts"][0]["link"] == "http://dash/?run=exp1"
    assert second["alerts"][0]["kind"] == "abort"
    assert stats["sent"] == 2 and stats["failed"] == 0 and stats["messages"] == 2


def test_sender_merges_alerts_the_rate_limit_holds_back(receiver):
    hook = receiver("ok")

    async def main():
        sender = AlertSender(hook.url, per_minute=120, burst=1)  # then one message per 0.5 s
        sender.start()
        sender.feed("a", [{"type": "event", "kind": "abort", "step": 1, "ts": time.time()}])
        await _until(lambda: len(hook.bodies) == 1)
        for run in ("b", "c"):
            sender.feed(run, [{"type": "event", "kind": "abort", "step": 2, "ts": time.time()}])
        await _until(lambda: len(hook.bodies) == 2)
        await sender.close()

    asyncio.run(main())
    merged = hook.bodies[1]["text"]
    assert merged.startswith("[gradmon] 2 alerts:") and "run b" in merged and "run c" in merged


def test_sender_retries_a_500_then_gives_up_and_goes_on(receiver):
    hook = receiver("fail")

    async def main():
        sender = AlertSender(hook.url, retries=1, retry_delay=0.01, per_minute=6000, burst=5)
        sender.start()
        sender.feed("exp1", [{"type": "event", "kind": "abort", "step": 1, "ts": time.time()}])
        await _until(lambda: sender.stats()["failed"] == 1)
        assert hook.attempts == 2  # the first try and one retry
        hook.mode = "ok"
        sender.feed("exp2", [{"type": "event", "kind": "abort", "step": 1, "ts": time.time()}])
        await _until(lambda: sender.stats()["sent"] == 1)
        await sender.close()

    asyncio.run(main())
    assert "exp2" in hook.bodies[0]["text"]


def test_a_hanging_receiver_times_out_and_never_blocks_the_loop(receiver):
    hook = receiver("hang")

    async def main():
        sender = AlertSender(hook.url, timeout=0.5, retries=0)
        sender.start()
        sender.feed("exp1", [{"type": "event", "kind": "abort", "step": 1, "ts": time.time()}])
        ticks = 0
        while sender.stats()["failed"] == 0:  # the loop keeps running while the post hangs
            ticks += 1
            await asyncio.sleep(0.01)
            assert ticks < DEADLINE_S / 0.01, "the post never timed out"
        await sender.close()
        return ticks

    ticks = asyncio.run(main())
    assert hook.attempts == 1 and hook.bodies == [] and ticks >= 5


def test_a_full_queue_drops_and_says_so(receiver):
    hook = receiver("ok")

    async def main():
        sender = AlertSender(hook.url, queue_size=2)
        for i in range(5):
            sender.feed(f"run{i}", [{"type": "event", "kind": "abort", "step": 1, "ts": time.time()}])
        assert sender.stats()["dropped"] == 3 and sender.stats()["queued"] == 2
        sender.start()
        await _until(lambda: len(hook.bodies) == 1)
        await sender.close()

    asyncio.run(main())
    assert "3 more alerts were dropped" in hook.bodies[0]["text"]


def test_feed_survives_bad_records(receiver):
    sender = AlertSender(receiver("ok").url)
    sender.feed("exp1", [{"type": "step", "step": 1, "loss": "oops"}, {"no": "type"}, {"type": "step"}])
    sender.feed("exp1", None)  # type: ignore[arg-type]  # not even a list: logged, not raised
    assert sender.stats()["alerts"] == 0


def test_sender_rejects_bad_settings():
    with pytest.raises(ValueError):
        AlertSender("file:///etc/passwd")
    with pytest.raises(ValueError):
        AlertSender("http://127.0.0.1:1/", fmt="xml")
