"""HttpRoutes alone, against a fake host (gradmon.server.served.RouteHost): no server, no socket.

Each test builds a request as websockets hands it to ``process_request`` and checks the answer:
access rules, routes, the page and static files, run entries and history answered through the
host's workers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request

from gradmon.server.routes import HttpRoutes
from gradmon.server.runs import Run
from tests.server_helpers import make_run


class InlineWorkers:
    """Runs the history job in the caller, counting calls (the real pool uses a child process)."""

    def __init__(self) -> None:
        self.calls = 0

    def call(self, fn: Callable[..., Any], *args: Any, early: bool = False) -> Any:
        self.calls += 1
        return fn(*args)


class FakeHost:
    """The attributes of RouteHost, over real Run objects read to their end."""

    def __init__(self, runs: dict[str, Run], token: str | None = None) -> None:
        self.host, self.port, self.token = "127.0.0.1", 8765, token
        self.workers = InlineWorkers()
        self._runs = runs

    def run(self, name: str) -> Run | None:
        return self._runs.get(name)

    def run_infos(self) -> list[dict[str, Any]]:
        return [self._runs[n].info() for n in sorted(self._runs)]


def _indexed_run(root: Path, name: str, steps: int) -> Run:
    path = make_run(root, name, steps)
    run = Run(name, str(path))
    while run.poll()[2]:
        pass
    return run


def _get(routes: HttpRoutes, target: str, host: str = "127.0.0.1:8765", method: str = "GET",
         **headers: str) -> tuple[int, bytes, Headers]:
    request = Request(target, Headers({"Host": host, **headers}))
    if method != "GET":
        request.method = method  # websockets' Request has no method field; routes read it if present
    response = asyncio.run(routes.process_request(None, request))  # type: ignore[arg-type]
    if response is None:
        return 0, b"", Headers()
    return response.status_code, response.body, response.headers


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost({"exp1": _indexed_run(tmp_path / "logs", "exp1", 50)})


@pytest.fixture
def static_dir(tmp_path: Path) -> Path:
    (tmp_path / "static" / "static").mkdir(parents=True)
    (tmp_path / "static" / "index.html").write_text("<!doctype html><title>page</title>")
    (tmp_path / "static" / "static" / "app.js").write_text("export {};")
    (tmp_path / "secret.txt").write_text("outside the static root")
    return tmp_path / "static"


def test_run_list_and_entry_come_from_the_host(host: FakeHost, static_dir: Path) -> None:
    routes = HttpRoutes(host, static_dir)
    status, body, _ = _get(routes, "/api/runs")
    assert status == 200
    runs = json.loads(body)["runs"]
    assert [r["name"] for r in runs] == ["exp1"]
    status, body, _ = _get(routes, "/api/runs/exp1")
    assert status == 200 and json.loads(body)["name"] == "exp1"
    assert _get(routes, "/api/runs/nope")[0] == 404


def test_history_is_answered_through_the_hosts_workers(host: FakeHost, static_dir: Path) -> None:
    routes = HttpRoutes(host, static_dir)
    status, body, _ = _get(routes, "/api/runs/exp1/history?points=1000")
    assert status == 200
    answer = json.loads(body)
    assert answer["series"]["loss"]["step"] == list(range(1, 51))  # every step: 50 < points
    assert host.workers.calls == 1


def test_page_static_files_and_nothing_outside_the_static_root(host: FakeHost, static_dir: Path) -> None:
    routes = HttpRoutes(host, static_dir)
    status, body, headers = _get(routes, "/")
    assert status == 200 and b"<title>page</title>" in body and "Content-Security-Policy" in headers
    assert _get(routes, "/static/app.js")[:2] == (200, b"export {};")
    assert _get(routes, "/static/../secret.txt")[0] in (400, 404)
    assert _get(routes, "/static/%2e%2e/secret.txt")[0] in (400, 404)


def test_missing_page_is_a_503_that_says_how_to_build_it(host: FakeHost, tmp_path: Path) -> None:
    status, body, _ = _get(HttpRoutes(host, tmp_path / "none"), "/")
    assert status == 503 and b"make dashboard" in body


def test_access_rules_without_and_with_a_token(tmp_path: Path, static_dir: Path) -> None:
    runs = {"exp1": _indexed_run(tmp_path / "logs", "exp1", 5)}
    open_routes = HttpRoutes(FakeHost(runs), static_dir)
    status, body, _ = _get(open_routes, "/api/runs", host="evil.example:8765")
    assert status == 403 and b"127.0.0.1:8765" in body  # names the address to use
    assert _get(open_routes, "/api/runs", method="POST")[0] == 405

    routes = HttpRoutes(FakeHost(runs, token="s3cret"), static_dir)
    status, body, _ = _get(routes, "/api/runs", host="10.0.0.5:8765")
    assert status == 403 and b"token" in body
    status, _, headers = _get(routes, "/?token=s3cret", host="10.0.0.5:8765")
    assert status == 200 and "HttpOnly" in headers["Set-Cookie"]
    assert _get(routes, "/api/runs", host="10.0.0.5:8765", Authorization="Bearer s3cret")[0] == 200


def test_websocket_upgrade_passes_only_from_the_same_origin(host: FakeHost, static_dir: Path) -> None:
    routes = HttpRoutes(host, static_dir)
    assert _get(routes, "/ws", Origin="http://127.0.0.1:8765")[0] == 0  # None: the handshake proceeds
    assert _get(routes, "/ws", Origin="http://evil.example")[0] == 403


def test_a_failing_host_is_a_500_without_details(tmp_path: Path, static_dir: Path) -> None:
    class BrokenHost(FakeHost):
        def run_infos(self) -> list[dict[str, Any]]:
            raise RuntimeError("boom: a secret path /root/x")

    status, body, _ = _get(HttpRoutes(BrokenHost({}), static_dir), "/api/runs")
    assert status == 500 and b"boom" not in body
