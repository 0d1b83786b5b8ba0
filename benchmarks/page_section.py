"""Section ``page``: the dashboard in headless Chromium (Debian's ``/usr/bin/chromium`` via
Playwright; no browser is ever downloaded).

- ``chart_ready_ms``: navigation start -> the history response of the big run has arrived, the
  network is idle and two animation frames have run after that (so the chart's first render is
  painted). ``first_contentful_paint_ms`` is the browser's own FCP of the page shell.
- ``fps_streaming``: ``requestAnimationFrame`` callbacks per second while a live run grows at
  ``rate`` records/s; ``long_tasks`` counts main-thread tasks > 50 ms in that window.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.runlogs import ensure_run_log, generate_run_log, step_record
from benchmarks.server_section import serve, server_unavailable_reason

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
        return {
            "chart_ready_ms": ready,
            "first_contentful_paint_ms": fcp,
            "history_status": resp.status,
            "history_bytes": len(resp.body()),
        }
    finally:
        page.close()


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
                    from gradmon.jsonl import encode_record

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
        finally:
            browser.close()
    log(
        f"  chart ready {result.get('chart_ready_ms', float('nan')):.0f} ms, "
        f"{result.get('fps_streaming', float('nan')):.0f} fps while streaming"
    )
    return result
