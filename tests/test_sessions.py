"""Sessions alone, against a fake host (gradmon.server.served.SessionHost) and a fake connection:
no server, no socket. The fake connection hands the handler its messages one at a time, each
after the previous one's answers were sent, and records what the session sends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gradmon.server.runs import Run
from gradmon.server.sessions import Sessions
from tests.server_helpers import DEADLINE_S, make_run


class FakeHost:
    """The attributes of SessionHost over real, fully read Run objects."""

    def __init__(self, runs: dict[str, Run]) -> None:
        self.runs = runs
        self.poll_interval = 0.01
        self.client_queue_bytes = 1 << 20

    def run(self, name: str) -> Run | None:
        return self.runs.get(name)

    def run_infos(self) -> list[dict[str, Any]]:
        return [self.runs[n].info() for n in sorted(self.runs)]


class FakeConnection:
    """What Sessions.handler uses of a websockets connection."""

    def __init__(self, sessions: Sessions, messages: list[str | bytes], until: Any = None) -> None:
        self.sessions, self.messages, self.until = sessions, messages, until
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def _drained(self) -> None:
        while any(c.queued_bytes or c.tasks for c in self.sessions.clients):
            await asyncio.sleep(0.001)

    async def _incoming(self):
        await self._drained()  # hello first
        for message in self.messages:
            yield message
            await self._drained()
        if self.until is not None:
            while not self.until(self.sent):
                await asyncio.sleep(0.001)

    def __aiter__(self):
        return self._incoming()

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    async def wait_closed(self) -> None:
        return None


def _run(root: Path, name: str, steps: int) -> Run:
    run = Run(name, str(make_run(root, name, steps)))
    while run.poll()[2]:
        pass
    return run


def _session(host: FakeHost, messages: list[str | bytes], until: Any = None) -> FakeConnection:
    sessions = Sessions(host)  # type: ignore[arg-type]  # the fake has SessionHost's attributes
    conn = FakeConnection(sessions, messages, until)
    asyncio.run(asyncio.wait_for(sessions.handler(conn), DEADLINE_S))  # type: ignore[arg-type]
    assert not sessions.clients  # the session removed its client on return
    return conn


def test_hello_lists_the_hosts_runs_with_their_cursors(tmp_path: Path) -> None:
    host = FakeHost({"a": _run(tmp_path, "a", 3), "b": _run(tmp_path, "b", 4)})
    sent = _session(host, []).sent
    assert sent[0]["type"] == "hello"
    assert [r["name"] for r in sent[0]["runs"]] == ["a", "b"]
    assert sent[0]["runs"][1]["cursor"] == host.runs["b"].cursor()


def test_subscribe_from_a_cursor_catches_up_from_the_file(tmp_path: Path) -> None:
    host = FakeHost({"a": _run(tmp_path, "a", 20)})
    start = {"gen": host.runs["a"].gen, "offset": 0}
    msg = json.dumps({"type": "subscribe", "runs": {"a": start}})
    sent = _session(host, [msg], until=lambda sent: any(m["type"] == "records" for m in sent)).sent
    records = [r for m in sent if m["type"] == "records" for r in m["records"]]
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 21))
    assert sent[-1]["cursor"] == host.runs["a"].cursor()


def test_subscribe_with_null_streams_from_now_and_reads_nothing_back(tmp_path: Path) -> None:
    host = FakeHost({"a": _run(tmp_path, "a", 20)})
    sent = _session(host, [json.dumps({"type": "subscribe", "runs": {"a": None}})]).sent
    assert [m["type"] for m in sent] == ["hello"]


def test_unknown_runs_and_bad_cursors_get_one_error_naming_them(tmp_path: Path) -> None:
    host = FakeHost({"a": _run(tmp_path, "a", 2)})
    msg = json.dumps({"type": "subscribe", "runs": {"nope": None, "a": {"gen": 5}}})
    errors = [m["error"] for m in _session(host, [msg]).sent if m["type"] == "error"]
    assert len(errors) == 1
    assert "unknown runs (1): 'nope'" in errors[0] and "bad cursors" in errors[0] and "(1): 'a'" in errors[0]


def test_each_bad_message_gets_an_error_that_says_what_was_expected(tmp_path: Path) -> None:
    host = FakeHost({})
    bad = [b"\x00", "{not json", "[1, 2]", json.dumps({"type": "hello"}), json.dumps({"type": "subscribe"})]
    errors = [m["error"] for m in _session(host, bad).sent if m["type"] == "error"]
    assert len(errors) == 5
    assert "binary" in errors[0] and "not JSON" in errors[1] and "JSON object" in errors[2]
    assert "expected 'subscribe'" in errors[3] and "'runs'" in errors[4]


def test_a_client_that_keeps_sending_garbage_is_closed_with_1008(tmp_path: Path) -> None:
    conn = _session(FakeHost({}), ["garbage"] * 200)
    assert conn.closed is not None and conn.closed[0] == 1008
    assert sum(m["type"] == "error" for m in conn.sent) < 200  # bounded answers, then closed
