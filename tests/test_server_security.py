"""Bad requests get clear 4xx answers and never kill the server: traversal, unknown runs, bad
parameters, non-GET, foreign Origin/Host, missing token, garbage and oversize WS frames."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest
from server_helpers import (
    StreamFollower,
    append,
    get_json,
    make_run,
    recv_json,
    recv_until,
    request,
    step,
    wait_for,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from benchmarks.ws_clients import send_text_frame, stalled_client
from gradmon.server import start_server
from gradmon.server.app import resolve_token


@pytest.fixture
def served(tmp_path):
    logdir = tmp_path / "logs"
    make_run(logdir, "exp1", 10)
    (tmp_path / "secret.txt").write_text("top secret")
    static = tmp_path / "static"
    (static / "static").mkdir(parents=True)  # the built page's layout: index.html, assets in static/
    (static / "index.html").write_text("<!doctype html><title>page</title>")
    (static / "static" / "app.js").write_text("console.log(1)")
    (static / "static" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    with start_server(logdir, port=0, static_dir=static) as h:
        yield h


def _alive(h):
    status, body = get_json(h.port, "/api/runs")
    assert status == 200 and body["runs"][0]["name"] == "exp1"


@pytest.mark.parametrize("path", [
    "/static/../../secret.txt",
    "/static/%2e%2e/%2e%2e/secret.txt",
    "/static/..%2f..%2fsecret.txt",
    "/static//etc/passwd",
    "/static/%2Fetc%2Fpasswd",
    "/static/a%5c..%5csecret.txt",
    "/static/%00",
    "/static/%ff%fe",
    "/static/leak.txt",  # a symlink out of the static directory
    "/api/runs/..%2F..%2Fsecret.txt/history",
    "/api/runs/%2e%2e/history",
    "/api/runs/exp1/../../secret.txt",
    "/api/runs/nope/history",
    "/api/runs/nope",
    "/etc/passwd",
    "/../secret.txt",
    "/api/runs/exp1/history/extra",
])
def test_traversal_and_unknown_paths_are_refused(served, path):
    status, _headers, body = request(served.port, path)
    assert status in (400, 404), (path, status)
    assert b"top secret" not in body
    assert "error" in json.loads(body)
    _alive(served)


@pytest.mark.parametrize("query", [
    "points=abc", "points=1", "points=100001", "points=", "start=x", "end=1.5", "start=5&end=1",
])
def test_bad_history_parameters_are_400(served, query):
    status, body = get_json(served.port, "/api/runs/exp1/history?" + query)
    if query == "points=":  # empty means default
        assert status == 200
    else:
        assert status == 400 and "error" in body
    _alive(served)


def test_non_get_is_405_and_bodies_are_400(served):
    for method in ("POST", "PUT", "DELETE", "HEAD"):
        status, headers, _ = request(served.port, "/api/runs", method=method)
        assert status == 405 and headers["allow"] == "GET"
    with pytest.raises(http.client.RemoteDisconnected):  # the HTTP parser refuses request bodies
        request(served.port, "/api/runs", method="POST", body=b'{"x":1}')
    _alive(served)


def test_foreign_host_header_is_refused(served):
    status, _, body = request(served.port, "/api/runs", headers={"Host": "evil.example:80"})
    assert status == 403 and b"not this server" in body
    status, _, _ = request(served.port, "/api/runs", headers={"Host": f"localhost:{served.port}"})
    assert status == 200
    # a repeated Host header is ambiguous: refused, not guessed
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=15)
    conn.putrequest("GET", "/api/runs", skip_host=True)
    conn.putheader("Host", "127.0.0.1")
    conn.putheader("Host", "evil.example")
    conn.endheaders()
    assert conn.getresponse().status == 400
    conn.close()


def test_page_and_static_files(served, tmp_path):
    status, headers, body = request(served.port, "/")
    assert status == 200 and b"<title>page</title>" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    status, headers, body = request(served.port, "/static/app.js")
    assert status == 200 and body == b"console.log(1)" and "javascript" in headers["content-type"]


def test_missing_dashboard_gives_a_clear_page(tmp_path):
    with start_server(tmp_path, port=0, static_dir=tmp_path / "nothing") as h:
        status, headers, body = request(h.port, "/")
        assert status == 503 and b"make dashboard" in body and headers["content-type"].startswith("text/html")


def test_websocket_origin_check(served):
    async def main():
        with pytest.raises(InvalidStatus) as exc:
            async with connect(f"ws://127.0.0.1:{served.port}/ws", origin="http://evil.example"):
                pass
        assert exc.value.response.status_code == 403
        same = f"http://127.0.0.1:{served.port}"
        async with connect(f"ws://127.0.0.1:{served.port}/ws", origin=same) as ws:
            assert (await recv_json(ws))["type"] == "hello"
    asyncio.run(main())


def test_garbage_websocket_messages_get_errors_and_the_connection_stays(served):
    async def main():
        async with connect(f"ws://127.0.0.1:{served.port}/ws") as ws:
            hello = await recv_json(ws)
            cursor = hello["runs"][0]["cursor"]
            bad = [
                "garbage", "[1, 2]", '"str"', '{"type": "nope"}', '{"no": "type"}', b"\x00\x01binary",
                '{"type": "subscribe"}', '{"type": "subscribe", "runs": [1]}',
                '{"type": "subscribe", "runs": {"missing-run": null}}',
                '{"type": "subscribe", "runs": {"exp1": {"gen": 5, "offset": 0}}}',
                '{"type": "subscribe", "runs": {"exp1": {"gen": "g", "offset": -1}}}',
                '{"type": "subscribe", "runs": {"exp1": {"gen": "g", "offset": true}}}',
                '{"type": "subscribe", "runs": {"exp1": "x"}}',
            ]
            for msg in bad:
                await ws.send(msg)
                err = await recv_until(ws, lambda m: m["type"] == "error")
                assert isinstance(err["error"], str) and err["error"]
            # still subscribed and usable
            await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": cursor}}))
            await ws.send("garbage")
            assert (await recv_until(ws, lambda m: m["type"] == "error"))["type"] == "error"
    asyncio.run(main())
    _alive(served)


def test_oversize_frame_closes_only_that_connection(served):
    async def main():
        async with connect(f"ws://127.0.0.1:{served.port}/ws") as other:
            await recv_json(other)
            async with connect(f"ws://127.0.0.1:{served.port}/ws", max_size=None) as ws:
                await recv_json(ws)
                await ws.send("x" * (2 << 20))
                with pytest.raises(ConnectionClosed) as exc:
                    await asyncio.wait_for(ws.recv(), 15)
                assert exc.value.rcvd is not None and exc.value.rcvd.code == 1009
            await other.send("garbage")  # the other connection is unaffected
            assert (await recv_json(other))["type"] == "error"
    asyncio.run(main())
    _alive(served)


def test_token_is_required_when_set(tmp_path):
    logdir = tmp_path / "logs"
    make_run(logdir, "exp1", 2)
    static = tmp_path / "static"
    (static / "static").mkdir(parents=True)
    (static / "index.html").write_text("page")
    (static / "static" / "app.js").write_text("js")
    with start_server(logdir, port=0, token="s3cret", static_dir=static) as h:
        assert h.url.endswith("/?token=s3cret")
        port = h.port
        assert request(port, "/api/runs")[0] == 403
        assert request(port, "/api/runs?token=wrong")[0] == 403
        assert request(port, "/")[0] == 403
        assert request(port, "/static/app.js")[0] == 403
        assert request(port, "/api/runs?token=s3cret")[0] == 200
        assert request(port, "/api/runs", headers={"Authorization": "token s3cret"})[0] == 200
        status, headers, _ = request(port, "/?token=s3cret")
        assert status == 200
        cookie = headers["set-cookie"].split(";")[0]
        assert cookie == f"gradmon-token-{port}=s3cret" and "HttpOnly" in headers["set-cookie"]
        assert request(port, "/static/app.js", headers={"Cookie": cookie})[0] == 200
        assert request(port, "/static/app.js", headers={"Cookie": f"gradmon-token-{port}=no"})[0] == 403

        async def main():
            with pytest.raises(InvalidStatus) as exc:
                async with connect(f"ws://127.0.0.1:{port}/ws"):
                    pass
            assert exc.value.response.status_code == 403
            async with connect(f"ws://127.0.0.1:{port}/ws?token=s3cret") as ws:
                assert (await recv_json(ws))["type"] == "hello"
        asyncio.run(main())


def test_non_loopback_bind_always_gets_a_token():
    assert resolve_token("127.0.0.1", None) is None
    assert resolve_token("localhost", None) is None
    t = resolve_token("0.0.0.0", None)
    assert isinstance(t, str) and len(t) >= 24
    assert resolve_token("0.0.0.0", None) != t
    assert resolve_token("10.1.2.3", "mine") == "mine"
    with pytest.raises(ValueError):
        resolve_token("127.0.0.1", "")


def _fuzz_targets() -> list[bytes]:
    """Request targets a fuzzer sends: NUL, overlong, unicode (encoded and raw), repeated keys,
    too many fields, broken escapes, netloc-like paths, on every route."""
    many = "&".join(f"a{i}=1" for i in range(51))
    queries = ["", "?%00", "?%00=%00", "?points=%00", "?points=1&points=2&points=3", "?" + many,
               "?" + "&".join("points=5" for _ in range(60)), "?start=1_000", "?start=%D9%A3",
               "?end=" + "9" * 5000, "?points=1e3", "?points=+5", "?=", "?&&&", "?token", "?%", "?%zz=1",
               "?a=%ff%fe", "?" + "x" * 8000]
    paths = ["/", "/index.html", "/api/runs", "/api/runs/exp1", "/api/runs/exp1/history", "/static/app.js",
             "/ws", "/api/runs/%00", "/api/runs/%C3%A9/history", "/api/runs/%ff", "/static/%", "//[",
             "//[x/api/runs", "//evil.example/api/runs", "/api/runs/exp1%2Fhistory", "/%2e%2e/%2e%2e",
             "/api/runs/" + "a" * 8100, "/static/" + "%2e%2e/" * 50 + "etc/passwd"]
    out = [(p + q).encode() for p in paths for q in queries]
    out += [b"/api/runs/\xc3\xa9", b"/api/runs?x=\xff", b"/api/ runs", b"/api/runs\t", b"*",
            b"http://127.0.0.1/api/runs", b"/api/runs#frag", b"/" + b"a" * 9000]
    return out


def _raw_status(port: int, target: bytes) -> int | None:
    """Send ``GET target`` with these exact bytes; the response status, or None when the HTTP
    parser closed the connection without an answer (not HTTP: raw non-ASCII bytes, a space)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return None
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_url_fuzz_gets_4xx_and_never_a_traceback(served, caplog):
    import logging
    caplog.set_level(logging.WARNING)
    statuses = {}
    for target in _fuzz_targets():
        statuses[target] = _raw_status(served.port, target)
    bad = {t[:80]: s for t, s in statuses.items() if s is not None and not (s == 200 or 400 <= s < 500)}
    assert not bad, bad
    closed = [t for t, s in statuses.items() if s is None]
    assert all(not t.isascii() or b" " in t or b"\t" in t for t in closed), closed  # only non-HTTP
    assert statuses[b"/api/runs?" + "&".join(f"a{i}=1" for i in range(51)).encode()] == 400
    assert statuses[b"//["] == 400 and statuses[b"/api/runs/exp1/history?start=1_000"] == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage()[:200] for r in caplog.records][:5]
    _alive(served)


