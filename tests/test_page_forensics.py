"""The page's alarm detail view in Chromium: an alarm's forensics (layers as bars, ranks as a strip,
sample ids as text) beside the charts, opened from the banner at any zoom.

The log holds the alarm event of tests/test_forensics_dp.py's injected fault as LiveMonitor wrote
it (the forensics of rank 1's poisoned sample 379), served by a real `gradmon serve`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.page_browser import T0, Page, append, browser, header, logdir, page, start_server, step

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "logdir", "page"]

FORENSICS = {
    "step": 24,
    "layers": [{"name": "body.0.weight", "grad_norm": 2121.4483260263496},
               {"name": "body.2.weight", "grad_norm": 1010.3972609820357},
               {"name": "body.4.weight", "grad_norm": 561.06115976781},
               {"name": "body.4.bias", "grad_norm": 2.1986866064946824},
               {"name": "body.2.bias", "grad_norm": 1.0266393995586154},
               {"name": "body.0.bias", "grad_norm": 0.7390924669444692}],
    "layer_count": 6, "rank_norms": [0.4645042419433594, 4831.5234375], "top_rank": 1,
    "sample_ids": [[368, 370, 372, 374, 376, 378, 380, 382], [369, 371, 373, 375, 377, 379, 381, 383]],
    "grouped": False,
}


def _log(path: Path) -> None:
    records = [header()] + [step(s) for s in range(1, 24)]
    records += [step(24, grad_norm=2415.8), {
        "type": "event", "kind": "alarm", "step": 24, "ts": T0 + 2.4, "reason": "grad_norm_spike",
        "field": "grad_norm", "value": 2415.8, "baseline": 0.41,
        "message": "gradient norm 2416 is 5895x its running median", "forensics": FORENSICS}]
    records += [step(s) for s in range(25, 90)]
    records += [{"type": "event", "kind": "alarm_end", "step": 24, "ts": T0 + 7.5, "start": 24, "flagged": 1,
                 "message": "closed"}]
    records += [step(90, loss="NaN", nonfinite=True),
                {"type": "event", "kind": "alarm", "step": 90, "ts": T0 + 9, "reason": "nonfinite",
                 "field": "loss", "value": "NaN", "message": "non-finite loss"}]
    append(path, records)


def test_alarm_detail_shows_layers_ranks_and_samples_beside_the_charts_at_any_zoom(logdir: Path,
                                                                                   page: Page) -> None:
    _log(logdir / "dp" / "metrics.jsonl")
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(1)
        lines = page.page.locator("#banner button.incident")
        page.wait("document.querySelectorAll('#banner button.incident').length === 2")
        spike = lines.filter(has_text="gradient-norm spike")
        assert "top layer body.0.weight · rank 1" in spike.inner_text()
        assert page.page.locator("#alarm-detail").is_hidden()

        # Zoomed far from the alarm (steps ~60-85): its banner line is still there; a click zooms back
        # to it and opens the detail view.
        page.drag("grad_norm", 0.68, 0.95)
        page.wait("(() => { const z = window.gradmon.zoom(); return z && z.startValue > 30 })()")
        spike.click()
        page.wait("window.gradmon.alarmDetail() !== null")
        zoom = page.wait("(() => { const z = window.gradmon.zoom(); return z && z.startValue <= 24 && z })()")
        assert zoom["startValue"] <= 24 <= zoom["endValue"]
        shown = page.eval("window.gradmon.alarmDetail()")
        assert (shown["run"], shown["step"], shown["reason"]) == ("dp", 24, "grad_norm_spike")
        detail = page.page.locator("#alarm-detail")
        assert detail.is_visible()
        # Layers: a bar list, largest first, bars relative to the largest.
        rows = detail.locator(".bar-row")
        assert rows.count() == 6
        assert rows.first.get_attribute("data-name") == "body.0.weight"
        widths = page.eval("Array.from(document.querySelectorAll('#alarm-detail .bar'))"
                           ".map(b => parseFloat(b.style.width))")
        assert widths[0] == 100.0 and widths[1] == pytest.approx(100 * 1010.397 / 2121.448, abs=0.06)
        assert "2121.4" in rows.first.inner_text()
        # Ranks: a strip, rank 1 marked.
        cells = detail.locator(".rank-cell")
        assert cells.count() == 2
        assert detail.locator(".rank-cell.top").get_attribute("data-rank") == "1"
        assert "Largest: rank 1" in detail.inner_text()
        # Samples: each rank's ids as text, the spiking rank's first in weight.
        top_ids = detail.locator(".sample-ids.top")
        assert top_ids.get_attribute("data-rank") == "1" and "379" in top_ids.inner_text()
        # Beside the charts, inside the window, not pushing the page wider.
        box = detail.bounding_box()
        chart = page.page.locator(".chart-card[data-panel='grad_norm']").bounding_box()
        width = page.eval("window.innerWidth")
        assert box["x"] > chart["x"] and box["x"] + box["width"] <= width and box["y"] < 900
        assert page.eval("document.documentElement.scrollWidth <= window.innerWidth")
        page.shot("alarm-detail", full_page=False)

        # It stays at every zoom: back to every step, then zoomed elsewhere again.
        page.page.locator("#reset-zoom").click()
        page.wait("window.gradmon.zoom().start === 0 && window.gradmon.zoom().end === 100")
        assert detail.is_visible()
        page.drag("grad_norm", 0.7, 0.9)
        page.wait("(() => { const z = window.gradmon.zoom(); return z && z.startValue > 30 })()")
        assert detail.is_visible() and page.eval("window.gradmon.alarmDetail().step") == 24

        # An alarm without forensics says so; Escape closes the view.
        lines.filter(has_text="non-finite").click()
        page.wait("window.gradmon.alarmDetail() && window.gradmon.alarmDetail().step === 90")
        assert "No forensics in this alarm" in detail.inner_text() and detail.locator(".bar-row").count() == 0
        page.page.keyboard.press("Escape")
        page.wait("window.gradmon.alarmDetail() === null")
        assert detail.is_hidden()
        assert page.errors == []
