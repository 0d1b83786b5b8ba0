"""Browser tests of what the page computes from the data: smoothing exact at every zoom (against an
EMA over every step), exports equal to the log, and detector marks and alarms that are the same set
at every history size and zoom level of one 20k-step run.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from benchmarks.page_section import write_four_runs
from gradmon.logformat.reader import read_records
from tests.page_browser import (
    Page,
    append,
    browser,
    ema_debiased,
    header,
    logdir,
    page,
    start_server,
    step,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]
__all__ = ["browser", "logdir", "page"]  # fixtures, imported for pytest

N = 6000


def noisy_run(path: Path, n: int = N) -> list[dict]:
    """A run whose curves an EMA over downsampled points gets visibly wrong: noise, bursts, a NaN."""
    recs: list = [header()]
    for s in range(1, n + 1):
        norm = 0.4 + 0.3 * abs(math.sin(s * 0.7)) + (25.0 if s % 997 == 0 else 0.0)
        recs.append(step(s, loss=2.0 + 8.0 * math.exp(-s / 500) + 0.3 * math.sin(s * 1.3), grad_norm=norm))
    recs[4001] = step(4001, loss="NaN", grad_norm="NaN", nonfinite=True, skipped=True)
    append(path, recs)
    return recs[1:]


def drawn(p: Page, run: str, field: str, panel: str) -> list[list[float]]:
    return p.eval("([p, r, f]) => window.gradmon.smoothedDrawn(p, r, f)", [panel, run, field])


def check_exact(points: list[list[float]], ref: dict[int, float], lo: float, hi: float, tol: float) -> int:
    """Every drawn smoothed point in [lo, hi] equals the reference EMA at its step; returns how many."""
    inside = [(s, v) for s, v in points if lo <= s <= hi and v is not None]
    for s, v in inside:
        assert abs(v - ref[s]) <= tol * max(1.0, abs(ref[s])), (s, v, ref[s])
    return len(inside)


def test_smoothing_is_an_ema_over_every_step_at_three_zooms(logdir: Path, browser: object) -> None:
    recs = noisy_run(logdir / "noisy" / "metrics.jsonl")
    refs = {f: dict(zip(range(1, N + 1), ema_debiased([float(r[f]) for r in recs], 0.99)))
            for f in ("loss", "grad_norm")}
    p = Page(browser, viewport=(1000, 800))
    try:
        # (read 512 bytes a tick: the page may open while the log is still being indexed, and its
        # run list then undercounts the run; the page must still end up with every step)
        with start_server(logdir, "127.0.0.1", port=0, poll_max_bytes=512, poll_idle_max_bytes=512) as server:
            p.page.goto(server.url.split("?")[0] + "?smooth=0.99")
            p.ready(1)
            run = "window.gradmon.state.runs.get('noisy')"
            p.wait(f"{run}.exact && {run}.pointCount('loss') === {N}")  # fetched at full resolution
            for lo, hi in ((1, N), (2000, 4000), (3000, 3100)):
                if hi - lo < N - 1:
                    p.eval(f"window.gradmon.board.zoomTo({lo}, {hi})")
                    p.wait(f"window.location.search.includes('zoom={lo},{hi}')")
                p.settled()
                for field in ("loss", "grad_norm"):
                    count = check_exact(drawn(p, "noisy", field, field), refs[field], lo, hi, 1e-9)
                    assert count >= min(100, hi - lo), (field, lo, hi, count)
                badges = p.page.locator(".chart-card[data-panel='loss'] .badges")
                assert "≈ smoothing" not in badges.inner_text()
        assert p.errors == []
    finally:
        p.close()


def test_beyond_the_full_resolution_bound_smoothing_is_marked_then_exact_in_a_zoom_with_lead_in(
        logdir: Path, browser: object) -> None:
    recs = noisy_run(logdir / "noisy" / "metrics.jsonl")
    ref = dict(zip(range(1, N + 1), ema_debiased([float(r["loss"]) for r in recs], 0.99)))
    p = Page(browser, viewport=(1000, 800))
    try:
        with start_server(logdir, "127.0.0.1", port=0) as server:
            # fullres=2000: this 6000-step run is "too long" to hold at full resolution
            p.page.goto(server.url.split("?")[0] + "?smooth=0.99&fullres=2000")
            p.ready(1)
            assert p.eval("window.gradmon.state.runs.get('noisy').exact") is False
            badges = "document.querySelector(\".chart-card[data-panel='loss'] .badges\").textContent"
            p.wait(f"{badges}.includes('≈ smoothing')")  # honest: approximate, and says so
            p.eval("window.gradmon.board.zoomTo(4500, 5000)")
            run = "window.gradmon.state.runs.get('noisy')"
            p.wait(f"{run}.detail && {run}.detail.exact && {run}.detail.start === 3500")  # 1000-step lead-in
            p.wait(f"!{badges}.includes('≈')")
            p.settled()
            # within the documented bound: the omitted history weighs <= e^-10 of the EMA
            count = check_exact(drawn(p, "noisy", "loss", "loss"), ref, 4500, 5000, 5e-4)
            assert count >= 100
        assert p.errors == []
    finally:
        p.close()


def test_exports_hold_every_step_of_the_zoomed_range_as_logged(logdir: Path, browser: object,
                                                               tmp_path: Path) -> None:
    recs = noisy_run(logdir / "noisy" / "metrics.jsonl")
    by_step = {r["step"]: r for r in recs}
    p = Page(browser, viewport=(1000, 800), accept_downloads=True)
    try:
        with start_server(logdir, "127.0.0.1", port=0) as server:
            p.page.goto(server.url)
            p.ready(1)
            assert p.eval("window.gradmon.state.runs.get('noisy').exact") is False  # downsampled in memory
            p.eval("window.gradmon.board.zoomTo(3990, 4500)")
            p.wait("window.location.search.includes('zoom=3990,4500')")
            card = p.page.locator(".chart-card[data-panel='loss']")
            card.locator("details.menu summary").click()
            with p.page.expect_download() as dl:
                card.locator("button[data-act='csv']").click()
            path = tmp_path / dl.value.suggested_filename
            dl.value.save_as(path)
            assert path.name == "gradmon-loss-3990-4500.csv"
            rows = list(csv.DictReader(io.StringIO(path.read_text())))
            train = [r for r in rows if r["field"] == "loss"]
            # every step, not the drawn points
            assert [int(r["step"]) for r in train] == list(range(3990, 4501))
            for r in train:
                want = by_step[int(r["step"])]
                got = float(r["value"])
                assert (math.isnan(got) and want["loss"] == "NaN") or got == want["loss"], r
                assert float(r["wall_time"]) == pytest.approx(want["ts"], abs=1e-6)
            assert {r["run"] for r in rows} == {"noisy"}
            # JSON of the grad-norm chart: strict JSON, the NaN step as the log writes it
            text = p.eval("window.gradmon.exportChart('grad_norm', 'json').then(r => r.text)")
            doc = json.loads(text)
            series = doc["series"][0]
            assert series["run"] == "noisy" and series["exact"] is True and doc["x_range"] == [3990, 4500]
            assert series["step"] == list(range(3990, 4501))
            assert series["value"][4001 - 3990] == "NaN"
            assert series["value"][0] == by_step[3990]["grad_norm"]
            # PNG of a chart
            card.locator("details.menu summary").click()
            with p.page.expect_download() as dl:
                card.locator("button[data-act='png']").click()
            png = tmp_path / "chart.png"
            dl.value.save_as(png)
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert p.errors == []
    finally:
        p.close()


@pytest.fixture(scope="module")
def spiky_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("spiky")
    written = write_four_runs(str(root), 20_000, names=("spiky-nan",))["spiky-nan"]
    return root, written


@pytest.mark.parametrize("points", [400, 1900, 7200])
def test_marks_and_alarms_are_the_same_at_every_history_size_and_zoom(spiky_run: tuple[Path, dict],
                                                                      points: int, browser: object) -> None:
    root, written = spiky_run
    flagged = written["flagged"]
    # the log itself: what a reader at full resolution sees
    steps = [r for r in read_records(written["path"]) if r["type"] == "step"]
    assert [r["step"] for r in steps if r.get("spike")] == flagged["spike"]
    p = Page(browser, viewport=(1300, 900))
    try:
        with start_server(root, "127.0.0.1", port=0) as server:
            p.page.goto(server.url.split("?")[0] + f"?points={points}")
            p.ready(1)
            g = "window.gradmon"
            assert p.eval(f"{g}.pointCount('spiky-nan', 'grad_norm')") < 20_000
            for zoom in (None, (11_000, 13_000), (11_990, 12_030)):
                if zoom:
                    p.eval(f"{g}.board.zoomTo({zoom[0]}, {zoom[1]})")
                    p.wait(f"window.location.search.includes('zoom={zoom[0]},{zoom[1]}')")
                p.settled()
                for kind in ("spike", "skip", "nonfinite"):
                    assert p.eval(f"{g}.marks('spiky-nan', '{kind}')") == flagged[kind], (kind, points, zoom)
                markers = p.eval(f"{g}.markers('grad_norm')")
                spikes = sorted(m["step"] for m in markers if m["role"] == "spike")
                assert spikes == flagged["spike"], (points, zoom)
                assert [m["step"] for m in markers if m["role"] == "nonfinite"] == flagged["nonfinite"]
                got = p.eval(f"{g}.incidents()")
                incidents = [(i["reason"], i["start"], i["end"], i["flagged"]) for i in got]
                assert incidents == written["incidents"]
            assert p.page.locator("#banner button.incident").count() == 2
        assert p.errors == []
    finally:
        p.close()


def test_four_runs_alarm_banner_grouped_per_run_and_incident(tmp_path: Path, browser: object) -> None:
    written = write_four_runs(str(tmp_path), 2000)
    p = Page(browser, viewport=(1400, 900))
    try:
        with start_server(tmp_path, "127.0.0.1", port=0) as server:
            p.page.goto(server.url)
            p.ready(4)
            groups = p.page.locator("#banner .banner-run")
            names = [groups.nth(i).get_attribute("data-run") for i in range(groups.count())]
            assert names == ["diverged", "spiky-nan"]
            assert groups.nth(1).locator("button.incident").count() == 2
            title = p.page.locator("#banner .banner-title").inner_text()
            assert title == "⚠ 3 alarms in 2 runs"
            burst = groups.nth(1).locator("button.incident").first
            _reason, start, end, count = written["spiky-nan"]["incidents"][0]
            want = f"gradient-norm spike · steps {start}–{end} · {count} flagged steps"
            assert burst.inner_text().startswith(want)
            burst.click()
            z = p.wait("(() => { const z = window.gradmon.zoom(); return z && z.end - z.start < 50 && z })()")
            assert z["startValue"] < start and z["endValue"] > end
            # the diverged run's norm spans four decades: its chart went to log scale by itself
            p.settled()
            assert "log (auto)" in p.page.locator(".chart-card[data-panel='grad_norm'] .badges").inner_text()
        assert p.errors == []
    finally:
        p.close()
