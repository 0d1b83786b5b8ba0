"""Section ``page``: the dashboard in headless Chromium (Debian's ``/usr/bin/chromium`` via
Playwright; no browser is ever downloaded).

- ``chart_ready_ms``: navigation start -> the history response of the big run has arrived, the
  network is idle and two animation frames have run after that (so the chart's first render is
  painted). ``first_contentful_paint_ms`` is the browser's own FCP of the page shell; where the time
  goes: ``dom_content_loaded_ms`` (the page's scripts loaded and run), ``history_sent_ms`` and
  ``history_answered_ms`` (the big run's history request, from navigation start).
- ``fps_streaming``: ``requestAnimationFrame`` callbacks per second while a live run grows at
  ``rate`` records/s; ``long_tasks`` counts main-thread tasks > 50 ms in that window.
- The four-run set (``write_four_runs``: 4 runs x 20,000 steps, as in the issue's comparison with
  TensorBoard and trackio; 2,000 with ``--smoke``), opened with one run (``?run=baseline``) and with
  all four (the default view), alternately, a fresh browser context each time:
  ``one_run_viewport_ms`` / ``four_runs_viewport_ms`` (median): navigation start -> the first
  viewport drawn (every chart card overlapping it drew every shown run; the first animation frame
  to begin so); ``one_run_ready_ms`` / ``four_runs_ready_ms`` (median): navigation start -> every
  shown run's history drawn in every chart near the viewport, then two animation frames;
  ``interactive_ms`` (with ``--compare``): then every chart drawn also with its tooltip and zoom
  (added right after a first look's draw), then two animation frames;
  ``one_run_heap_mb`` / ``four_runs_heap_mb`` (median):
  the page's JS heap after a forced GC (CDP ``Runtime.getHeapUsage``, 1 MB = 10^6 bytes);
  ``four_runs_history_kb``: the history responses' bodies.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.runlogs import ensure_run_log, generate_run_log, step_record
from benchmarks.server_harness import (
    free_port,
    http_get,
    serve,
    server_unavailable_reason,
    stop_process,
    wait_until_ready,
)
from gradmon.logformat.alarms import AlarmConfig
from gradmon.logformat.jsonl import encode_record

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
STATIC_INDEX = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gradmon", "static", "index.html"
)

_DOUBLE_RAF = (
    "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now()))))"
)
_START_COUNTING = """() => {
  window.__bench = {frames: 0, longTasks: 0, t0: performance.now()};
  const tick = () => { window.__bench.frames++; window.__bench.raf = requestAnimationFrame(tick); };
  window.__bench.raf = requestAnimationFrame(tick);
  try {
    new PerformanceObserver(l => { window.__bench.longTasks += l.getEntries().length; })
      .observe({entryTypes: ['longtask']});
  } catch (e) {}
}"""
_STOP_COUNTING = """() => { cancelAnimationFrame(window.__bench.raf);
  return {frames: window.__bench.frames, longTasks: window.__bench.longTasks,
          ms: performance.now() - window.__bench.t0}; }"""


# ---------------------------------------------------------------------------- the four-run set

FOUR_RUNS = ("baseline", "lr-3x", "spiky-nan", "diverged")
_STEP_LINE = (
    '{{"type":"step","step":{s},"epoch":{e},"ts":{ts:.3f},"loss":{loss:.6f},"grad_norm":{g:.6f},'
    '"lr":{lr:.6g},"throughput":{tp:.1f},"step_time":{st:.5f},"data_time":{dt:.5f},"clip_coef":{c:.6f},'
    '"zscore":{z:.3f}}}\n'
)


def _lr_at(step: int, peak: float, n: int, warmup: int = 1000) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it."""
    if step <= warmup:
        return peak * step / warmup
    t = (step - warmup) / max(1, n - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _header(k: int, name: str, start: float, peak: float) -> dict[str, Any]:
    config = {"model": "gpt-124M", "lr": peak, "batch_size": 256, "warmup": 1000, "schedule": "cosine",
              "max_norm": 1.0, "seed": 1234 + k}
    return {"type": "header", "schema": 1, "run_id": f"{k:02d}" * 8, "start_time": start, "host": "bench",
            "pid": 100 + k, "versions": {"gradmon": "bench"}, "mode": "GRAPH", "device": "CPU",
            "world_size": 1, "rank": 0, "max_norm": 1.0, "spike_mode": "clip", "log_interval": 100,
            "batch_size": 256, "config": config,
            "alarm_rule": AlarmConfig().as_dict()}  # the writer's alarm events are in the log


def _incidents(name: str, n: int) -> list[tuple[str, int, int, int, float, str]]:
    """The alarms the writer logs for a run of the set: (reason, start, end, flagged, value, message)."""
    burst, nan_step, diverge = int(0.6 * n), int(0.75 * n), int(0.45 * n)
    if name == "spiky-nan":
        return [("grad_norm_spike", burst, burst + 19, 20, 31.0, "norm 70x its running level"),
                ("nonfinite", nan_step, nan_step, 1, math.nan, "non-finite loss and gradient norm")]
    if name == "diverged":
        return [("grad_norm_spike", diverge, n, n - diverge + 1, 3000.0, "norm 6000x its running level")]
    return []


def _step(name: str, s: int, n: int, rng: random.Random, peak: float, ts: float) -> tuple[str, str | None]:
    """One step line of a run of the set, and the kind of flag it carries (None, "spike", "nonfinite")."""
    burst, nan_step, diverge = int(0.6 * n), int(0.75 * n), int(0.45 * n)
    fast = name == "lr-3x"
    loss = 2.45 - 0.35 * fast + 7.5 * math.exp(-s / (400 if fast else 600)) + 0.4 * math.exp(-s / 8000)
    loss += 0.05 * rng.gauss(0, 1)
    norm = (0.55 if fast else 0.4) * (1 + 2.5 * math.exp(-s / 300)) * (1 + 0.12 * rng.gauss(0, 1))
    tp = 1000 + 60 * rng.gauss(0, 1) - (700 if s % 1000 == 0 else 0)
    flags: dict[str, Any] = {}
    if name == "diverged" and s >= diverge:
        norm = 250 + 3450 * rng.random() ** 3
        loss = 10.4 + 0.03 * rng.gauss(0, 1) - 7.5 * math.exp(-(s - diverge) / 40)
        if s - diverge < 40 and s % 2 == 0:
            flags = {"spike": True, "clipped": True}
    if name == "spiky-nan" and burst <= s < burst + 20:
        norm = 20 + 15 * rng.random()
        loss += 0.8
        flags = {"spike": True, "clipped": True}
    if name == "spiky-nan" and s == nan_step:
        flags = {"loss": math.nan, "grad_norm": math.nan, "nonfinite": True, "skipped": True}
    fields = {"s": s, "e": 1 + (s - 1) // 5000, "ts": ts, "loss": loss, "g": norm, "lr": _lr_at(s, peak, n),
              "tp": tp, "st": 256 / tp, "dt": 0.002 + 0.001 * rng.random(), "c": min(1.0, 1.0 / norm),
              "z": 0.0}
    if not flags:
        return _STEP_LINE.format(**fields), None
    rec = {"type": "step", "step": s, "epoch": fields["e"], "ts": ts, "loss": loss, "grad_norm": norm,
           "lr": fields["lr"], "throughput": tp, "step_time": fields["st"], "data_time": fields["dt"],
           "clip_coef": fields["c"], "zscore": 9.0, **flags}
    if "nonfinite" in flags:
        rec["clip_coef"] = 0.0
    return encode_record(rec), "nonfinite" if "nonfinite" in flags else "spike"


def write_four_runs(root: str, n: int = 20_000, t0: float = 1.7e9,
                    names: tuple[str, ...] = FOUR_RUNS) -> dict[str, dict[str, Any]]:
    """Write the issue's comparison set under ``root``: ``baseline``, ``lr-3x`` (lr 1e-3 instead of
    3e-4), ``spiky-nan`` (a 20-step grad-norm spike burst at 0.6 n and a NaN step at 0.75 n) and
    ``diverged`` (norm 250–3,700 and loss ~10.4 from 0.45 n), ``n`` steps each, eval every 500 steps,
    and the writer's alarm events (format.md). Deterministic (``names`` writes a subset). Returns per run:
    ``{"path", "flagged": {"spike": [...], "skip": [...], "nonfinite": [...]}, "incidents": [...]}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(FOUR_RUNS):
        if name not in names:
            continue
        rng = random.Random(1234 + k)
        peak = 1e-3 if name == "lr-3x" else 3e-4
        start = t0 + 60 * k
        flagged: dict[str, list[int]] = {"spike": [], "skip": [], "nonfinite": []}
        incidents = _incidents(name, n)
        lines = [encode_record(_header(k, name, start, peak))]
        for s in range(1, n + 1):
            ts = start + 0.25 * s
            line, flag = _step(name, s, n, rng, peak, ts)
            lines.append(line)
            if flag == "spike":
                flagged["spike"].append(s)
            elif flag == "nonfinite":
                flagged["skip"].append(s)
                flagged["nonfinite"].append(s)
            if s % 500 == 0:
                diverged = name == "diverged" and s > int(0.45 * n) + 200
                ev_loss = 10.5 if diverged else 2.6 + 7.5 * math.exp(-s / 600)
                lines.append(encode_record({"type": "eval", "step": s, "ts": ts, "loss": ev_loss}))
            for reason, a, b, count, value, why in incidents:
                if s == a:
                    lines.append(encode_record({"type": "event", "kind": "alarm", "step": a, "ts": ts,
                                                "reason": reason, "field": "grad_norm", "value": value,
                                                "baseline": 0.42, "message": why}))
                if s == b:
                    lines.append(encode_record({"type": "event", "kind": "alarm_end", "step": b, "ts": ts,
                                                "start": a, "flagged": count, "message": "incident closed"}))
        lines.append(encode_record({"type": "end", "ts": start + 0.25 * n, "status": "finished", "steps": n,
                                    "dropped_records": 0}))
        path = os.path.join(root, name, "metrics.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(lines))
        out[name] = {"path": path, "flagged": flagged, "incidents": [i[:4] for i in incidents]}
    return out


def page_unavailable_reason() -> str | None:
    reason = server_unavailable_reason()
    if reason:
        return reason
    if not os.path.exists(STATIC_INDEX):
        return "gradmon/static/index.html not built (make dashboard)"
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} missing (make browser)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright not installed: {exc}"
    return None


def _first_paint(browser: Any, url: str, timeout_ms: float) -> dict[str, Any]:
    page = browser.new_page()
    try:
        with page.expect_response(lambda r: "/history" in r.url, timeout=timeout_ms) as resp_info:
            page.goto(url, wait_until="commit", timeout=timeout_ms)
        resp = resp_info.value
        page.wait_for_load_state("networkidle", timeout=timeout_ms)
        ready = page.evaluate(_DOUBLE_RAF)
        fcp = page.evaluate(
            "() => (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null"
        )
        parts = page.evaluate(_LOAD_PARTS)
        return {
            "chart_ready_ms": ready,
            "first_contentful_paint_ms": fcp,
            **parts,
            "history_status": resp.status,
            "history_bytes": len(resp.body()),
        }
    finally:
        page.close()


# Resolves when every shown run's data is drawn: with the page's `loaded()` (all histories in, no
# redraw pending); on a page without it (an older build), when a draw follows the data's arrival.
_READY = """([n, timeoutMs]) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  let before = null, atData = null;
  const tick = () => {
    const g = window.gradmon;
    if (performance.now() - t0 > timeoutMs) return reject(new Error('page not ready'));
    if (g && g.selected().length >= n && g.selected().every(r => g.pointCount(r, 'loss') > 0)) {
      const done = g.loaded
        ? g.loaded().length >= n && !g.board.dirty && !g.board.frame && g.renderCount() > 0
        : (atData = atData === null ? before : atData, g.renderCount() > atData);
      if (done) return requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now())));
    } else if (g) before = g.renderCount();
    requestAnimationFrame(tick);
  };
  tick();
})"""


# After _READY: every chart drawn also has its interaction (the tooltip and zoom a chart drawn for
# the first look gets right after: ``board.interacting``), then two animation frames. A page without
# it (an older build, which draws every chart with its interaction) is so at once.
_INTERACTIVE = """([timeoutMs]) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  const tick = () => {
    const b = window.gradmon.board;
    if (performance.now() - t0 > timeoutMs) return reject(new Error('page not interactive'));
    if (!b.dirty && !b.frame && !b.interacting)
      return requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now())));
    requestAnimationFrame(tick);
  };
  tick();
})"""


# The first viewport drawn: every chart card overlapping the 1400x900 viewport drew all ``n`` runs
# (the handle's ``drawnRuns``), polled once per animation frame: the first frame callback to find
# those charts drawn, i.e. right after the frame that painted them (two more frames, as _READY
# waits, could include the drawing of the charts below the viewport, which the page does a frame
# later). On a page without ``drawnRuns`` (an older build, which draws every chart near the
# viewport in one task), the first to find _READY's condition met. ``ms`` is ``performance.now()``
# in that callback, ``frame_ms`` the frame's time stamp: by the time stamp alone, a page that drew
# in a task while a frame was pending (or in a frame callback run before this one) would be
# credited with that frame's earlier start. Returns {ms, frame_ms, cards}.
_VIEWPORT_READY = """([n, timeoutMs]) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  let before = null, atData = null;
  const inView = () => Array.from(document.querySelectorAll('.chart-card[data-panel]')).filter(c => {
    const r = c.getBoundingClientRect(); return r.top < innerHeight && r.bottom > 0 && r.width > 0; });
  const tick = (ts) => {
    const g = window.gradmon;
    const now = performance.now(), frame = ts === undefined ? now : ts;
    if (performance.now() - t0 > timeoutMs) return reject(new Error('viewport not drawn'));
    if (g && g.drawnRuns) {
      const cards = inView();
      if (cards.length && cards.every(c => g.drawnRuns(c.dataset.panel) >= n))
        return resolve({ms: now, frame_ms: frame, cards: cards.length});
    } else if (g && g.selected().length >= n && g.selected().every(r => g.pointCount(r, 'loss') > 0)) {
      const done = g.loaded
        ? g.loaded().length >= n && !g.board.dirty && !g.board.frame && g.renderCount() > 0
        : (atData = atData === null ? before : atData, g.renderCount() > atData);
      if (done) return resolve({ms: now, frame_ms: frame, cards: null});
    } else if (g) before = g.renderCount();
    requestAnimationFrame(tick);
  };
  tick();
})"""


# Where chart_ready_ms goes: the page's scripts run (DOMContentLoaded), the history request sent and
# answered (navigation start -> each), from the browser's own timings.
_LOAD_PARTS = """() => {
  const nav = performance.getEntriesByType('navigation')[0] || {};
  const h = performance.getEntriesByType('resource').find(e => e.name.includes('/history')) || {};
  return {dom_content_loaded_ms: nav.domContentLoadedEventEnd || null,
          history_sent_ms: h.startTime || null, history_answered_ms: h.responseEnd || null};
}"""


# DOMContentLoaded and what the page asked for (the document itself counts as one request).
_REQUESTS = """() => {
  const nav = performance.getEntriesByType('navigation')[0] || {};
  const res = performance.getEntriesByType('resource');
  return {dom_content_loaded_ms: nav.domContentLoadedEventEnd || null, requests: res.length + 1,
          script_requests: res.filter(e => e.initiatorType === 'script' || /[.]js$/.test(e.name)).length};
}"""


# Where the time goes, from navigation start: the page's scripts fetched, the run list and the
# history requests sent and answered (first sent, last answered). ms; None where not requested.
_PARTS = """() => {
  const res = performance.getEntriesByType('resource');
  const scripts = res.filter(e => /[.]js$/.test(e.name.split('?')[0]));
  const runs = res.filter(e => /[/]api[/]runs$/.test(e.name.split('?')[0]));
  const hist = res.filter(e => e.name.includes('/history'));
  const max = (xs, k) => xs.length ? Math.max(...xs.map(e => e[k])) : null;
  const min = (xs, k) => xs.length ? Math.min(...xs.map(e => e[k])) : null;
  return {scripts_fetched_ms: max(scripts, 'responseEnd'),
          script_kb: scripts.reduce((a, e) => a + e.encodedBodySize, 0) / 1e3,
          runs_sent_ms: min(runs, 'startTime'), runs_answered_ms: min(runs, 'responseEnd'),
          history_sent_ms: min(hist, 'startTime'), history_answered_ms: max(hist, 'responseEnd')};
}"""


def _history_bytes(page: Any) -> int:
    return int(page.evaluate("""() => performance.getEntriesByType('resource')
        .filter(e => e.name.includes('/history')).reduce((a, e) => a + e.encodedBodySize, 0)"""))


def load_page(browser: Any, url: str, runs: int, timeout_ms: float = 120_000) -> dict[str, float]:
    """Open ``url`` in a fresh context; time until ``runs`` runs are drawn; the JS heap after a GC."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = ctx.new_page()
        page.goto(url, wait_until="commit", timeout=timeout_ms)
        viewport = page.evaluate(_VIEWPORT_READY, [runs, timeout_ms])
        ready = page.evaluate(_READY, [runs, timeout_ms])
        interactive = page.evaluate(_INTERACTIVE, [timeout_ms])
        cdp = ctx.new_cdp_session(page)
        cdp.send("HeapProfiler.collectGarbage")
        heap = cdp.send("Runtime.getHeapUsage")["usedSize"]
        parts = page.evaluate(_REQUESTS)
        return {"viewport_ms": viewport["ms"], "viewport_frame_ms": viewport["frame_ms"],
                "viewport_cards": viewport["cards"], "ready_ms": ready,
                "interactive_ms": interactive, "heap_mb": heap / 1e6, "history_bytes": _history_bytes(page),
                **parts, **page.evaluate(_PARTS)}
    finally:
        ctx.close()


