"""Browser tests of the page with no server: a metrics.jsonl replayed from disk (the format's
compatibility rules for other writers included), and a static export (``window.GRADMON_EXPORT`` set by
``static/export-data.js`` beside the page, as ``gradmon export`` writes it) opened from file://.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradmon.logformat.jsonl import encode_record
from tests.page_browser import STATIC, T0, Page, browser, header, page, step

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "page"]  # fixtures, imported for pytest


def test_offline_replay_from_disk_reads_other_writers_lines(tmp_path: Path, page: Page) -> None:
    log = tmp_path / "metrics.jsonl"
    recs = [header()] + [step(s) for s in range(1, 101)]
    recs[50] = step(50, loss="NaN", nonfinite=True)
    lines = [encode_record(r) for r in recs]
    lines.insert(10, "this is not json\n")
    # Another writer's lines: no "type", Python's json.dumps tokens for non-finite floats.
    lines += ['{"step": 101, "loss": 0.5, "lr": 0.001, "throughput": 900.0}\n',
              '{"step": 102, "loss": NaN, "lr": 0.001, "throughput": Infinity}\n',
              '{"loss": 1.0}\n']  # neither type nor step: malformed
    log.write_text("".join(lines) + '{"type":"step","step":103,"lo', encoding="utf-8")  # partial last line
    page.page.goto(STATIC.joinpath("index.html").as_uri())
    page.wait("window.gradmon && window.gradmon.state.mode === 'offline'")
    assert page.page.locator("#conn").inner_text() == "offline"
    page.page.set_input_files("#file", str(log))
    page.wait("window.gradmon.pointCount('replay: metrics.jsonl', 'loss') === 102")
    notice = page.page.locator("#notice").inner_text()
    assert "103 records" in notice and "skipped 3 malformed lines" in notice and "partial" in notice
    run = "window.gradmon.state.runs.get('replay: metrics.jsonl')"
    assert page.eval(f"{run}.valueAt('loss', 101)") == {"step": 101, "value": 0.5, "exact": True}
    assert page.eval(f"{run}.valueAt('throughput', 102).value") == float("inf")
    marks = page.wait("window.gradmon.markers('loss').length ? window.gradmon.markers('loss') : null")
    assert [(m["step"], m["label"]) for m in marks] == [(50, "NaN"), (102, "NaN")]
    page.wait("document.querySelectorAll('.chart-card canvas').length >= 4")
    # dropping a file onto the page replays it too
    dropped = encode_record(step(1)) + encode_record(step(2, loss="Infinity"))
    page.eval("""(text) => { const dt = new DataTransfer();
        dt.items.add(new File([text], 'dropped.jsonl'));
        window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, cancelable: true})); }""",
              dropped)
    page.wait("window.gradmon.pointCount('replay: dropped.jsonl', 'loss') === 2")
    assert page.eval("window.gradmon.selected()") == ["replay: metrics.jsonl", "replay: dropped.jsonl"]
    # offline: nothing but the page's own files was requested, no API and no WebSocket
    assert page.requests and all(u.startswith(("file://", "data:")) for u in page.requests)
    assert page.errors == []


def _run_text(n: int, status: str, lr: float, t0: float) -> str:
    recs = [header(t0=t0, config={"lr": lr, "batch_size": 64})]
    recs += [step(s, t0=t0, loss=3.0 / (1 + 0.02 * s)) for s in range(1, n + 1)]
    recs.append({"type": "event", "kind": "alarm", "step": n // 2, "ts": t0 + n / 20, "reason": "loss_spike",
                 "field": "loss", "value": 9.0, "baseline": 1.0, "message": "loss 9x"})
    recs.append({"type": "end", "ts": t0 + n / 10, "status": status, "steps": n, "dropped_records": 0})
    return "".join(encode_record(r) for r in recs)


def test_static_export_opens_from_disk_with_its_runs_and_view(tmp_path: Path, browser: object) -> None:
    out = tmp_path / "export"
    shutil.copytree(STATIC, out)
    data = {"runs": [{"name": "exp1", "jsonl": _run_text(300, "finished", 3e-4, T0)},
                     {"name": "sweep/exp2", "jsonl": _run_text(200, "aborted", 1e-3, T0 + 500)}],
            "created": T0 + 1000, "view": "smooth=0.5&hide=lr&zoom=10,150"}  # as gradmon export writes it
    (out / "static").mkdir(exist_ok=True)
    (out / "static" / "export-data.js").write_text("window.GRADMON_EXPORT = " + json.dumps(data) + ";\n")
    index = out / "index.html"
    html = index.read_text()
    assert '<script src="static/main.js">' in html
    tag = '<script src="static/export-data.js"></script>\n'
    index.write_text(html.replace('<script src="static/main.js">', tag + '<script src="static/main.js">'))
    p = Page(browser)
    try:
        p.page.goto(index.as_uri())
        p.ready(2)
        g = "window.gradmon"
        assert p.eval(f"{g}.state.mode") == "offline" and p.eval(f"{g}.state.exported") is True
        assert p.page.locator("#conn").inner_text() == "static export"
        assert p.eval(f"{g}.selected()") == ["sweep/exp2", "exp1"]
        assert p.eval(f"{g}.pointCount('exp1', 'loss')") == 300
        # the exported view: smoothing, a hidden chart, the zoom
        assert p.page.locator("#smoothing").input_value() == "0.5"
        assert "lr" not in p.eval(f"{g}.panels()")
        p.wait(f"(() => {{ const z = {g}.zoom(); return z && z.startValue === 10 && z.endValue === 150 }})()")
        # statuses from the runs' end records, their config in the table, their alarms in the banner
        assert "aborted" in p.page.locator("#runs-table tr[data-run='sweep/exp2']").inner_text()
        assert p.page.locator("#runs-table th.cfg.differs").all_inner_texts() == ["lr"]
        assert p.page.locator("#banner button.incident").count() == 2
        # smoothing over every step (the export holds every record)
        assert p.eval(f"{g}.state.runs.get('exp1').smoothed('loss', 0.5).quality") == "exact"
        assert p.requests and all(u.startswith(("file://", "data:")) for u in p.requests)
        assert p.shot("static-export").stat().st_size > 10_000
        assert p.errors == []
    finally:
        p.close()
