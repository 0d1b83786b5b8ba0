"""Build hooks: every wheel and sdist carries the built dashboard page (``gradmon/static/``).

The metadata is in pyproject.toml; this file adds one step before setuptools collects package data
(``build_py`` for wheels and installs, ``sdist``): when ``gradmon/static/index.html`` is missing or
older than the page's sources in ``dashboard/``, build it with npm (the commands of
``make dashboard``). Without Node.js a missing page stops the build with a message saying what to
run, so that ``pip install .`` never installs a server that can only answer 503. An sdist carries
the built page and not ``dashboard/``: installing from it needs no Node.

An editable install (``pip install -e .``, what ``make`` does) only warns when it cannot build
the page: the checkout is served in place, and ``make dashboard`` builds the page later.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
PAGE = ROOT / "gradmon" / "static" / "index.html"
DASHBOARD = ROOT / "dashboard"
NPM_BUILD = (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"])
BUILD_BY_HAND = "cd dashboard && npm ci && npm run build   (or: make dashboard)"


class PageBuildError(SystemExit):
    """The page is missing and cannot be built here (exits with the message, without a traceback)."""


def page_sources(dashboard: Path) -> list[Path]:
    """The files the page is built from (the Makefile's rule lists the same); none outside a checkout."""
    if not (dashboard / "build.mjs").is_file():
        return []
    files = [dashboard / name for name in ("package.json", "package-lock.json", "build.mjs")]
    files += sorted(p for p in (dashboard / "src").rglob("*") if p.is_file())
    return [f for f in files if f.is_file()]


def page_state(page: Path, sources: list[Path]) -> str:
    """``"missing"``, ``"stale"`` (a source is newer than the built index.html, which the build
    writes last) or ``"current"``."""
    if not page.is_file():
        return "missing"
    built = page.stat().st_mtime
    return "stale" if any(src.stat().st_mtime > built for src in sources) else "current"


def page_action(state: str, have_sources: bool, have_node: bool) -> str:
    """What to do about the page: ``"keep"``, ``"build"``, ``"warn"`` (stale, but no Node to
    rebuild it: the older page still works) or ``"fail"`` (missing and cannot be built)."""
    if state == "current":
        return "keep"
    if have_sources and have_node:
        return "build"
    return "warn" if state == "stale" else "fail"


def missing_page_message(have_sources: bool) -> str:
    if not have_sources:
        return ("gradmon: this source tree has neither the built dashboard page (gradmon/static/) nor its "
                "sources (dashboard/). Install from a gradmon wheel or sdist, or from a git checkout.")
    return ("gradmon: the dashboard page is not built (gradmon/static/index.html is missing) and Node.js/npm "
            "is not on PATH, so this install cannot build it. Install Node.js 20+ with npm, then run\n"
            f"    {BUILD_BY_HAND}\n"
            "and install again; or install a gradmon wheel "
            "(`pip install gradmon-<version>-py3-none-any.whl`), which carries the page and needs no Node.")


def ensure_page(*, editable: bool = False) -> str:
    """Build the page when it is missing or stale and npm can; returns the action taken. When it
    is missing and cannot be built, or the build fails, raises :class:`PageBuildError` (an editable
    install only warns: the checkout is served in place and `make dashboard` can build it later)."""
    sources = page_sources(DASHBOARD)
    have_node = shutil.which("node") is not None and shutil.which("npm") is not None
    action = page_action(page_state(PAGE, sources), bool(sources), have_node)
    problem = None
    if action == "build":
        for cmd in NPM_BUILD:
            print(f"gradmon: building the dashboard page: {' '.join(cmd)}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, cwd=DASHBOARD, check=False)
            if done.returncode != 0:
                problem = (f"gradmon: `{' '.join(cmd)}` failed (exit {done.returncode}) in {DASHBOARD}; "
                           f"fix that, or run `{BUILD_BY_HAND}` by hand")
                break
    elif action == "warn":
        warnings.warn(f"gradmon: gradmon/static/ is older than dashboard/ and npm is not on PATH: packaging "
                      f"the older page. To refresh it: {BUILD_BY_HAND}", stacklevel=2)
    elif action == "fail":
        problem = missing_page_message(bool(sources))
    if problem is not None and not editable:
        raise PageBuildError(problem)
    if problem is not None:
        warnings.warn(problem + "\n(editable install: `gradmon serve` answers 503 until the page is built)",
                      stacklevel=2)
    return action


class BuildPyWithPage(build_py):
    def run(self) -> None:
        if ensure_page(editable=bool(getattr(self, "editable_mode", False))) == "build":
            self.__dict__.pop("data_files", None)  # package data listed before the build: list it again
        super().run()


class SdistWithPage(sdist):
    def run(self) -> None:
        ensure_page()
        super().run()


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithPage, "sdist": SdistWithPage})
