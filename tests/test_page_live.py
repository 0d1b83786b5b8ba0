"""Browser end-to-end tests of the page against a live `gradmon serve`: history then live records,
zoom at full resolution, reconnects and resets, a resumed run rolled back while followed, alarms and
their notifications, system metrics and the layers table.

Real parts only: the server from ``gradmon.server.app.start_server`` on a temporary log root, run
logs appended line by line with the shared codec while the page is open, and Debian's Chromium
driven by Playwright. The page exposes its state on ``window.gradmon``; assertions wait on
conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.page_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    T0,
    Page,
    append,
    browser,
    header,
    logdir,
    page,
    start_server,
    step,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]
# fixtures imported for pytest, and the names tests/browser_helpers.py takes from this module
__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "Page", "browser", "logdir", "page"]


def alarm(s: int, reason: str, value: object, **extra: object) -> dict:
    return {"type": "event", "kind": "alarm", "step": s, "ts": T0 + 0.1 * s, "reason": reason,
            "field": "grad_norm", "value": value, "baseline": 1.0, "message": f"{reason} at {s}", **extra}


def alarm_end(s: int, start: int, flagged: int) -> dict:
    return {"type": "event", "kind": "alarm_end", "step": s, "ts": T0 + 0.1 * s, "start": start,
            "flagged": flagged, "message": "closed"}


def test_history_then_live_points_marks_and_alarm_banner(logdir: Path, page: Page) -> None:
    log = logdir / "exp001" / "metrics.jsonl"
    nan_step = step(31, loss="NaN", grad_norm="Infinity", nonfinite=True, skipped=True)
    append(log, [header(max_norm=2.0)] + [step(s) for s in range(1, 31)]
           + [nan_step, alarm(31, "nonfinite", "Infinity")] + [step(s) for s in range(32, 41)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('exp001', 'loss') === 40")
        assert page.eval("window.gradmon.selected()") == ["exp001"]
        page.wait("window.gradmon.state.connection === 'connected'")
        assert page.page.locator("#conn").inner_text() == "live"
        panels = page.wait("window.gradmon.panels().length >= 5 && window.gradmon.panels()")
        assert panels[:2] == ["loss", "grad_norm"]
        assert {"lr", "throughput", "step_time"} <= set(panels)
        assert page.eval("window.gradmon.sections()") == ["train", "system"]
        # The NaN/Infinity step is a red marker on both charts, not a gap or a drop.
        loss_marks = page.wait("window.gradmon.markers('loss').filter(m => m.role === 'nonfinite')")
        assert [(m["step"], m["label"]) for m in loss_marks] == [(31, "NaN")]
        norm_marks = page.eval("window.gradmon.markers('grad_norm').filter(m => m.role === 'nonfinite')")
        assert [(m["step"], m["label"]) for m in norm_marks] == [(31, "Infinity")]
        # The banner shows the writer's alarm: one line, ongoing (no end yet); the skip flag is a mark only.
        line = page.page.locator("#banner button.incident")
        page.wait("document.querySelectorAll('#banner button.incident').length === 1")
        assert "non-finite value · since step 31 · ongoing" in line.inner_text()
        assert page.eval("window.gradmon.marks('exp001', 'skip')") == [31]  # drawn as the step's triangle

        # Live: records appended while the page is open stream in; the incident closes.
        append(log, [alarm_end(31, 31, 1)])
        for lo in (41, 51, 61):
            batch = [step(s) for s in range(lo, lo + 10)]
            if lo == 61:
                batch[4] = step(65, grad_norm=40.0, spike=True, zscore=9.5)  # a detector flag, no alarm
            append(log, batch)
            page.wait(f"window.gradmon.pointCount('exp001', 'grad_norm') === {lo + 9}")
        assert page.eval("window.gradmon.lastStep('exp001')") == 70
        steps = page.eval("window.gradmon.state.runs.get('exp001').series.get('loss').steps")
        assert steps == list(range(1, 71))  # no duplicate and no gap between history and live
        assert page.eval("window.gradmon.state.liveRecords") >= 30
        page.wait("document.querySelector('#banner button.incident').textContent.includes('1 flagged step')")
        assert "ongoing" not in line.inner_text()

        # The detector's spike: a red ring on the grad-norm chart, no banner line (it is not an alarm).
        page.wait("window.gradmon.markers('grad_norm').some(m => m.role === 'spike' && m.step === 65)")
        assert page.eval("window.gradmon.spikes()") == [{"run": "exp001", "step": 65, "value": 40}]
        assert page.page.locator("#banner button.incident").count() == 1
        assert page.eval("""window.gradmon.board.panels.get('grad_norm').series
                             .find(s => s.id === 'exp001|grad_norm|raw').markLine.data[0].yAxis""") == 2.0
        row = page.page.locator("#runs-table tr[data-run='exp001']")
        assert "live" in row.inner_text()
        assert page.page.locator(".chart-card canvas").count() >= len(panels)

        # Clicking the incident zooms every chart around step 31.
        line.click()
        zoomed = "(() => { const z = window.gradmon.zoom(); return z && z.end - z.start < 100 && z })()"
        zoom = page.wait(zoomed)
        assert zoom["startValue"] <= 31 <= zoom["endValue"]
        page.wait("window.gradmon.view().zoom !== null")
        page.page.locator("#reset-zoom").click()
        page.wait("window.gradmon.zoom().start === 0 && window.gradmon.zoom().end === 100")
        assert page.shot("live").stat().st_size > 10_000
        # nothing is loaded from anywhere but the server (no CDN)
        origin = server.url.split("?")[0].rstrip("/")
        assert page.requests and all(u.startswith((origin, "ws://127.0.0.1", "data:")) for u in page.requests)
        # about two history points per pixel of chart width
        width = page.eval("document.querySelector('.chart').clientWidth")
        first = next(u for u in page.requests if "/history?" in u)
        assert abs(int(first.split("points=")[1].split("&")[0]) - 2 * width) <= 0.25 * 2 * width
    assert page.errors == []


def test_zoom_fetches_full_resolution_of_a_downsampled_run(logdir: Path, browser: object) -> None:
    n = 6000
    log = logdir / "long" / "metrics.jsonl"
    recs = [header()] + [step(s) for s in range(1, n + 1)]
    recs[3001] = step(3001, grad_norm=55.0, spike=True)
    recs.insert(3002, alarm(3001, "grad_norm_spike", 55.0))
    append(log, recs)
    p = Page(browser, viewport=(1000, 800))
    try:
        with start_server(logdir, "127.0.0.1", port=0) as server:
            p.page.goto(server.url)
            p.wait("window.gradmon && window.gradmon.pointCount('long', 'loss') > 0")
            run = "window.gradmon.state.runs.get('long')"
            assert p.eval(f"{run}.exact") is False  # the server downsampled 6000 steps
            assert p.eval("window.gradmon.pointCount('long', 'loss')") < n
            # the flagged spike survives downsampling (min/max buckets + marks)
            assert p.eval(f"{run}.valueAt('grad_norm', 3001)") == {"step": 3001, "value": 55, "exact": True}
            p.wait("document.querySelectorAll('#banner button.incident').length === 1")
            p.page.locator("#banner button.incident").click()
            detail = p.wait(f"{run}.detail && {run}.detail.exact && [{run}.detail.start, {run}.detail.end]")
            lo, hi = detail
            assert lo <= 3001 <= hi and hi - lo < 1000
            view = p.eval(f"{run}.view('loss').steps.filter(s => s >= {lo} && s <= {hi})")
            assert view == list(range(lo, hi + 1))  # every step of the zoomed range
            assert any("start=" in u and "/api/runs/long/history" in u for u in p.requests)
        assert p.errors == []
    finally:
        p.close()


def test_a_run_whose_log_is_still_being_read_says_how_far(logdir: Path, page: Page) -> None:
    # A big run's first index takes a while (a minute for 10M steps): until it is done its curves
    # show what had been read when they were fetched, and the run table says so ("reading NN%", the
    # sizes in its title), then shows the run's status. (The server reads 512 bytes a tick here:
    # seconds for ~7 MB.)
    log = logdir / "big" / "metrics.jsonl"
    append(log, [header()] + [step(s) for s in range(1, 40_001)])
    badge = "document.querySelector(\"#runs-table tr[data-run='big'] .status\")"
    with start_server(logdir, "127.0.0.1", port=0, poll_max_bytes=512, poll_idle_max_bytes=512,
                      progress_interval=0.05) as server:
        page.page.goto(server.url)
        first = page.wait(f"{badge} && /^reading [0-9]+%$/.test({badge}.textContent) && {badge}.textContent")
        assert page.eval(f"{badge}.className") == "status status-indexing"
        title = page.eval(f"{badge}.title")
        size_mb = log.stat().st_size / 1e6  # (the page's sizes: 3 significant digits, decimal units)
        assert re.search(rf"still reading this run's log: [0-9.]+ [kM]?B of {size_mb:.3g} MB "
                         r"\(up to step [0-9]+ so far\)\. Its curves show", title), title
        later = page.wait(f"/^reading [0-9]+%$/.test({badge}.textContent) && {badge}.textContent !== "
                          f"{first!r} && {badge}.textContent", 60)
        assert int(later.split()[1][:-1]) > int(first.split()[1][:-1])  # it moves on
        page.wait(f"{badge}.textContent === 'live'", 120)  # read: the run's status
        assert page.eval(f"[{badge}.className, {badge}.title]") == ["status status-live", ""]
        page.wait("window.gradmon.state.runsInfo.get('big').last_step === 40000"
                  " && window.gradmon.state.runs.get('big').lastStep === 40000")
    assert page.errors == []


def test_every_run_shown_on_open_and_selection_kept_in_the_url(logdir: Path, page: Page) -> None:
    append(logdir / "sweep" / "old" / "metrics.jsonl", [header()] + [step(s, t0=T0) for s in range(1, 21)])
    later = T0 + 3600
    append(logdir / "new" / "metrics.jsonl", [header(t0=later)] + [step(s, t0=later) for s in range(1, 11)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(2)
        assert page.eval("window.gradmon.selected()") == ["new", "sweep/old"]  # all, newest first
        assert "?" not in page.page.url  # the default view keeps a plain URL
        ids = page.wait("""(() => { const p = window.gradmon.board.panels.get('loss');
                                    const s = p && p.series.filter(s => s.id.endsWith('|raw'));
                                    return s && s.length === 2 ? s.map(s => [s.id, s.color]) : null })()""")
        assert sorted(i for i, _ in ids) == ["new|loss|raw", "sweep/old|loss|raw"]
        assert ids[0][1] != ids[1][1]  # distinct colours
        legend = page.page.locator(".chart-card[data-panel='loss'] .legend").inner_text()
        assert "new" in legend and "sweep/old" in legend
        # unticking a run writes the selection into the URL
        page.page.locator("#runs-table tr[data-run='sweep/old'] input[type=checkbox]").uncheck()
        page.wait("window.location.search === '?run=new'")
        raw = "window.gradmon.board.panels.get('loss').series.filter(s => s.id.endsWith('|raw'))"
        page.wait(f"{raw}.length === 1")
        # x by relative time: both runs start near 0 though they started an hour apart
        page.page.locator("#runs-table tr[data-run='sweep/old'] input[type=checkbox]").check()
        page.page.select_option("#xmode", "relative")
        xs = page.wait("""(() => { const p = window.gradmon.board.panels.get('loss');
                                   const s = p.series.filter(s => s.id.endsWith('|raw'));
                                   return s.length === 2 && p.key.includes('relative')
                                          && s.map(s => s.data[0][0]) })()""")
        assert all(0 <= x < 1 for x in xs)
        page.wait("window.location.search.includes('x=relative')")
    assert page.errors == []


def test_an_empty_log_root_then_a_run_appearing_is_shown_by_default(logdir: Path, page: Page) -> None:
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.state.connection === 'connected'")
        page.wait("document.querySelector('#runs-table').textContent.includes('No runs under the log')")
        page.settled()  # nothing to wait for: no redraw loop
        append(logdir / "late" / "metrics.jsonl", [header()] + [step(s) for s in range(1, 6)])
        page.wait("window.gradmon.pointCount('late', 'loss') === 5")  # discovered within ~1 s, shown
        assert page.eval("window.gradmon.selected()") == ["late"]
        page.settled()
        assert "loss" in page.eval("window.gradmon.panels()")
    assert page.errors == []


def test_token_reconnect_and_reset(logdir: Path, page: Page) -> None:
    log = logdir / "exp" / "metrics.jsonl"
    append(log, [header()] + [step(s) for s in range(1, 11)])
    server = start_server(logdir, "127.0.0.1", port=0, token="s3cret")
    port = server.port
    try:
        assert "token=s3cret" in server.url
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('exp', 'loss') === 10")
        page.wait("window.gradmon.state.connection === 'connected'")
        assert all("token=s3cret" in u for u in page.requests if "/api/" in u or "/ws" in u)
        server.stop()
        page.wait("window.gradmon.state.connection === 'reconnecting'")
        append(log, [step(s) for s in range(11, 16)])  # written while the server is down
        server = start_server(logdir, "127.0.0.1", port=port, token="s3cret")
        # back by itself, resubscribed with its cursor: the missed records arrive, none twice
        page.wait("window.gradmon.pointCount('exp', 'loss') === 15", timeout=30_000)
        append(log, [step(s) for s in range(16, 21)])
        page.wait("window.gradmon.pointCount('exp', 'loss') === 20")
        # the file replaced (a new run in the same place): the page drops the run and refetches
        log.unlink()
        append(log, [header()] + [step(s, loss=9.0) for s in range(1, 6)])
        page.wait("""window.gradmon.pointCount('exp', 'loss') === 5 &&
                     window.gradmon.state.runs.get('exp').valueAt('loss', 5).value === 9""")
        assert "token=s3cret" in page.page.url  # the token stays in the URL with the view
    finally:
        server.stop()
    # Only the browser's own reports of the refused reconnect attempts are allowed.
    refused = ("ERR_CONNECTION_REFUSED", "WebSocket connection")
    unexpected = [e for e in page.errors if not any(r in e for r in refused)]
    assert unexpected == []


def test_resumed_run_rolled_back_while_followed_shows_each_step_once(logdir: Path, page: Page) -> None:
    log = logdir / "resumed" / "metrics.jsonl"
    append(log, [header(run_id="aa" * 8)] + [step(s, lr=0.1) for s in range(1, 21)]
           + [step(21, lr=0.1, spike=True, grad_norm=9.0)] + [step(s, lr=0.1) for s in range(22, 31)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('resumed', 'lr') === 30")
        page.wait("window.gradmon.state.connection === 'connected'")
        # rolled back to the step-10 checkpoint: a new segment trains 11..25 again, with a loss-scale
        # overflow at 24 (its norm non-finite by nature)
        resumed = [step(s, t0=T0 + 100, lr=0.2) for s in range(11, 26)]
        resumed[13] = step(24, t0=T0 + 100, lr=0.2, grad_norm="Infinity", loss_scale=65536.0, skipped=True,
                           skip_reason="overflow")
        append(log, [header(run_id="bb" * 8, t0=T0 + 100), *resumed])
        page.wait("window.gradmon.state.runs.get('resumed').valueAt('lr', 25).value === 0.2")
        run = "window.gradmon.state.runs.get('resumed')"

        def check() -> None:
            # 11..25 are the new segment's (its spike-free 21 replaces the old spike); 26..30 stay
            assert page.eval(f"{run}.series.get('lr').steps") == list(range(1, 31))
            assert page.eval(f"{run}.series.get('lr').values") == [0.1] * 10 + [0.2] * 15 + [0.1] * 5
            assert page.eval("window.gradmon.marks('resumed', 'spike')") == []
            # the overflow: a skip, drawn as a diamond, no non-finite triangle
            assert page.eval("window.gradmon.marks('resumed', 'skip')") == [24]
            assert page.eval("window.gradmon.marks('resumed', 'nonfinite')") == []
            markers = page.wait("""(() => { const m = window.gradmon.markers('grad_norm');
                                    return m.some(x => x.role === 'skip') && m; })()""")
            flagged = [(m["role"], m["step"]) for m in markers if m["role"] in ("skip", "nonfinite")]
            assert flagged == [("skip", 24)]

        check()
        # a reload (history from the server) shows the same
        page.page.reload()
        page.wait("window.gradmon && window.gradmon.pointCount('resumed', 'lr') === 30")
        check()
    assert page.errors == []


def test_alarm_notifications_are_opt_in_and_only_for_new_alarms(logdir: Path, browser: object) -> None:
    log = logdir / "exp" / "metrics.jsonl"
    append(log, [header(), *[step(s) for s in range(1, 11)], alarm(5, "loss_spike", 9.0), alarm_end(6, 5, 2)])
    p = Page(browser)
    try:
        p.context.grant_permissions(["notifications"])
        with start_server(logdir, "127.0.0.1", port=0) as server:
            p.page.goto(server.url)
            p.wait("window.gradmon && window.gradmon.incidents().length === 1")
            p.wait("window.gradmon.state.connection === 'connected'")
            button = p.page.locator("#notify")
            assert button.inner_text() == "alerts: off"
            append(log, [step(11), alarm(11, "grad_norm_spike", 50.0)])
            p.wait("window.gradmon.incidents().length === 2")
            assert p.eval("window.gradmon.notifications()") == []  # not asked for: nothing sent
            button.click()
            p.wait("document.querySelector('#notify').textContent === 'alerts: on'")
            append(log, [step(12), {"type": "event", "kind": "abort", "step": 12, "ts": T0 + 1.2,
                                     "message": "10 consecutive non-finite steps", "consecutive": 10}])
            sent = p.wait("window.gradmon.notifications().length === 1 && window.gradmon.notifications()")
            assert sent[0]["title"] == "gradmon · exp: training aborted"
            assert "step 12" in sent[0]["body"] and "10 consecutive" in sent[0]["body"]
        assert p.errors == []
    finally:
        p.close()


def test_system_points_and_layers_of_a_run_written_before_the_page_opened(logdir: Path, page: Page) -> None:
    log = logdir / "sysrun" / "metrics.jsonl"
    recs: list = [header()]
    for s in range(1, 121):
        recs.append(step(s))
        if s % 20 == 0:  # every ~5 s of a LiveMonitor(system_metrics=True) run
            recs.append({"type": "system", "ts": T0 + 0.1 * s, "step": s, "cpu_percent": 40.0 + s / 10,
                         "process_cpu_percent": 180.0, "rss_bytes": 1_000_000_000 + 1_000_000 * s,
                         "host_mem_percent": 41.0})
    recs.append({"type": "layers", "step": 120, "ts": T0 + 12.0,
                 "top": [{"name": "fc1.weight", "grad_norm": 3.25, "param_norm": 12.0,
                          "update_ratio": 0.0012},
                         {"name": "fc2.bias", "grad_norm": "NaN", "param_norm": 0.5, "update_ratio": 1e-5}]})
    append(log, recs)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('sysrun', 'loss') === 120")
        # Every system sample written before the page opened came with the history, by step.
        rss = page.wait("(() => { const p = window.gradmon.systemPoints('sysrun', 'rss_bytes');"
                        " return p.steps.length === 6 && p })()")
        assert rss["steps"] == [20, 40, 60, 80, 100, 120]
        assert rss["values"] == [1_000_000_000 + 1_000_000 * s for s in rss["steps"]]
        panels = page.wait("window.gradmon.panels().includes('system/rss_bytes') && window.gradmon.panels()")
        assert {"system/cpu_percent", "system/process_cpu_percent", "system/host_mem_percent"} <= set(panels)
        # The byte axis is labelled in MB/GB, not raw counts.
        page.show_chart("system/rss_bytes")
        labels = page.eval("""(() => { const c = window.gradmon.board.panels.get('system/rss_bytes').chart;
                                 const f = c.getOption().yAxis[0].axisLabel.formatter;
                                 return [f(1.1e9), f(1.05e9)]; })()""")
        assert labels == ["1.1 GB", "1.05 GB"]
        # The latest layers table, in a compact panel.
        page.wait("window.gradmon.layers('sysrun') !== null")
        table = page.page.locator("#layers .layers-table")
        assert table.count() == 1 and not page.page.locator("#layers").is_hidden()
        text = table.inner_text()
        assert "fc1.weight" in text and "3.25" in text and "NaN" in text
        # Live: a new sample and a new layers record arrive and merge without duplicates.
        page.wait("window.gradmon.state.connection === 'connected'")
        append(log, [step(121), {"type": "system", "ts": T0 + 12.1, "step": 121, "cpu_percent": 99.0,
                                  "rss_bytes": 1_500_000_000},
                     {"type": "layers", "step": 121, "ts": T0 + 12.1,
                      "top": [{"name": "fc3.weight", "grad_norm": 7.0, "param_norm": 2.0,
                               "update_ratio": 0.01}]}])
        page.wait("window.gradmon.systemPoints('sysrun', 'rss_bytes').steps.length === 7")
        cpu_steps = page.eval("window.gradmon.systemPoints('sysrun', 'cpu_percent').steps")
        assert cpu_steps == [20, 40, 60, 80, 100, 120, 121]
        page.wait("document.querySelector('#layers .layers-card').dataset.step === '121'")
        assert "fc3.weight" in page.page.locator("#layers .layers-table").inner_text()
        page.settled()
        assert page.shot("system-layers").stat().st_size > 10_000
    assert page.errors == []