def _unknown_runs(n: int, **more) -> str:
    """A ``subscribe`` naming ``n`` runs that do not exist (the issue's frame: 16,000 runs, ~245 KB)."""
    return json.dumps({"type": "subscribe", "runs": {**{f"n{i}": None for i in range(n)}, **more}})


def test_a_cursor_past_any_file_offset_is_a_bad_cursor_and_the_stream_goes_on(served):
    """An offset of 2^70 (no file has one: off_t is 64-bit) is answered as a bad cursor. It was
    taken as a position to catch up from, whose seek raised in the catch-up task: the client got
    no error and nothing more of that run."""
    async def main():
        async with connect(f"ws://127.0.0.1:{served.port}/ws") as ws:
            cursor = (await recv_json(ws))["runs"][0]["cursor"]
            far = {**cursor, "offset": 2**70}
            await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": far}}))
            error = await recv_until(ws, lambda m: m["type"] == "error")
            assert "bad cursors" in error["error"] and "'exp1'" in error["error"]
            await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": cursor}}))
            follow = StreamFollower({"exp1": cursor})
            append(_path(served, "exp1"), [step(11)])
            await recv_until(ws, lambda m: follow.feed(m) and 11 in follow.steps("exp1"))
    asyncio.run(main())
    _alive(served)


