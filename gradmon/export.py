"""``gradmon export LOGDIR OUT``: a read-only copy of the page and of some runs, opened from disk.

``OUT/index.html`` is the built page with one more classic script before its own,
``static/export-data.js``, which sets ``window.GRADMON_EXPORT = {"runs": [{"name", "jsonl"}, ...],
"created": <unix s>, "view": "<query string>"}`` (each run's whole log text; the page reads it
instead of connecting to a server). No inline script: the page's CSP forbids them. ``OUT/logs/``
holds the same logs as files, laid out as under LOGDIR (``gradmon serve OUT/logs`` serves them).
Runs are found as the server finds them (``gradmon.server.runs.discover_runs``: never outside
LOGDIR). Pure parts (selection, the data script, the page edit) are separate from the file I/O.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXPORT_SCRIPT", "ExportError", "add_parser", "export", "export_script", "page_with_export",
           "select_runs"]

PAGE_DIR = Path(__file__).resolve().parent / "static"  # dashboard/build.mjs: index.html + static/
EXPORT_SCRIPT = "static/export-data.js"
_FIRST_SCRIPT = re.compile(r"<script\b")


class ExportError(Exception):
    """The export cannot be made (bad arguments, nothing selected, no built page)."""


@dataclass
class ExportedRun:
    name: str
    path: str  # the log file
    jsonl: str  # its complete lines


def select_runs(found: dict[str, str], pattern: str | None) -> dict[str, str]:
    """The runs (name -> path) whose name matches ``pattern`` (``re.search``; all when None), by name."""
    try:
        regex = re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise ExportError(f"--runs is not a valid regular expression: {exc}") from None
    return {name: found[name] for name in sorted(found) if regex is None or regex.search(name)}


def export_script(runs: list[tuple[str, str]], created: int, view: str = "") -> str:
    """The text of ``export-data.js`` for ``(name, jsonl text)`` pairs. JSON is valid JavaScript
    once U+2028/U+2029 are escaped (``ensure_ascii`` escapes every non-ASCII character); ``<`` is
    escaped too, so no ``</script>`` or ``<!--`` appears even if the file is ever inlined."""
    data = {"runs": [{"name": name, "jsonl": text} for name, text in runs], "created": int(created),
            "view": view}
    body = json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("<", "\\u003c")
    return f"window.GRADMON_EXPORT = {body};\n"


def page_with_export(index_html: str) -> str:
    """The page's index.html with the export script loaded before its first script."""
    match = _FIRST_SCRIPT.search(index_html)
    if match is None:
        raise ExportError("the built index.html has no <script> tag: rebuild the page (make dashboard)")
    tag = f'<script src="{EXPORT_SCRIPT}"></script>\n'
    return index_html[: match.start()] + tag + index_html[match.start():]


def complete_lines(data: bytes) -> str:
    """The complete lines of a log (a line still being written is left out), as text; bytes that
    are not UTF-8 become U+FFFD (the page then skips that line as malformed and counts it)."""
    return data[: data.rfind(b"\n") + 1].decode("utf-8", errors="replace")


def _read_runs(selected: dict[str, str]) -> list[ExportedRun]:
    runs = []
    for name, path in selected.items():
        with open(path, "rb") as f:
            runs.append(ExportedRun(name, path, complete_lines(f.read())))
    return runs


def _prepare_out(out: Path, logdir: Path, force: bool) -> None:
    out_real, root_real = out.resolve(), logdir.resolve()
    if out_real == root_real or out_real.is_relative_to(root_real):
        raise ExportError(f"OUT ({out}) must not be inside LOGDIR ({logdir}): its copies would become runs")
    if out.exists() and not out.is_dir():
        raise ExportError(f"OUT ({out}) exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(f"OUT ({out}) is not empty: choose a new directory, or --force to replace "
                              "an earlier export there")
        for name in ("index.html", "static", "logs"):
            target = out / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)


def export(logdir: str | os.PathLike, out: str | os.PathLike, runs: str | None = None, *, view: str = "",
           force: bool = False, page_dir: Path = PAGE_DIR, created: float | None = None) -> list[str]:
    """Write the export of the runs under ``logdir`` whose names match ``runs`` into ``out``;
    returns the exported run names. Raises :class:`ExportError` with a message for the user."""
    from gradmon.server.runs import discover_runs

    logdir, out = Path(logdir), Path(out)
    index = page_dir / "index.html"
    if not index.is_file():
        raise ExportError(f"the page is not built ({index} is missing): run `make dashboard` in a checkout, "
                          "or install gradmon from a wheel")
    if not logdir.is_dir():
        raise ExportError(f"LOGDIR ({logdir}) is not a directory")
    found = discover_runs(str(logdir))
    selected = select_runs(found, runs)
    if not selected:
        known = ", ".join(sorted(found)[:20]) or "none"
        raise ExportError(f"no run under {logdir} matches {runs!r} (runs: {known})")
    exported = _read_runs(selected)
    _prepare_out(out, logdir, force)
    shutil.copytree(page_dir / "static", out / "static")
    script = export_script([(r.name, r.jsonl) for r in exported],
                           int(time.time() if created is None else created), view.lstrip("?"))
    (out / EXPORT_SCRIPT).write_text(script, encoding="ascii")
    (out / "index.html").write_text(page_with_export(index.read_text(encoding="utf-8")), encoding="utf-8")
    root = os.path.realpath(logdir)
    for run in exported:
        copy = out / "logs" / os.path.relpath(run.path, root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(run.jsonl, encoding="utf-8")
    return [r.name for r in exported]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to the ``gradmon`` parser."""
    p = subparsers.add_parser(
        "export",
        help="write a read-only copy of the page and of runs under LOGDIR, opened from disk",
        description="Write OUT/index.html (the dashboard page), its assets and the selected runs' logs: "
        "open OUT/index.html from disk (file://) with no server, e.g. attached to a bug report or a paper.",
    )
    p.add_argument("logdir", metavar="LOGDIR", help="log root, as for `gradmon serve`")
    p.add_argument("out", metavar="OUT", help="directory to write (new or empty)")
    p.add_argument("--runs", metavar="REGEX", default=None,
                   help="export the runs whose name matches this regular expression (default: all)")
    p.add_argument("--view", default="", help="the page's query string to open with (e.g. runs=a,b)")
    p.add_argument("--force", action="store_true", help="replace an earlier export in OUT")
    p.set_defaults(func=run_export)
    return p


def run_export(args: argparse.Namespace) -> int:
    try:
        names = export(args.logdir, args.out, args.runs, view=args.view, force=args.force)
    except ExportError as exc:
        print(f"gradmon export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gradmon export: {exc}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"gradmon: exported {len(names)} run(s) ({', '.join(names)}) to {args.out} ({size / 1e6:.1f} MB)")
    print(f"gradmon: open {Path(args.out).resolve() / 'index.html'}")
    return 0