def measure_four_runs(browser: Any, url: str, rounds: int) -> dict[str, Any]:
    """One run and four runs, alternately (so machine load hits both alike); medians."""
    got: dict[str, list[dict[str, float]]] = {"one": [], "four": []}
    for r in range(rounds):
        for case in (("one", "four") if r % 2 == 0 else ("four", "one")):
            got[case].append(load_page(browser, url + ("/?run=baseline" if case == "one" else "/"),
                                       1 if case == "one" else 4))
    med = lambda case, k: statistics.median(x[k] for x in got[case])  # noqa: E731
    return {
        "one_run_viewport_ms": med("one", "viewport_ms"),
        "four_runs_viewport_ms": med("four", "viewport_ms"),
        "one_run_ready_ms": med("one", "ready_ms"),
        "four_runs_ready_ms": med("four", "ready_ms"),
        "one_run_heap_mb": med("one", "heap_mb"),
        "four_runs_heap_mb": med("four", "heap_mb"),
        "four_runs_history_kb": med("four", "history_bytes") / 1e3,
        "four_runs_rounds": rounds,
    }


def _wait_indexed(url: str, runs: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        listed = json.loads(http_get(url + "/api/runs")[1])["runs"]
        if len(listed) >= runs and not any(r.get("indexing") for r in listed):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the four runs were not indexed in time")
        time.sleep(0.1)


def run_section(device: str, smoke: bool, log: Callable[[str], None], out_dir: str) -> dict[str, Any]:
    reason = page_unavailable_reason()
    if reason:
        return {"skipped": reason}
    from playwright.sync_api import sync_playwright

    n_big = 20_000 if smoke else 1_000_000
    stream_s = 1.0 if smoke else 5.0
    rate = 100
    name = f"r{n_big}"
    root = os.path.join(out_dir, "bigruns", name)
    ensure_run_log(os.path.join(root, name, "metrics.jsonl"), n_big)
    result: dict[str, Any] = {
        "run_records": n_big,
        "stream_rate": rate,
        "stream_s": stream_s,
        "about": (__doc__ or "").strip(),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            with serve(root, os.path.join(out_dir, "server-page.log"), ready_timeout=300) as srv:
                log(f"page: first paint of a {n_big:,}-record run")
                result.update(_first_paint(browser, f"{srv['url']}/?run={name}", 300_000))
            tmp = tempfile.mkdtemp(prefix="gradmon-bench-page-")
            try:
                live = os.path.join(tmp, "live", "metrics.jsonl")
                generate_run_log(live, 10_000, t0=time.time() - 100, end=False)
                with serve(tmp, os.path.join(out_dir, "server-page-live.log")) as srv:
                    page = browser.new_page()
                    page.goto(f"{srv['url']}/?run=live", wait_until="networkidle", timeout=120_000)
                    page.evaluate(_START_COUNTING)
                    from gradmon.logformat.jsonl import encode_record

                    with open(live, "a", encoding="utf-8") as f:
                        t0 = time.perf_counter()
                        for i in range(int(rate * stream_s)):
                            delay = t0 + i / rate - time.perf_counter()
                            if delay > 0:
                                time.sleep(delay)
                            f.write(encode_record(step_record(10_001 + i, time.time())))
                            f.flush()
                    counted = page.evaluate(_STOP_COUNTING)
                    result["fps_streaming"] = counted["frames"] / (counted["ms"] / 1e3)
                    result["long_tasks_streaming"] = counted["longTasks"]
                    page.close()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            n_four = 2_000 if smoke else 20_000
            four = os.path.join(out_dir, "bigruns", f"four-{n_four}")
            if not os.path.exists(os.path.join(four, "diverged", "metrics.jsonl")):
                write_four_runs(four, n_four)
            log(f"page: load time and JS heap, 1 and 4 runs x {n_four:,} steps")
            with serve(four, os.path.join(out_dir, "server-page-four.log")) as srv:
                _wait_indexed(srv["url"], 4)
                result["four_runs_steps"] = n_four
                result.update(measure_four_runs(browser, srv["url"], 1 if smoke else 5))
        finally:
            browser.close()
    nan = float("nan")
    log(
        f"  chart ready {result.get('chart_ready_ms', nan):.0f} ms, "
        f"{result.get('fps_streaming', nan):.0f} fps while streaming; "
        f"1 run {result.get('one_run_ready_ms', nan):.0f} ms / {result.get('one_run_heap_mb', nan):.1f} MB, "
        f"4 runs {result.get('four_runs_ready_ms', nan):.0f} ms / "
        f"{result.get('four_runs_heap_mb', nan):.1f} MB"
    )
    return result


# ---------------------------------------------------------------------------- two builds

# What compare_builds gives the median of, per build and case (load_page's keys).
_COMPARED = ("viewport_ms", "viewport_frame_ms", "ready_ms", "interactive_ms", "dom_content_loaded_ms",
             "requests", "script_requests", "script_kb", "heap_mb", "runs_answered_ms", "history_sent_ms",
             "history_answered_ms", "history_bytes")


def compare_builds(trees: dict[str, str], rounds: int, out_dir: str, n: int = 20_000,
                   log: Callable[[str], None] = print, tensorboard: str | None = None,
                   cases: tuple[str, ...] = ("one", "four")) -> dict[str, Any]:
    """The page's first paint, one and four runs of ``n`` steps, for each of ``trees`` (label ->
    a checkout with its page built; its server serves its own page) in the same run: every round
    opens each tree's page with one run and with four, in alternating order, each in a freshly
    launched Chromium (1400x900). Medians of ``viewport_ms`` (navigation start -> every chart card
    overlapping the viewport drawn with every shown run, painted), ``ready_ms`` (every chart near
    the viewport drawn: the whole first pass), DOMContentLoaded, the requests, where the time
    went, ``interactive_ms`` (then every chart drawn also has its tooltip and zoom) and
    ``history_bytes`` (the history answers' bodies, as sent). ``tensorboard``: a
    TensorBoard executable (its own environment); its default page on the same runs as event files
    is opened in the same rounds (label ``tensorboard``, four runs: its default shows every run), or
    the reason it is not is given as ``tensorboard_skipped``. ``cases``: which of one run and four
    runs to open (``("four",)``: twice the rounds of the four-run case in the same time)."""
    from playwright.sync_api import sync_playwright

    from benchmarks.bigruns import _server

    out_dir = os.path.abspath(out_dir)  # (each server runs in its own tree)
    four = os.path.join(out_dir, "bigruns", f"four-{n}")
    if not os.path.exists(os.path.join(four, "diverged", "metrics.jsonl")):
        write_four_runs(four, n)
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack, sync_playwright() as p:
        urls = {}
        for label, tree in trees.items():
            srv = stack.enter_context(_server(tree, four,
                                              os.path.join(out_dir, f"server-page-{label}.log")))
            deadline = time.monotonic() + 120
            while True:
                try:
                    _wait_indexed(srv["url"], 4, 120)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            urls[label] = srv["url"]
        cases = [(label, case) for label in trees for case in cases]
        skipped = tensorboard_unavailable_reason(tensorboard) if tensorboard is not None else None
        if tensorboard is not None and skipped is None:
            assert tensorboard
            tb_root = os.path.join(out_dir, "bigruns", f"four-{n}-tfevents")
            log("  writing the runs as TensorBoard event files (once)")
            ensure_tfevents(four, tb_root, tensorboard)
            tb_log = os.path.join(out_dir, "server-page-tensorboard.log")
            srv = stack.enter_context(serve_tensorboard(tensorboard, tb_root, tb_log, 4))
            urls["tensorboard"] = srv["url"]
            cases.append(("tensorboard", "four"))
        for r in range(rounds):
            for label, case in (cases if r % 2 == 0 else cases[::-1]):
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    if label == "tensorboard":
                        got.setdefault((label, case), []).append(load_tensorboard(browser, urls[label], 4))
                        continue
                    url = urls[label] + ("/?run=baseline" if case == "one" else "/")
                    got.setdefault((label, case), []).append(
                        load_page(browser, url, 1 if case == "one" else 4))
                finally:
                    browser.close()
    out: dict[str, Any] = {"steps": n, "rounds": rounds}
    if skipped:
        out["tensorboard_skipped"] = skipped
    for (label, case), xs in got.items():
        for key in _COMPARED:
            vals = [x[key] for x in xs if x.get(key) is not None]
            out[f"{label}_{case}_{key}"] = statistics.median(vals) if vals else None
        out[f"{label}_{case}_viewport_ms_each"] = [round(x["viewport_ms"], 1) for x in xs]  # round by round
        k = f"{label}_{case}_"
        log(f"  {label} {case} run(s): first viewport {out[k + 'viewport_ms']:.0f} ms, all near charts "
            f"{out[k + 'ready_ms']:.0f} ms, DOMContentLoaded {out[k + 'dom_content_loaded_ms']:.0f} ms, "
            f"{out[k + 'requests']:.0f} requests")
    out["load_average"] = list(os.getloadavg())
    return out


def compare_chart_ready(trees: dict[str, str], rounds: int, out_dir: str, n: int = 1_000_000,
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """``chart_ready_ms`` of the section (one run of ``n`` records, ``?run=``) for each of
    ``trees`` in the same run: each tree's server on the same log, indexed first; every round opens
    each page once, in alternating order, in a freshly launched Chromium. Medians."""
    from playwright.sync_api import sync_playwright

    from benchmarks.bigruns import _server

    out_dir = os.path.abspath(out_dir)
    name = f"r{n}"
    root = os.path.join(out_dir, "bigruns", name)
    ensure_run_log(os.path.join(root, name, "metrics.jsonl"), n)
    got: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    with contextlib.ExitStack() as stack, sync_playwright() as p:
        urls = {}
        for label, tree in trees.items():
            srv = stack.enter_context(_server(tree, root, os.path.join(out_dir, f"server-ready-{label}.log")))
            deadline = time.monotonic() + 600
            while True:
                try:
                    _wait_indexed(srv["url"], 1, 600)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            urls[label] = srv["url"]
        labels = list(trees)
        for r in range(rounds):
            for label in (labels if r % 2 == 0 else labels[::-1]):
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    got[label].append(_first_paint(browser, f"{urls[label]}/?run={name}", 300_000))
                finally:
                    browser.close()
    out: dict[str, Any] = {"records": n, "rounds": rounds}
    for label, xs in got.items():
        for key in ("chart_ready_ms", "dom_content_loaded_ms", "history_sent_ms", "history_answered_ms"):
            out[f"{label}_{key}"] = statistics.median(x[key] for x in xs)
        log(f"  {label}: chart ready {out[label + '_chart_ready_ms']:.0f} ms (1 run of {n:,} records)")
    out["load_average"] = list(os.getloadavg())
    return out


# ---------------------------------------------------------------------------- TensorBoard beside it

# TensorBoard's default page (the time-series dashboard) "drawn": every scalar card overlapping the
# viewport lists all ``n`` runs with a value in its data table (the card's data has reached it: the
# same data its line chart draws), timed as _VIEWPORT_READY is (``performance.now()`` in the first
# frame callback to find it so; ``frame_ms``: that frame's time stamp). Its charts are drawn by a
# web worker on an OffscreenCanvas, which the page cannot observe: the worker's own drawing after
# that moment is not counted (in TensorBoard's favour). {ms, frame_ms, cards}.
_TB_VIEWPORT_READY = r"""([n, timeoutMs]) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  const tick = (ts) => {
    if (performance.now() - t0 > timeoutMs) return reject(new Error('TensorBoard not drawn'));
    const cards = Array.from(document.querySelectorAll('scalar-card')).filter(c => {
      const r = c.getBoundingClientRect(); return r.top < innerHeight && r.bottom > 0 && r.width > 0; });
    const filled = c => Array.from(c.querySelectorAll('tb-data-table-content-row'))
      .filter(r => /\d/.test(r.innerText)).length >= n;
    if (cards.length && cards.every(filled))
      return resolve({ms: performance.now(), frame_ms: ts === undefined ? performance.now() : ts,
                      cards: cards.length});
    requestAnimationFrame(tick);
  };
  tick();
})"""


def tensorboard_unavailable_reason(cmd: str | None) -> str | None:
    """Why TensorBoard cannot be timed beside the page (None: it can). ``cmd``: its executable, in an
    environment of its own (never a dependency of gradmon), whose ``python`` sits beside it."""
    if not cmd:
        return "no --tensorboard given (a TensorBoard executable, e.g. /work/tbvenv/bin/tensorboard)"
    if not (os.path.isfile(cmd) and os.access(cmd, os.X_OK)):
        return f"{cmd} is not an executable (python3 -m venv V && V/bin/pip install tensorboard==2.21.0)"
    if not os.path.exists(os.path.join(os.path.dirname(cmd), "python")):
        return f"no python beside {cmd} (it writes the runs as event files)"
    return None


def ensure_tfevents(runs_root: str, tb_root: str, cmd: str, names: tuple[str, ...] = FOUR_RUNS) -> None:
    """The runs under ``runs_root`` as TensorBoard event files under ``tb_root`` (written once, by
    TensorBoard's own writer in its environment: benchmarks/tb_events.py)."""
    def written(name: str) -> bool:
        d = os.path.join(tb_root, name)
        return os.path.isdir(d) and any(f.startswith("events.out.tfevents") for f in os.listdir(d))

    if all(written(name) for name in names):
        return
    shutil.rmtree(tb_root, ignore_errors=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tb_events.py")
    shutil.rmtree(tb_root + ".part", ignore_errors=True)
    subprocess.run([os.path.join(os.path.dirname(cmd), "python"), script, runs_root, tb_root + ".part"],
                   check=True, stdout=subprocess.DEVNULL, timeout=1800)
    os.replace(tb_root + ".part", tb_root)


@contextlib.contextmanager
def serve_tensorboard(cmd: str, logdir: str, out_log: str, runs: int,
                      timeout: float = 300.0) -> Iterator[dict[str, Any]]:
    """``tensorboard --logdir LOGDIR --host 127.0.0.1`` on a free port, yielded once every run's
    scalar tags are loaded."""
    port = free_port()
    with open(out_log, "ab") as f:
        proc = subprocess.Popen([cmd, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    def loaded() -> bool:
        with contextlib.suppress(OSError, ValueError):
            tags = json.loads(http_get(url + "/data/plugin/scalars/tags", 10)[1])
            return len(tags) >= runs and all(len(t) >= len(FIELDS_CHARTED) for t in tags.values())
        return False

    try:
        wait_until_ready(proc, loaded, timeout, 0.2, f"tensorboard, loading the runs (see {out_log})")
        yield {"url": url, "pid": proc.pid}
    finally:
        stop_process(proc, 30)


# The step fields of the four-run set that both pages chart (benchmarks/tb_events.py writes these).
FIELDS_CHARTED = ("loss", "grad_norm", "lr", "throughput", "step_time", "data_time", "clip_coef", "zscore")


def load_tensorboard(browser: Any, url: str, runs: int, timeout_ms: float = 120_000) -> dict[str, Any]:
    """TensorBoard's default page in a fresh 1400x900 context: its first viewport drawn (above)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = ctx.new_page()
        page.goto(url + "/", wait_until="commit", timeout=timeout_ms)
        drawn = page.evaluate(_TB_VIEWPORT_READY, [runs, timeout_ms])
        parts = page.evaluate(_REQUESTS)
        return {"viewport_ms": drawn["ms"], "viewport_frame_ms": drawn["frame_ms"],
                "viewport_cards": drawn["cards"], "ready_ms": drawn["ms"],
                "interactive_ms": None, "heap_mb": None, **parts, **page.evaluate(_PARTS)}
    finally:
        ctx.close()


# ---------------------------------------------------------------------------- screenshots

SHOTS = {
    # name: (query, viewport, colour scheme, full page)
    "dashboard": ("", (1400, 900), "light", False),
    "dashboard-smoothed-zoom": ("?smooth=0.9&zoom=11500,13000", (1400, 900), "light", False),
    "dashboard-expanded": ("?run=spiky-nan&run=baseline&expand=grad_norm&zoom=11000,16000", (1400, 900),
                           "light", False),
    "dashboard-phone-dark": ("", (390, 844), "dark", False),
}


def screenshots(out_dir: str, n: int = 20_000) -> list[str]:
    """The docs' pictures of the page on the four-run set: ``python -m benchmarks.page_section
    --screenshots docs/img``."""
    from playwright.sync_api import sync_playwright

    written = []
    with tempfile.TemporaryDirectory(prefix="gradmon-shots-") as root:
        write_four_runs(root, n)
        with sync_playwright() as p, serve(root, os.path.join(root, "server.log")) as srv:
            _wait_indexed(srv["url"], 4)
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for name, (query, (w, h), scheme, full) in SHOTS.items():
                    ctx = browser.new_context(viewport={"width": w, "height": h}, color_scheme=scheme)
                    page = ctx.new_page()
                    page.goto(srv["url"] + "/" + query, wait_until="commit")
                    page.evaluate(_READY, [query.count("run=") or 4, 120_000])
                    page.evaluate("""() => new Promise(r => { const t = () => (window.gradmon.board.dirty
                        || window.gradmon.board.frame) ? setTimeout(t, 50) : setTimeout(r, 400); t(); })""")
                    path = os.path.join(out_dir, name + ".png")
                    page.screenshot(path=path, full_page=full)
                    written.append(path)
                    ctx.close()
            finally:
                browser.close()
    return written


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Screenshots of the page on the four-run set (docs/img), "
                                     "or this page against another build's (--compare).")
    parser.add_argument("--screenshots", metavar="DIR", help="where to write the PNGs")
    parser.add_argument("--compare", metavar="[LABEL=]TREE", action="append",
                        help="a checkout with its page built (the previous release; label 'prev'); repeat "
                             "for more (LABEL=TREE), each timed beside this checkout ('this')")
    parser.add_argument("--tensorboard", metavar="CMD",
                        help="with --compare: also time TensorBoard's default page on the same runs, with "
                             "this tensorboard executable (its own venv; e.g. /work/tbvenv/bin/tensorboard)")
    parser.add_argument("--chart-ready", type=int, metavar="N", default=0,
                        help="with --compare: also chart_ready_ms of one run of N records for each tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--four-only", action="store_true",
                        help="with --compare: open only the four runs (not also one run) in each round")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(STATIC_INDEX), "..", "..",
                                                          "benchmarks", "out"))
    args = parser.parse_args()
    if args.compare:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        trees = {}
        for k, spec in enumerate(args.compare):
            default = "prev" if k == 0 else f"tree{k}"
            label, _, tree = spec.rpartition("=") if "=" in spec else (default, "", spec)
            if not os.path.exists(os.path.join(tree, "gradmon", "static", "index.html")):
                parser.error(f"{tree} has no built page: cd {tree}/dashboard && npm ci && npm run build")
            trees[label] = tree
        trees["this"] = here
        result = compare_builds(trees, args.rounds, args.out_dir, args.steps, tensorboard=args.tensorboard,
                                cases=("four",) if args.four_only else ("one", "four"))
        if args.chart_ready:
            result["chart_ready"] = compare_chart_ready(trees, args.rounds, args.out_dir, args.chart_ready)
        print(json.dumps(result, indent=1))
    if args.screenshots:
        for shot in screenshots(args.screenshots, args.steps):
            print(shot)