def test_one_bad_subscribe_gets_one_bounded_error(served):
    async def main():
        async with connect(f"ws://127.0.0.1:{served.port}/ws") as ws:
            cursor = (await recv_json(ws))["runs"][0]["cursor"]
            await ws.send(_unknown_runs(16_000, exp1=None))  # more runs than a server ever lists
            await ws.send(_unknown_runs(1_999, exp1=None))
            await ws.send(json.dumps({"type": "subscribe", "runs": {"exp1": {"gen": 1}, "other": None}}))
            await ws.send('{"type": "marker"}')
            seen = []
            await recv_until(ws, lambda m: m["type"] == "error" and "marker" in m["error"], seen=seen)
            errors = [m["error"] for m in seen if m["type"] == "error"]
            assert len(errors) == 4, errors[:5]  # one per bad message, not one per unknown run
            assert "names 16001 runs; at most 2000" in errors[0]
            assert "unknown runs (1999): 'n0', 'n1'" in errors[1] and "and 1994 more" in errors[1]
            assert max(map(len, errors)) <= 1000
            assert "unknown runs (1): 'other'" in errors[2] and "bad cursors" in errors[2]
            # exp1 (named beside the unknown runs) was applied: it streams from now on
            follow = StreamFollower({"exp1": cursor})
            append(_path(served, "exp1"), [step(11)])
            await recv_until(ws, lambda m: follow.feed(m) and 11 in follow.steps("exp1"))
    asyncio.run(main())
    _alive(served)


