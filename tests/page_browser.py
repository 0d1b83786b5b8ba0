"""Helpers of the page's browser tests (tests/test_page_*.py): Debian's Chromium via Playwright,
run-log builders, and a page wrapper that waits on conditions with deadlines (never on sleeps).

Each test module does ``from tests.page_browser import ...`` and gets the fixtures ``browser``,
``page`` and ``logdir`` by importing them; the module skips itself when Chromium, Playwright or the
built page is missing, and fails when the build is older than dashboard/src.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradmon.logformat.alarms import AlarmConfig
from gradmon.logformat.jsonl import encode_record

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
start_server = pytest.importorskip("gradmon.server.app").start_server


def stale_build() -> list[str]:
    """Why gradmon/static is not the build of dashboard/'s sources (edited, not rebuilt): the
    digest dashboard/build.mjs writes into index.html differs from the sources' (empty: up to date)."""
    dash = ROOT / "dashboard"
    files = [dash / "build.mjs", *(dash / "src").glob("*.html"), *(dash / "src").glob("*.css"),
             *(dash / "src").glob("*/*.js")]
    digest = hashlib.sha256()
    for rel in sorted(f.relative_to(dash).as_posix() for f in files):
        digest.update(rel.encode() + b"\0" + (dash / rel).read_bytes() + b"\0")
    index = STATIC / "index.html"
    built = re.search(r'<meta name="gradmon-sources" content="([0-9a-f]+)">',
                      index.read_text(encoding="utf-8") if index.exists() else "")
    return [] if built and built.group(1) == digest.hexdigest() else ["index.html", "build.mjs", "src/"]


# ---------------------------------------------------------------------------- run logs


def header(max_norm: float | None = 1.0, t0: float = T0, run_id: str = "0f" * 8,
           config: dict | None = None) -> dict:
    return {"type": "header", "schema": 1, "run_id": run_id, "start_time": t0, "host": "test", "pid": 1,
            "versions": {"gradmon": "0.1.0"}, "mode": "GRAPH", "device": "CPU", "world_size": 1, "rank": 0,
            "config": config if config is not None else {"lr": 1e-3}, "max_norm": max_norm,
            "spike_mode": "detect", "log_interval": 1,
            "alarm_rule": AlarmConfig().as_dict()}  # a writer that runs the rule: its alarms are written


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


def ema_debiased(values: list[float], alpha: float) -> list[float]:
    """The reference: TensorBoard's debiased EMA over every value (non-finite ones pass through)."""
    out, last, n = [], 0.0, 0
    for x in values:
        if not math.isfinite(x):
            out.append(x)
            continue
        last = last * alpha + (1 - alpha) * x
        n += 1
        out.append(last / (1 - alpha**n))
    return out


# ---------------------------------------------------------------------------- the page


class Page:
    """A page with its console errors and page errors collected."""

    def __init__(self, browser: object, viewport: tuple[int, int] = (1300, 900), **context: object) -> None:
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, **context)
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

    def ready(self, runs: int, timeout: float = 30.0) -> None:
        """Wait until ``runs`` runs are shown with their history loaded and charts drawn."""
        g = "window.gradmon"
        self.wait(f"""{g} && {g}.selected().length === {runs} && {g}.loaded().length >= {runs}
                      && {g}.panels().length > 0
                      && {g}.selected().every(n => {g}.lastStep(n) !== null)""", timeout)
        self.settled()

    def settled(self) -> None:
        """Wait until the board has drawn everything it was asked to (no redraw pending) and every
        chart drawn has its interaction (tooltip, zoom: added right after a first look's draw)."""
        self.wait("window.gradmon.board && !window.gradmon.board.dirty && !window.gradmon.board.frame"
                  " && !window.gradmon.board.interacting")

    def show_chart(self, panel: str) -> None:
        """Scroll a chart into view and wait until it is drawn (charts far from the viewport are not)."""
        self.page.locator(f".chart-card[data-panel='{panel}']").scroll_into_view_if_needed()
        card = f"window.gradmon.board.panels.get('{panel}')"
        self.wait(f"{card} && {card}.chart && {card}.key")
        self.settled()

    def _console(self, msg: object) -> None:
        if msg.type == "error":
            self.errors.append(f"console.error: {msg.text}")

    def eval(self, js: str, arg: object = None) -> object:
        return self.page.evaluate(js, arg)

    def shot(self, name: str, full_page: bool = True) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def drag(self, panel: str, x0: float, x1: float) -> None:
        """Drag a box across a chart from fraction x0 to x1 of its width (the drag-box zoom)."""
        box = self.page.locator(f".chart-card[data-panel='{panel}'] .chart").bounding_box()
        y = box["y"] + box["height"] * 0.45
        self.page.mouse.move(box["x"] + box["width"] * x0, y)
        self.page.mouse.down()
        self.page.mouse.move(box["x"] + box["width"] * x1, y + 10, steps=8)
        self.page.mouse.up()

    def close(self) -> None:
        self.context.close()


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    stale = stale_build()
    if stale:
        pytest.fail(f"gradmon/static is older than dashboard/src ({', '.join(stale)}): run make dashboard")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


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
