"""Browser tests of the page's view: the view state in the URL (restored on load and reload), the run
table (config diff, regex filter), chart sections, hiding and expanding charts, per-chart y scale and
outlier range, drag-box zoom, the compact tooltip, dark mode and a 390 px wide layout.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.page_browser import T0, Page, append, browser, header, logdir, page, start_server, step

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "logdir", "page"]  # fixtures, imported for pytest


def three_runs(logdir: Path) -> None:
    """exp-a and exp-b differ in lr; `other` is another experiment. 200 steps each."""
    for k, (name, lr) in enumerate((("exp-a", 3e-4), ("exp-b", 1e-3), ("other", 3e-4))):
        t0 = T0 + 100 * k
        cfg = {"lr": lr, "model": {"name": "mlp", "width": 64}, "batch_size": 32}
        recs = [header(t0=t0, config=cfg)]
        for s in range(1, 201):
            recs.append(step(s, t0=t0, loss=2.0 / (1 + 0.01 * s) + 0.1 * k, clip_coef=1.0,
                             grad_norm=0.5 + 0.1 * math.sin(s) + (40.0 if s == 150 else 0.0)))
        append(logdir / name / "metrics.jsonl", recs)


def test_view_round_trips_through_the_url_and_survives_a_reload(logdir: Path, page: Page) -> None:
    three_runs(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        base = server.url.split("?")[0]
        query = ("?run=exp-b&filter=exp&smooth=0.6&zoom=20,120&log=grad_norm&outliers=loss"
                 "&hide=step_time&expand=loss")
        page.page.goto(base + query)
        page.ready(1)
        g = "window.gradmon"
        # restored: runs, filter, smoothing, zoom, scales, outlier setting, hidden and expanded charts
        assert page.eval(f"{g}.selected()") == ["exp-b"]
        assert page.page.locator("#run-filter").input_value() == "exp"
        assert page.page.locator("#smoothing").input_value() == "0.6"
        zoom = page.wait(f"(() => {{ const z = {g}.zoom(); return z && z.startValue === 20 && z }})()")
        assert zoom["endValue"] == 120
        page.settled()
        assert page.eval(f"{g}.board.panels.get('grad_norm').chart.getOption().yAxis[0].type") == "log"
        assert page.page.locator(".chart-card[data-panel='loss'] .ignore-outliers").is_checked() is False
        assert "step_time" not in page.eval(f"{g}.panels()")
        assert page.page.locator(".hidden-charts button[data-panel='step_time']").count() == 1
        assert "expanded" in page.page.locator(".chart-card[data-panel='loss']").get_attribute("class")
        assert page.page.url == base + query  # unchanged: the page writes back what it read

        # The user works: another run, the other outlier toggle, a y scale, a hidden chart, x mode.
        page.page.locator("#runs-table tr[data-run='exp-a'] input[type=checkbox]").check()
        page.page.locator(".chart-card[data-panel='grad_norm'] .ignore-outliers").uncheck()
        page.page.locator(".chart-card[data-panel='lr'] select.yscale").select_option("linear")
        page.page.locator(".chart-card[data-panel='throughput'] details.menu summary").click()
        page.page.locator(".chart-card[data-panel='throughput'] button[data-act='hide']").click()
        page.page.locator(".chart-card[data-panel='loss'] .expand").click()
        page.page.select_option("#xmode", "relative")
        q = "window.location.search"
        page.wait(f"{q}.includes('x=relative') && {q}.includes('hide=throughput')")
        page.wait("!window.location.search.includes('zoom=')")  # a new x mode shows everything again
        view = page.eval(f"{g}.view()")
        assert view["runs"] == ["exp-b", "exp-a"]
        assert view["scale"] == {"grad_norm": "log", "lr": "linear"}
        assert view["outliers"] == {"loss": "show", "grad_norm": "show"}
        assert view["hidden"] == ["step_time", "throughput"]
        assert view["expanded"] is None and view["xMode"] == "relative" and view["smoothing"] == 0.6
        url = page.page.url

        page.page.reload()
        page.ready(2)
        assert page.page.url == url
        assert page.eval(f"{g}.view()") == view
        assert page.eval(f"{g}.selected()") == ["exp-b", "exp-a"]
        assert set(page.eval(f"{g}.panels()")).isdisjoint({"step_time", "throughput"})
        assert page.page.locator("#xmode").input_value() == "relative"
        # and a hidden chart comes back from its button in the section's head
        page.page.locator(".hidden-charts button[data-panel='throughput']").click()
        page.wait(f"{g}.panels().includes('throughput')")
        page.wait("!window.location.search.includes('hide=throughput')")
    assert page.errors == []


def test_run_table_config_diff_and_regex_filter(logdir: Path, page: Page) -> None:
    three_runs(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(3)
        heads = page.page.locator("#runs-table th.cfg")
        assert heads.all_inner_texts() == ["lr", "batch_size", "model.name", "model.width"]  # differing first
        assert page.page.locator("#runs-table th.cfg.differs").all_inner_texts() == ["lr"]
        row = page.page.locator("#runs-table tr[data-run='exp-b']")
        assert row.locator("td.cfg.differs").inner_text() == "0.001"
        assert row.locator(".steps").inner_text() == "200"
        last_loss = page.eval("window.gradmon.state.runs.get('exp-b').lastValue('loss')")
        assert row.locator(".last-loss").inner_text() == page.eval(f"GradmonLib.formatValue({last_loss})")
        assert "finished" not in row.inner_text()  # no end record: the server calls it live or stale
        # regex filter: runs that do not match leave the table and the charts
        page.page.locator("#run-filter").fill("^exp-(a|b)$")
        page.wait("document.querySelectorAll('#runs-table tr.run').length === 2")
        raw = "window.gradmon.board.panels.get('loss').series.filter(s => s.id.endsWith('|raw'))"
        page.wait(f"{raw}.length === 2")
        page.wait("window.location.search === '?filter=%5Eexp-(a%7Cb)%24'")
        page.page.locator("#diff-only").check()
        assert page.page.locator("#runs-table th.cfg").all_inner_texts() == ["lr"]
        page.page.locator("#run-filter").fill("(")
        page.wait("document.querySelector('#run-filter').classList.contains('invalid')")
        assert page.page.locator("#runs-table tr.run").count() == 0
        assert "No run matches" in page.page.locator("#runs-table").inner_text()
    assert page.errors == []


def test_sections_drag_box_zoom_expand_and_compact_tooltip(logdir: Path, page: Page) -> None:
    three_runs(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(3)
        assert page.eval("window.gradmon.sections()") == ["train", "defence", "system"]
        defence = page.page.locator(".chart-section[data-section='defence'] .chart-card")
        assert defence.get_attribute("data-panel") == "clip_coef"
        # Drag a box on the loss chart: every chart zooms to the same window, and the URL keeps it.
        page.drag("loss", 0.3, 0.6)
        page.wait("window.location.search.includes('zoom=')")
        windows = page.eval("""window.gradmon.panels().map(id => window.gradmon.board.panels.get(id))
            .filter(c => c.chart).map(c => { const dz = c.chart.getOption().dataZoom[0];
                                             return [dz.startValue, dz.endValue]; })""")
        assert len(windows) >= 4
        assert len({tuple(round(v, 6) for v in w) for w in windows}) == 1
        lo, hi = windows[0]
        assert 30 < lo < hi < 150
        page.page.locator(".chart-card[data-panel='lr'] .chart").dblclick()
        page.wait("!window.location.search.includes('zoom=')")
        # Expand: the chart takes the grid's width and most of the window's height.
        page.page.locator(".chart-card[data-panel='grad_norm'] .expand").click()
        page.wait("document.querySelector(\".chart-card[data-panel='grad_norm']\").classList.contains('expanded')")
        card = page.page.locator(".chart-card[data-panel='grad_norm']").bounding_box()
        grid = page.page.locator(".chart-section[data-section='train'] .charts").bounding_box()
        assert abs(card["width"] - grid["width"]) < 2
        page.wait("document.querySelector(\".chart-card[data-panel='grad_norm'] .chart\").clientHeight > 500")
        # Outliers ignored by default: the norm spike at 150 is beyond the range, marked at the edge.
        page.settled()
        clipped = [m for m in page.eval("window.gradmon.markers('grad_norm')") if m["role"] == "clipped"]
        runs = ("exp-a", "exp-b", "other")
        assert sorted((m["run"], m["step"]) for m in clipped) == [(r, 150) for r in runs]
        assert all(m["value"] > 40 for m in clipped)
        badges = page.page.locator(".chart-card[data-panel='grad_norm'] .badges")
        assert "3 beyond y range" in badges.inner_text()
        # The tooltip: this chart's field, one row per run, nothing else.
        box = page.page.locator(".chart-card[data-panel='loss'] .chart").bounding_box()
        page.page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.4)
        tip = page.wait("""(() => { const t = [...document.querySelectorAll('.tt')].find(e => e.offsetParent);
                                    return t && t.innerText })()""")
        assert tip.startswith("step ")
        assert sorted(line.split("\t")[0].strip() for line in tip.splitlines()[1:] if line.strip()) \
            == ["exp-a", "exp-b", "other"]
        assert "throughput" not in tip and "grad" not in tip
    assert page.errors == []


# The loss chart at the first animation frame to begin with it drawn: what that draw put on it, in
# window.__firstDrawn. An init script, watching from the document's start: evaluated after the
# navigation instead, a loaded machine could start it after the page had drawn and gone on.
_FIRST_DRAWN = """(() => {
  const tick = () => {
    const g = window.gradmon;
    const card = g && g.board && g.board.panels.get('loss');
    if (card && card.chart && g.drawnRuns('loss') > 0) {
      const o = card.chart.getOption();
      window.__firstDrawn = {runs: g.drawnRuns('loss'), interactive: card.interactive,
                             dataZoom: (o.dataZoom || []).length, tooltip: (o.tooltip || []).length,
                             lines: o.series.filter(s => s.type === 'line' && s.data.length).length};
      return;
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();"""


def test_the_viewport_is_drawn_first_and_its_tooltip_and_zoom_follow_and_work(logdir: Path,
                                                                               page: Page) -> None:
    # The viewport's charts are drawn without their interaction (tooltip, wheel and slider zoom),
    # which they get in the animation frames after (app/charts.js): the first look first, then all.
    three_runs(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.add_init_script(_FIRST_DRAWN)
        page.page.goto(server.url, wait_until="commit")
        first = page.wait("window.__firstDrawn", timeout=20.0)
        assert first == {"runs": 3, "interactive": False, "dataZoom": 0, "tooltip": 0, "lines": 3}
        page.ready(3)
        charts = page.eval("""window.gradmon.panels().map(id => window.gradmon.board.panels.get(id))
            .filter(c => c.chart).map(c => { const o = c.chart.getOption();
              return [c.interactive, o.dataZoom.map(d => d.type).sort(), o.tooltip.length]; })""")
        assert len(charts) >= 4
        assert all(c == [True, ["inside", "slider"], 1] for c in charts), charts
        # The slider: its right handle dragged to the middle zooms every chart to the same window.
        box = page.page.locator(".chart-card[data-panel='lr'] .chart").bounding_box()
        slider = page.eval("""(() => { const c = window.gradmon.board.panels.get('lr').chart;
            const m = c.getModel().getComponent('dataZoom', 1); const g = c.getViewOfComponentModel(m).group;
            const r = g.getBoundingRect();
            return {type: m.type, right: g.x + r.x + r.width, y: g.y + r.y + r.height / 2}; })()""")
        assert slider["type"] == "dataZoom.slider"
        y = box["y"] + slider["y"]
        page.page.mouse.move(box["x"] + slider["right"] - 4, y)
        page.page.mouse.down()
        page.page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=6)
        page.page.mouse.up()
        page.wait("window.location.search.includes('zoom=')")
        windows = page.eval("""window.gradmon.panels().map(id => window.gradmon.board.panels.get(id))
            .filter(c => c.chart).map(c => { const dz = c.chart.getOption().dataZoom[0];
                                             return [dz.startValue, dz.endValue]; })""")
        assert len({tuple(round(v, 6) for v in w) for w in windows}) == 1
        lo, hi = windows[0]
        assert lo < 5 and 60 < hi < 140, windows[0]
        # The tooltip, on a chart of the first viewport.
        box = page.page.locator(".chart-card[data-panel='loss'] .chart").bounding_box()
        page.page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.4)
        tip = page.wait("""(() => { const t = [...document.querySelectorAll('.tt')].find(e => e.offsetParent);
                                    return t && t.innerText })()""")
        assert tip.startswith("step ") and "exp-a" in tip
    assert page.errors == []


def test_phone_width_has_no_horizontal_overflow_and_dark_mode_follows_the_system(logdir: Path,
                                                                                  browser: object) -> None:
    three_runs(logdir)
    phone = Page(browser, viewport=(390, 844), color_scheme="dark", is_mobile=True, has_touch=True)
    try:
        with start_server(logdir, "127.0.0.1", port=0) as server:
            phone.page.goto(server.url)
            phone.ready(3)
            widths = phone.eval("""[document.documentElement.scrollWidth, document.body.scrollWidth,
                window.innerWidth, ...[...document.querySelectorAll('.chart-card, .runs-panel, .topbar')]
                .map(e => Math.ceil(e.getBoundingClientRect().right))]""")
            assert max(widths) <= 390, widths
            # the run table scrolls inside its own box rather than widening the page
            assert phone.eval("document.querySelector('.table-wrap').scrollWidth") > 390
            bg = phone.eval("getComputedStyle(document.documentElement).backgroundColor")
            assert bg == "rgb(20, 24, 28)"  # the dark palette
            label = phone.eval("""window.gradmon.board.panels.get('loss').chart.getOption().yAxis[0]
                                  .axisLabel.color""")
            assert label == "#9aa4ae"  # the charts take the dark theme's colours
            assert phone.shot("phone-dark").stat().st_size > 10_000
        assert phone.errors == []
    finally:
        phone.close()


def test_many_runs_the_newest_ten_are_shown_with_a_note(logdir: Path, page: Page) -> None:
    for k in range(12):
        recs = [header(t0=T0 + k)] + [step(s, t0=T0 + k) for s in (1, 2, 3)]
        append(logdir / f"r{k:02d}" / "metrics.jsonl", recs)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(10)
        assert page.eval("window.gradmon.selected()") == [f"r{k:02d}" for k in range(11, 1, -1)]
        note = page.page.locator(".runs-note")
        assert note.is_visible()
        assert note.inner_text() == "Showing the 10 newest of 12 runs: tick others to add them."
        page.page.locator("#runs-table tr[data-run='r00'] input[type=checkbox]").check()
        page.wait("window.gradmon.selected().length === 11 && window.gradmon.pointCount('r00', 'loss') === 3")
        assert note.is_hidden()  # an explicit choice: no note
        colours = page.eval("window.gradmon.selected().map(n => window.gradmon.state.colors.get(n))")
        assert len(set(colours[:10])) == 10
    assert page.errors == []


def test_opening_asks_for_the_list_and_each_shown_history_once(logdir: Path, page: Page) -> None:
    # boot/early.js sends these before the page's scripts are parsed; the page takes its answers
    # (window.GradmonEarly, then null) and asks for nothing twice, with the URL's runs or without.
    for k in range(3):
        recs = [header(t0=T0 + k)] + [step(s, t0=T0 + k) for s in range(1, 41)]
        append(logdir / f"r{k}" / "metrics.jsonl", recs)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        for query, shown in (("", ["r2", "r1", "r0"]), ("?run=r0&run=gone&run=r2", ["r0", "r2"])):
            page.requests.clear()
            page.page.goto(server.url.rstrip("/") + "/" + query)
            names = str(shown)
            page.wait(f"window.gradmon && {names}.every(n => window.gradmon.loaded().includes(n)"
                      " && window.gradmon.pointCount(n, 'loss') === 40)", 30)
            page.wait("window.gradmon.state.connection === 'connected'")
            api = [u.split("/api/", 1)[1] for u in page.requests if "/api/" in u]
            lists = [u for u in api if u.split("?")[0] == "runs"]
            histories = sorted(u.split("/")[1] for u in api if "/history" in u)
            assert len(lists) == 1, api
            assert histories == sorted(shown), api  # one each, none for a run the list lacks
            # as many points as the page asks for before its charts exist: what the charts draw per
            # pixel of the width a card gets in the laid-out grid (not the 900 px assumed before
            # layout), one per pixel for each of several runs
            width = page.eval("GradmonLib.chartWidthIn(document.getElementById('charts').clientWidth)")
            points = page.eval("([w, n]) => window.GradmonLib.historyPoints(w, NaN, n)", [width, len(shown)])
            assert points == width
            assert points != page.eval("GradmonLib.historyPoints(GradmonLib.chartWidthIn(0), NaN, 2)")
            assert all(f"points={points}" in u for u in api if "/history" in u), (points, api)
            assert page.eval("window.GradmonEarly") is None  # taken by the page
            assert page.eval("window.gradmon.state.fetches") == 1  # the list only: its histories came early
            assert page.eval("window.gradmon.selected()") == (shown if query == "" else ["r0", "gone", "r2"])
    assert page.errors == []



def test_an_axis_whose_type_changes_keeps_the_theme_colours(logdir: Path, page: Page) -> None:
    # ECharts drops an axis's options when its type changes (value to log): the page gives the
    # theme's axis styles with every draw, so a log axis is not drawn in ECharts' default colours.
    three_runs(logdir)
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url + "?log=grad_norm")
        page.ready(3)
        css = page.eval("""(() => { const s = getComputedStyle(document.documentElement);
            return [s.getPropertyValue('--muted').trim(), s.getPropertyValue('--grid').trim()] })()""")
        axis = """((id) => { const y = window.gradmon.board.panels.get(id).chart.getOption().yAxis[0];
            return [y.type, y.axisLabel.color, y.splitLine.lineStyle.color] })"""
        assert page.eval(axis + "('grad_norm')") == ["log", *css]  # log at its first draw
        page.page.locator(".chart-card[data-panel='loss'] select.yscale").select_option("log")
        page.settled()
        assert page.eval(axis + "('loss')") == ["log", *css]  # and after a change
        page.page.locator(".chart-card[data-panel='loss'] select.yscale").select_option("linear")
        page.settled()
        assert page.eval(axis + "('loss')") == ["value", *css]
    assert page.errors == []


def test_a_run_left_alone_on_its_charts_is_fetched_again_at_two_points_per_pixel(logdir: Path,
                                                                                    page: Page) -> None:
    # Several runs share a chart at one point per pixel each, a run drawn alone gets two
    # (lib/opening.js): unticking the other run asks for the one left at twice the points.
    for k in range(2):
        append(logdir / f"r{k}" / "metrics.jsonl",
               [header(t0=T0 + k)] + [step(s, t0=T0 + k) for s in range(1, 3001)])
    with start_server(logdir, "127.0.0.1", port=0) as server:
        page.page.goto(server.url)
        page.ready(2)
        width = page.eval("window.gradmon.board.chartWidth()")
        asked = lambda: [int(u.split("points=")[1].split("&")[0]) for u in page.requests  # noqa: E731
                         if "/api/runs/r1/history" in u]
        assert len(asked()) == 1 and abs(asked()[0] - width) <= 4  # (before layout: the grid's estimate)
        page.page.locator("#runs-table tr[data-run='r0'] input[type=checkbox]").uncheck()
        page.wait("window.gradmon.selected().length === 1 && window.gradmon.loaded().includes('r1')")
        page.settled()
        assert asked()[1:] == [2 * width]
        assert page.eval("window.gradmon.drawnRuns('loss')") == 1
    assert page.errors == []
