"""Opening a URL in Debian's Chromium for the packaging tests (no tests here): the page with its
errors (``test_page_live.Page``) and every request that failed or answered >= 400."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def opened(url: str) -> Iterator[tuple[object, list[str]]]:
    """``(page, bad)`` with ``url`` loaded; skips when Chromium or Playwright is missing."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium is not installed (make browser)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_page_live import CHROMIUM, CHROMIUM_ARGS, Page

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = Page(browser)
            bad: list[str] = []
            page.page.on("response", lambda r: r.status >= 400 and bad.append(f"{r.status} {r.url}"))
            page.page.on("requestfailed", lambda r: bad.append(f"failed {r.url}"))
            page.page.goto(url)
            yield page, bad
            page.close()
        finally:
            browser.close()
