"""Browser test: a run with an automatic-recovery rollback shows it on its charts — a pin and a dashed
line at the restored step, the rollback's message in the tooltip there — and one value per step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.page_browser import T0, Page, append, browser, header, logdir, page, start_server, step

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "logdir", "page"]  # fixtures, imported for pytest

MESSAGE = ("rolled back to the snapshot after step 40: alarm (nonfinite) from step 45; 7 batches skipped "
           "(steps 41-45 abandoned, the next 2 batches undone)")


def rolled_back_run(logdir: Path) -> None:
    first = [header()] + [step(s) for s in range(1, 45)] + [
        step(45, loss=math.nan, grad_norm=math.inf, nonfinite=True),
        {"type": "end", "ts": T0 + 5, "status": "rolled_back", "steps": 45}]
    second = {**header(t0=T0 + 6), "initial_step": 40, "initial_step_from": "rollback"}
    event = {"type": "event", "kind": "rollback", "step": 40, "ts": T0 + 6, "restored_step": 40,
             "from_step": 45, "incident_step": 45, "reason": "alarm", "detail": "nonfinite",
             "batches_skipped": 7, "hold": 2, "rollbacks": 1, "message": MESSAGE}
    rest = [step(s, t0=T0 + 2, loss=1.5 - s / 1000) for s in range(41, 81)]
    append(logdir / "exp" / "metrics.jsonl", [*first, second, event, *rest])


def test_a_rollback_is_marked_on_every_chart_with_its_message(logdir: Path, page: Page) -> None:
    rolled_back_run(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(1)
        assert page.eval("window.gradmon.pointCount('exp', 'loss')") == 80  # 41-45 replaced
        for panel in ("loss", "grad_norm"):
            page.show_chart(panel)
            pins = [m for m in page.eval(f"window.gradmon.markers('{panel}')") if m["role"] == "rollback"]
            assert [(m["run"], m["step"]) for m in pins] == [("exp", 40)]
        lines = page.eval("""window.gradmon.board.panels.get('loss').series
            .filter(s => s.gradmonRole === 'rollback').map(s => s.markLine.data.map(d => d.xAxis))""")
        assert lines == [[40]]
        # Hover the loss chart at step 40: the tooltip names the rollback and why.
        page.show_chart("loss")
        xy = page.eval("""(() => { const c = window.gradmon.board.panels.get('loss');
            const s = c.series.find(x => x.gradmonRole === 'rollback');
            return c.chart.convertToPixel({gridIndex: 0}, [40, s.data[0].value[1]]); })()""")
        box = page.page.locator(".chart-card[data-panel='loss'] .chart").bounding_box()
        page.page.mouse.move(box["x"] + xy[0], box["y"] + xy[1] - 3)
        tip = page.wait("""(() => { const t = [...document.querySelectorAll('.tt')].find(e => e.offsetParent);
                                    return t && t.innerText })()""")
        assert tip.startswith("step 40") and "rollback (" + MESSAGE in tip
    assert page.errors == []
