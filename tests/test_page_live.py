"""Browser end-to-end tests of the dashboard page (dashboard/) against a live `gradmon serve`.

Real parts only: the server from ``gradmon.server.app.start_server`` on a temporary log root, run
logs appended line by line with the shared codec while the page is open, and Debian's Chromium
driven by Playwright. The page exposes its state on ``window.gradmon`` (point counts per series,
rendered markers, banner spikes); assertions wait on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradmon.jsonl import encode_record

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "gradmon" / "static"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
T0 = 1_764_486_000.0
SHOTS = Path(os.environ.get("GRADMON_SCREENSHOTS", tempfile.gettempdir())) / "gradmon-page-shots"

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (make browser)", allow_module_level=True)
if not (STATIC / "index.html").exists():
    pytest.skip("gradmon/static is not built (make dashboard)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


def _stale_build() -> list[str]:
    """Sources of the page that differ from their copy in gradmon/static (edited, not rebuilt)."""
    src = ROOT / "dashboard" / "src"
    files = [*src.glob("*.html"), *src.glob("*.css"), *src.glob("*/*.js")]
    out = {f.name: STATIC / ("" if f.suffix == ".html" else "static") / f.name for f in files}
    return [f.name for f in files if not out[f.name].exists() or out[f.name].read_bytes() != f.read_bytes()]


@pytest.fixture(scope="module", autouse=True)
def built_page_is_current() -> None:
    stale = _stale_build()
    if stale:
        pytest.fail(f"gradmon/static is older than dashboard/src ({', '.join(stale)}): run make dashboard")
start_server = pytest.importorskip("gradmon.server.app").start_server


# ---------------------------------------------------------------------------- run logs


def header(max_norm: float | None = 1.0, t0: float = T0) -> dict:
    return {"type": "header", "schema": 1, "run_id": "0f" * 8, "start_time": t0, "host": "test", "pid": 1,
            "versions": {"gradmon": "0.1.0"}, "mode": "GRAPH", "device": "CPU", "world_size": 1, "rank": 0,
            "config": {"lr": 1e-3}, "max_norm": max_norm, "spike_mode": "detect", "log_interval": 1}


def step(s: int, t0: float = T0, **fields: object) -> dict:
    rec = {"type": "step", "step": s, "epoch": 1, "ts": t0 + 0.1 * s, "loss": 2.0 / (1 + 0.01 * s),
           "grad_norm": 1.0 + 0.05 * math.sin(s), "lr": 1e-3, "throughput": 5000.0 + s % 7,
           "step_time": 0.01}
    rec.update(fields)
    return rec


def append(path: Path, records: list) -> None:
    """Append records as complete lines, one write, flushed (as the run-log writer does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(encode_record(r) for r in records))
        f.flush()


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A page with its console errors and page errors collected."""

    def __init__(self, browser: object, viewport: tuple[int, int] = (1300, 900)) -> None:
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def wait(self, js: str, timeout: float = 15.0) -> object:
        """Poll the expression ``js`` until it is truthy; return its value. (Playwright's
        wait_for_function evaluates strings with eval, which the page's CSP rightly forbids.)"""
        deadline = time.monotonic() + timeout
        while True:
            value = self.page.evaluate(js)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for: {js}")
            self.page.wait_for_timeout(50)

    def _console(self, msg: object) -> None:
        if msg.type == "error":
            self.errors.append(f"console.error: {msg.text}")

    def eval(self, js: str, arg: object = None) -> object:
        return self.page.evaluate(js, arg)

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def logdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gradmon-page-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def page(browser: object) -> Iterator[Page]:
    p = Page(browser)
    yield p
    p.close()


def point_count(p: Page, run: str, field: str) -> int:
    return p.eval("([r, f]) => window.gradmon.pointCount(r, f)", [run, field])


# ---------------------------------------------------------------------------- tests


def test_history_then_live_points_nan_marker_and_spike_banner(logdir: Path, page: Page) -> None:
    log = logdir / "exp001" / "metrics.jsonl"
    append(log, [header(max_norm=2.0)] + [step(s) for s in range(1, 31)]
           + [step(31, loss="NaN", grad_norm="Infinity", nonfinite=True, skipped=True)]
           + [step(s) for s in range(32, 41)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('exp001', 'loss') === 40")
        assert page.eval("window.gradmon.selected()") == ["exp001"]  # the only (newest) run, by default
        page.wait("window.gradmon.state.connection === 'connected'")
        assert page.page.locator("#conn").inner_text() == "live"
        # History drew the charts, with the NaN/Infinity step as a red marker, not a gap or a drop.
        panels = page.wait("window.gradmon.panels().length >= 5 && window.gradmon.panels()")
        assert panels[:2] == ["loss", "grad_norm"]
        assert {"lr", "throughput", "step_time"} <= set(panels)
        loss_marks = page.wait("window.gradmon.markers('loss').filter(m => m.role === 'nonfinite')")
        assert [(m["step"], m["label"]) for m in loss_marks] == [(31, "NaN")]
        norm_marks = page.eval("window.gradmon.markers('grad_norm').filter(m => m.role === 'nonfinite')")
        assert [(m["step"], m["label"]) for m in norm_marks] == [(31, "Infinity")]
        assert page.page.locator("#banner").inner_text().count("step 31") == 1

        # Live: records appended while the page is open stream in over the WebSocket.
        for lo in (41, 51, 61):
            batch = [step(s) for s in range(lo, lo + 10)]
            if lo == 61:
                batch[4] = step(65, grad_norm=40.0, spike=True, zscore=9.5)
            append(log, batch)
            page.wait(f"window.gradmon.pointCount('exp001', 'grad_norm') === {lo + 9}")
        assert page.eval("window.gradmon.lastStep('exp001')") == 70
        # no duplicate and no gap between history and live: every step exactly once
        steps = page.eval("window.gradmon.state.runs.get('exp001').series.get('loss').steps")
        assert steps == list(range(1, 71))
        assert page.eval("window.gradmon.state.liveRecords") >= 30

        # The spike: a red ring on the grad-norm chart and an item in the banner.
        page.wait("window.gradmon.markers('grad_norm').some(m => m.role === 'spike' && m.step === 65)")
        assert page.eval("window.gradmon.spikes()") == [{"run": "exp001", "step": 65, "value": 40}]
        item = page.page.locator("#banner button.mark-spike")
        assert item.count() == 1
        assert "step 65" in item.inner_text()
        # The clip threshold from the header is drawn on the grad-norm chart.
        assert page.eval("""window.gradmon.board.panels.get('grad_norm').series
                             .find(s => s.id === 'exp001|grad_norm|raw').markLine.data[0].yAxis""") == 2.0
        # The visible DOM: run listed as live, a canvas per chart.
        row = page.page.locator("#runs li[data-run='exp001']")
        assert "live" in row.inner_text()
        assert page.page.locator(".chart-card canvas").count() >= len(panels)

        # Clicking the banner item zooms every chart around step 65.
        item.click()
        zoom = page.wait("(() => { const z = window.gradmon.zoom(); return z.end - z.start < 100 && z })()")
        assert zoom["startValue"] <= 65 <= zoom["endValue"]
        assert zoom["endValue"] - zoom["startValue"] < 70
        page.shot("live-zoomed")
        page.page.locator("#reset-zoom").click()
        page.wait("window.gradmon.zoom().start === 0 && window.gradmon.zoom().end === 100")
        shot = page.shot("live")
        assert shot.stat().st_size > 10_000
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
    append(log, recs)
    p = Page(browser, viewport=(1000, 800))
    try:
        with start_server(logdir, "127.0.0.1", port=0) as server:
            p.page.goto(server.url)
            p.wait("window.gradmon && window.gradmon.pointCount('long', 'loss') > 0")
            run = "window.gradmon.state.runs.get('long')"
            assert p.eval(f"{run}.exact") is False  # the server downsampled 6000 steps
            base = p.eval("window.gradmon.pointCount('long', 'loss')")
            assert base < n
            # the spike survives downsampling (min/max buckets + marks)
            assert p.eval(f"{run}.valueAt('grad_norm', 3001)") == {"step": 3001, "value": 55, "exact": True}
            p.wait("document.querySelectorAll('#banner button.mark-spike').length === 1")
            p.page.locator("#banner button.mark-spike").click()
            detail = p.wait(f"{run}.detail && {run}.detail.exact && [{run}.detail.start, {run}.detail.end]")
            lo, hi = detail
            assert lo <= 3001 <= hi and hi - lo < 1000
            view = p.eval(f"{run}.view('loss').steps.filter(s => s >= {lo} && s <= {hi})")
            assert view == list(range(lo, hi + 1))  # every step of the zoomed range
            assert any("start=" in u and "/api/runs/long/history" in u for u in p.requests)
        assert p.errors == []
    finally:
        p.close()


def test_overlay_runs_newest_selected_by_default(logdir: Path, page: Page) -> None:
    append(logdir / "sweep" / "old" / "metrics.jsonl", [header()] + [step(s, t0=T0) for s in range(1, 21)])
    later = T0 + 3600
    append(logdir / "new" / "metrics.jsonl", [header(t0=later)] + [step(s, t0=later) for s in range(1, 11)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.wait("window.gradmon && window.gradmon.pointCount('new', 'loss') === 10")
        assert page.eval("window.gradmon.selected()") == ["new"]
        assert page.eval("window.gradmon.pointCount('sweep/old', 'loss')") == 0
        page.page.locator("#runs li[data-run='sweep/old'] input[type=checkbox]").check()
        page.wait("window.gradmon.pointCount('sweep/old', 'loss') === 20")
        ids = page.wait("""(() => { const p = window.gradmon.board.panels.get('loss');
                                    const s = p && p.series.filter(s => s.id.endsWith('|raw'));
                                    return s && s.length === 2 ? s.map(s => [s.id, s.color]) : null })()""")
        assert sorted(i for i, _ in ids) == ["new|loss|raw", "sweep/old|loss|raw"]
        assert ids[0][1] != ids[1][1]  # distinct colours
        # x by relative time: both runs start near 0 though they started an hour apart
        page.page.select_option("#xmode", "relative")
        xs = page.wait("""(() => { const p = window.gradmon.board.panels.get('loss');
                                   const s = p.series.filter(s => s.id.endsWith('|raw'));
                                   return s.length === 2 && p.key.includes('relative')
                                          && s.map(s => s.data[0][0]) })()""")
        assert all(0 <= x < 1 for x in xs)
        # smoothing adds a debiased curve per run
        page.page.locator("#smoothing").fill("0.9")
        smoothed = "window.gradmon.board.panels.get('loss').series.filter(s => s.id.endsWith('|smooth'))"
        page.wait(f"{smoothed}.length === 2")
        page.shot("overlay")
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
    finally:
        server.stop()
    # Only the browser's own reports of the refused reconnect attempts are allowed.
    refused = ("ERR_CONNECTION_REFUSED", "WebSocket connection")
    unexpected = [e for e in page.errors if not any(r in e for r in refused)]
    assert unexpected == []


def test_offline_replay_from_disk(tmp_path: Path, page: Page) -> None:
    log = tmp_path / "metrics.jsonl"
    recs = [header()] + [step(s) for s in range(1, 101)]
    recs[50] = step(50, loss="NaN", nonfinite=True)
    lines = [encode_record(r) for r in recs]
    lines.insert(10, "this is not json\n")
    lines.insert(20, '{"type":"step","step":1000,"loss":NaN}\n')  # bare NaN: not JSON
    log.write_text("".join(lines) + '{"type":"step","step":101,"lo', encoding="utf-8")  # partial last line
    page.page.goto((STATIC / "index.html").as_uri())
    page.wait("window.gradmon && window.gradmon.state.mode === 'offline'")
    assert page.page.locator("#conn").inner_text() == "offline"
    page.page.set_input_files("#file", str(log))
    page.wait("window.gradmon.pointCount('replay: metrics.jsonl', 'loss') === 100")
    notice = page.page.locator("#notice").inner_text()
    assert "101 records" in notice and "skipped 3 malformed lines" in notice and "partial" in notice
    marks = page.wait("window.gradmon.markers('loss').length ? window.gradmon.markers('loss') : null")
    assert [(m["step"], m["label"]) for m in marks] == [(50, "NaN")]
    page.wait("document.querySelectorAll('.chart-card canvas').length >= 5")
    page.shot("offline")
    # dropping a file onto the page replays it too
    dropped = encode_record(step(1)) + encode_record(step(2, loss="Infinity"))
    page.eval("""(text) => { const dt = new DataTransfer();
        dt.items.add(new File([text], 'dropped.jsonl'));
        window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, cancelable: true})); }""",
              dropped)
    page.wait("window.gradmon.pointCount('replay: dropped.jsonl', 'loss') === 2")
    assert page.eval("window.gradmon.selected()") == ["replay: metrics.jsonl", "replay: dropped.jsonl"]
    # offline: nothing but the page's own files was requested, no API and no WebSocket
    assert page.requests and all(u.startswith("file://") or u.startswith("data:") for u in page.requests)
    assert page.errors == []


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
        page.wait("window.gradmon.board.panels.get('system/rss_bytes').series.length > 0")
        page.page.wait_for_timeout(300)  # the last throttled redraw, for the picture only (not asserted)
        assert page.shot("system-layers").stat().st_size > 10_000
    assert page.errors == []
