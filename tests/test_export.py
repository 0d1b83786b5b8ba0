"""``gradmon export``: exactly the selected runs, a data script that is valid JavaScript whatever the
logs hold (checked by node), the page edit, refusals, and the export opened from disk in Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from browser_helpers import opened
from server_helpers import append, header, make_run, step

from gradmon.cli import main
from gradmon.export import EXPORT_SCRIPT, ExportError, export, export_script, page_with_export, select_runs

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "gradmon" / "static"
PREFIX = "window.GRADMON_EXPORT = "


def exported_data(out: Path) -> dict:
    text = (out / EXPORT_SCRIPT).read_text(encoding="ascii")
    assert text.startswith(PREFIX) and text.endswith(";\n")
    return json.loads(text[len(PREFIX):-2])


@pytest.fixture
def page_dir(tmp_path) -> Path:
    """A stand-in for the built page (the layout dashboard/build.mjs writes)."""
    d = tmp_path / "page"
    (d / "static").mkdir(parents=True)
    scripts = '<script src="static/a.js"></script>\n<script src="static/main.js"></script>\n'
    head = '<html><head><link href="static/style.css"></head>'
    (d / "index.html").write_text(f"{head}<body>\n{scripts}</body></html>\n")
    for name in ("a.js", "main.js", "style.css"):
        (d / "static" / name).write_text(f"/* {name} */\n")
    return d


@pytest.fixture
def logdir(tmp_path) -> Path:
    root = tmp_path / "logs"
    make_run(root, "exp1", 12)
    make_run(root, "exp2", 7)
    make_run(root, "sweep/lr-1e-3", 5)
    (root / "exp2" / "metrics.jsonl").open("a").write('{"type":"step","step":8,"lo')  # being written
    append(root / "ddp" / "metrics.rank1.jsonl", [header("ddp"), step(1)])
    return root


# ---------------------------------------------------------------------------- pure parts


def test_select_runs_by_regex():
    found = {"exp1": "/l/exp1/m", "exp2": "/l/exp2/m", "sweep/a": "/l/sweep/a/m", "ddp/rank1": "/l/ddp/m"}
    assert list(select_runs(found, None)) == ["ddp/rank1", "exp1", "exp2", "sweep/a"]
    assert list(select_runs(found, "^exp")) == ["exp1", "exp2"]
    assert list(select_runs(found, "sweep/|rank")) == ["ddp/rank1", "sweep/a"]
    assert select_runs(found, "nothing") == {}
    with pytest.raises(ExportError, match="regular expression"):
        select_runs(found, "(")


HOSTILE = ('{"type":"step","step":1,"loss":NaN,"note":"</script><script>alert(1)</script> <!-- \u2028\u2029'
           ' caf\u00e9 \\"q\\" \\\\ \U0001f600"}\nnot json at all\n')


def test_export_script_escapes_what_javascript_or_html_could_misread():
    script = export_script([("a</script>", HOSTILE), ("b", "")], created=1_700_000_000, view="runs=a")
    assert "<" not in script and "\u2028" not in script and "\u2029" not in script and script.isascii()
    assert json.loads(script[len(PREFIX):-2]) == {
        "runs": [{"name": "a</script>", "jsonl": HOSTILE}, {"name": "b", "jsonl": ""}],
        "created": 1_700_000_000, "view": "runs=a"}


def test_export_script_is_valid_javascript_for_node(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    path = tmp_path / "export-data.js"
    path.write_text(export_script([("exp1", HOSTILE)], created=5, view=""), encoding="ascii")
    # A classic script run as the browser would: it assigns window.GRADMON_EXPORT.
    read = ("const vm = require('vm'); const fs = require('fs'); const ctx = {window: {}};"
            "vm.runInNewContext(fs.readFileSync(process.argv[1], 'utf8'), ctx);"
            "process.stdout.write(JSON.stringify(ctx.window.GRADMON_EXPORT));")
    done = subprocess.run([node, "-e", read, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"runs": [{"name": "exp1", "jsonl": HOSTILE}], "created": 5, "view": ""}


def test_page_with_export_loads_the_data_before_the_page_scripts():
    html = '<head><!-- no <scripts> here --></head><body><script src="static/a.js"></script></body>'
    edited = page_with_export(html)
    assert edited.index(f'<script src="{EXPORT_SCRIPT}"></script>') < edited.index('src="static/a.js"')
    assert edited.count("<script ") == 2 and "<script>" not in edited  # no inline script (CSP)
    with pytest.raises(ExportError, match="no <script>"):
        page_with_export("<html></html>")


# ---------------------------------------------------------------------------- files


def test_export_writes_exactly_the_selected_runs(logdir, tmp_path, page_dir):
    out = tmp_path / "share"
    names = export(logdir, out, "^exp|sweep", view="?runs=exp1", page_dir=page_dir, created=123)
    assert names == ["exp1", "exp2", "sweep/lr-1e-3"]
    data = exported_data(out)
    assert [r["name"] for r in data["runs"]] == names
    assert data["created"] == 123 and data["view"] == "runs=exp1"
    for run in data["runs"]:
        source = (logdir / run["name"] / "metrics.jsonl").read_text()
        complete = source[: source.rfind("\n") + 1]  # exp2's half-written last line is left out
        assert run["jsonl"] == complete and run["jsonl"].endswith("\n")
        assert (out / "logs" / run["name"] / "metrics.jsonl").read_text() == complete
    assert data["runs"][1]["jsonl"].count("\n") == 8  # exp2: header + 7 steps
    assert sorted(p.relative_to(out / "logs").as_posix() for p in (out / "logs").rglob("*.jsonl")) == [
        "exp1/metrics.jsonl", "exp2/metrics.jsonl", "sweep/lr-1e-3/metrics.jsonl"]
    # the page, once, with the data script before its own scripts
    assets = sorted(p.name for p in (out / "static").iterdir())
    assert assets == ["a.js", "export-data.js", "main.js", "style.css"]
    html = (out / "index.html").read_text()
    assert html == page_with_export((page_dir / "index.html").read_text())


def test_rank_runs_and_the_cli(logdir, tmp_path, page_dir, monkeypatch, capsys):
    monkeypatch.setattr("gradmon.export.PAGE_DIR", page_dir)
    out = tmp_path / "share"
    assert main(["export", str(logdir), str(out), "--runs", "rank"]) == 0
    assert "exported 1 run(s) (ddp/rank1)" in capsys.readouterr().out
    assert [r["name"] for r in exported_data(out)["runs"]] == ["ddp/rank1"]
    assert (out / "logs" / "ddp" / "metrics.rank1.jsonl").is_file()
    # a second export into the same directory needs --force, and then holds only its own runs
    assert main(["export", str(logdir), str(out), "--runs", "exp1"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(logdir), str(out), "--runs", "exp1$", "--force"]) == 0
    assert [r["name"] for r in exported_data(out)["runs"]] == ["exp1"]
    assert sorted(p.relative_to(out).as_posix() for p in (out / "logs").rglob("*") if p.is_file()) == [
        "logs/exp1/metrics.jsonl"]


@pytest.mark.parametrize("case, message", [
    ("no match", "no run under"),
    ("inside", "must not be inside LOGDIR"),
    ("not built", "page is not built"),
    ("no logdir", "is not a directory"),
])
def test_refusals_write_nothing(logdir, tmp_path, page_dir, case, message):
    out = logdir / "share" if case == "inside" else tmp_path / "share"
    kwargs = {"page_dir": tmp_path / "nothing" if case == "not built" else page_dir}
    source = tmp_path / "missing" if case == "no logdir" else logdir
    with pytest.raises(ExportError, match=message):
        export(source, out, "zzz" if case == "no match" else None, **kwargs)
    assert not out.exists()


# ---------------------------------------------------------------------------- from disk, in Chromium


def page_reads_exports() -> bool:
    """Whether the built page handles window.GRADMON_EXPORT (the page engineer's side of the contract)."""
    return any("GRADMON_EXPORT" in p.read_text(encoding="utf-8") for p in (STATIC / "static").glob("*.js"))


@pytest.fixture
def exported(logdir, tmp_path) -> Path:
    """An export of the real built page with runs exp1 (12 steps) and exp2 (7 steps)."""
    if not (STATIC / "index.html").is_file():
        pytest.skip("gradmon/static is not built (make dashboard)")
    out = tmp_path / "share"
    export(logdir, out, "^exp")
    return out


@pytest.mark.slow
@pytest.mark.browser
def test_export_opens_from_disk_in_chromium(exported):
    with opened((exported / "index.html").as_uri()) as (page, bad):
        # every asset resolves from disk, and the data script ran before the page's own scripts
        page.wait("window.gradmon !== undefined")
        assert page.eval("window.GRADMON_EXPORT.runs.map(r => r.name)") == ["exp1", "exp2"]
        assert page.eval("window.gradmon.state.mode") == "offline"
    assert bad == [] and page.errors == []


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not page_reads_exports(), reason="the built page does not read window.GRADMON_EXPORT "
                    "yet (dashboard/: the page engineer's side of the export contract)")
def test_exported_runs_are_drawn_from_disk_in_chromium(exported):
    with opened((exported / "index.html").as_uri()) as (page, bad):
        page.wait("window.gradmon && window.gradmon.pointCount('exp1', 'loss') === 12 && "
                  "window.gradmon.pointCount('exp2', 'loss') === 7", 30)
        assert page.page.locator(".chart-card canvas").count() >= 2
    assert bad == [] and page.errors == []