def _path(h, name):
    from pathlib import Path
    return Path(h.server.runs[name].path)


def test_a_client_that_keeps_sending_garbage_is_closed(served):
    async def main():
        async with connect(f"ws://127.0.0.1:{served.port}/ws") as ws:
            await recv_json(ws)
            with pytest.raises(ConnectionClosed) as exc:
                for _ in range(200):
                    await ws.send("garbage")
                while True:
                    await recv_json(ws)
            assert exc.value.rcvd is not None and exc.value.rcvd.code == 1008
    asyncio.run(main())
    wait_for(lambda: served.stats()["dropped"] == 1 and served.stats()["clients"] == 0)
    _alive(served)


def test_a_stalled_client_flooding_bad_subscribes_stays_bounded_and_is_dropped(tmp_path):
    """The issue's abuse: a client with a 4 KiB receive buffer that never reads sends 60 frames of
    245 KB, each naming 16,000 unknown runs. Its queue never exceeds its budget, it is dropped,
    and a healthy client keeps receiving every record."""
    logdir = tmp_path / "logs"
    path = make_run(logdir, "exp1", 3)
    budget = 1 << 20
    with start_server(logdir, port=0, client_queue_bytes=budget) as h:
        async def main():
            async with connect(f"ws://127.0.0.1:{h.port}/ws") as healthy:
                info = (await recv_json(healthy))["runs"][0]
                follow = StreamFollower({"exp1": info["cursor"]})
                bad = stalled_client(h.port)
                frame = _unknown_runs(16_000)
                assert len(frame) > 240_000
                peak = 0
                last = 3
                try:
                    for _ in range(60):
                        try:
                            await asyncio.to_thread(send_text_frame, bad, frame)
                        except OSError:  # dropped: the server closed the connection
                            break
                        last += 1
                        append(path, [step(last)])
                        peak = max(peak, h.stats()["max_queued_bytes"])
                    wait_for(lambda: h.stats()["dropped"] == 1 and h.stats()["clients"] == 1)
                    await recv_until(healthy, lambda m: follow.feed(m) and last in follow.steps("exp1"))
                finally:
                    bad.close()
                assert peak <= budget + 1000
                assert follow.steps("exp1") == list(range(4, last + 1))
        asyncio.run(main())
