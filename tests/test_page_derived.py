"""Chromium: the banner shows the alarms the server derived for a log written by another tool
(no header, step records without ``type``, Python's bare ``NaN``), from the history and live, each
incident once — also after a reconnect (the page resubscribes) and a reload (issue #10)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.page_browser import Page, browser, logdir, page, start_server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "logdir", "page"]  # fixtures imported for pytest

T0 = 1_764_486_000.0


def foreign(path: Path, first: int, last: int, spike: int = -1, nan: int = -1) -> None:
    """Lines as a hand-written callback writes them: ``json.dumps`` of a dict without ``type``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for s in range(first, last + 1):
            rec = {"step": s, "ts": T0 + s, "loss": 2.0 * math.exp(-s / 300) + 0.3, "lr": 1e-3,
                   "grad_norm": 1.0 + 0.1 * math.sin(s)}
            if s == spike:
                rec["grad_norm"] = 80.0
            if s == nan:
                rec["loss"] = math.nan
            f.write(json.dumps(rec) + "\n")


INCIDENTS = "window.gradmon.incidents().map(i => [i.reason, i.start, i.ongoing])"


def test_banner_shows_the_derived_alarms_of_a_foreign_log_once(logdir: Path, page: Page) -> None:
    log = logdir / "other" / "metrics.jsonl"
    foreign(log, 1, 200, spike=120)
    server = start_server(logdir, "127.0.0.1", port=0)
    try:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.lastStep('other') === 200")
        page.wait("window.gradmon.state.connection === 'connected'")
        # From the history: the server's alarm, closed 50 quiet steps later.
        page.wait("window.gradmon.incidents().length === 1")
        assert page.eval(INCIDENTS) == [["grad_norm_spike", 120, False]]
        line = page.page.locator("#banner button.incident")
        assert "gradient-norm spike · step 120 · 1 flagged step" in line.inner_text()
        # Live: a NaN loss while the page follows the run; the banner gets one line for it.
        foreign(log, 201, 230, nan=210)
        page.wait("window.gradmon.lastStep('other') === 230")
        page.wait("window.gradmon.incidents().length === 2")
        assert page.eval(INCIDENTS) == [["grad_norm_spike", 120, False], ["nonfinite", 210, True]]
        assert page.page.locator("#banner button.incident").count() == 2
        # The server restarts; the page reconnects and resubscribes from its cursor: nothing doubles.
        port = server.port
        server.stop()
        page.wait("window.gradmon.state.connection === 'reconnecting'")
        foreign(log, 231, 270)  # the incident of step 210 closes at 261
        server = start_server(logdir, "127.0.0.1", port=port)
        page.wait("window.gradmon.lastStep('other') === 270", timeout=30)
        page.wait("window.gradmon.incidents().length === 2 && !window.gradmon.incidents()[1].ongoing")
        assert page.eval(INCIDENTS) == [["grad_norm_spike", 120, False], ["nonfinite", 210, False]]
        # A reload (the history again): the same two incidents.
        page.page.reload()
        page.wait("window.gradmon && window.gradmon.lastStep('other') === 270")
        page.wait("window.gradmon.incidents().length === 2")
        assert page.eval(INCIDENTS) == [["grad_norm_spike", 120, False], ["nonfinite", 210, False]]
        assert page.page.locator("#banner button.incident").count() == 2
    finally:
        server.stop()
    refused = ("ERR_CONNECTION_REFUSED", "WebSocket connection")  # the browser's reports of the restart
    assert [e for e in page.errors if not any(r in e for r in refused)] == []
