"""Release artifacts, as a user gets them.

``python -m build`` makes the sdist and, from it, the wheel; both carry the built page, each asset
once. The wheel, installed with pip into a fresh venv whose PATH has no node/npm, serves the full
page from ``gradmon serve`` (run from that venv, outside the checkout), checked in Chromium. A
checkout without the built page, installed where there is no Node, stops with a message saying
what to run (setup.py's build hook), and the hook's decisions are unit-tested.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_helpers import opened
from server_helpers import make_run, request

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "gradmon" / "static"
DEADLINE_S = 60.0


def load_setup_py():
    """setup.py as a module (its ``setup()`` call runs only as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("gradmon_setup_py", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_node_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a machine without Node: PATH is the venv's bin/ alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = str(bin_dir)
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None
    return env


# ---------------------------------------------------------------------------- the build hook (pure)


def test_page_action_decides_build_keep_warn_or_fail():
    page_action = load_setup_py().page_action
    assert page_action("current", True, False) == "keep"
    assert page_action("current", False, False) == "keep"
    assert page_action("missing", True, True) == "build"
    assert page_action("stale", True, True) == "build"
    assert page_action("stale", True, False) == "warn"  # the older page still works
    assert page_action("missing", True, False) == "fail"  # never a server that can only answer 503
    assert page_action("missing", False, True) == "fail"  # no sources to build from


def test_page_state_compares_the_built_page_with_its_sources(tmp_path):
    setup_py = load_setup_py()
    dashboard = tmp_path / "dashboard"
    (dashboard / "src" / "lib").mkdir(parents=True)
    for name in ("build.mjs", "package.json", "src/index.html", "src/lib/a.js"):
        (dashboard / name).write_text("x")
    sources = setup_py.page_sources(dashboard)
    assert {p.relative_to(dashboard).as_posix() for p in sources} == {
        "build.mjs", "package.json", "src/index.html", "src/lib/a.js"}
    assert setup_py.page_sources(tmp_path / "sdist-has-no-dashboard") == []
    page = tmp_path / "static" / "index.html"
    assert setup_py.page_state(page, sources) == "missing"
    page.parent.mkdir()
    page.write_text("built")
    now = time.time()
    for src in sources:
        os.utime(src, (now - 100, now - 100))
    os.utime(page, (now - 50, now - 50))
    assert setup_py.page_state(page, sources) == "current"
    os.utime(dashboard / "src" / "lib" / "a.js", (now, now))  # edited after the build
    assert setup_py.page_state(page, sources) == "stale"
    assert setup_py.page_state(page, []) == "current"


def test_missing_page_message_says_what_to_run():
    setup_py = load_setup_py()
    msg = setup_py.missing_page_message(True)
    assert "cd dashboard && npm ci && npm run build" in msg and "make dashboard" in msg and "wheel" in msg
    assert "neither" in setup_py.missing_page_message(False)


def test_ensure_page_builds_refuses_or_warns(tmp_path, monkeypatch):
    setup_py = load_setup_py()
    dashboard = tmp_path / "dashboard"
    (dashboard / "src").mkdir(parents=True)
    (dashboard / "build.mjs").write_text("//")
    page = tmp_path / "static" / "index.html"
    monkeypatch.setattr(setup_py, "DASHBOARD", dashboard)
    monkeypatch.setattr(setup_py, "PAGE", page)
    monkeypatch.setattr(setup_py.shutil, "which", lambda name: None)  # no node, no npm
    with pytest.raises(setup_py.PageBuildError, match=r"Node\.js/npm is not on PATH"):
        setup_py.ensure_page()
    with pytest.warns(UserWarning, match="editable install"):
        assert setup_py.ensure_page(editable=True) == "fail"
    # With npm: its commands run in dashboard/ (stand-ins here); a failing one stops the build.
    monkeypatch.setattr(setup_py.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(setup_py, "NPM_BUILD", ([sys.executable, "-c", "raise SystemExit(3)"],))
    with pytest.raises(setup_py.PageBuildError, match="failed \\(exit 3\\)"):
        setup_py.ensure_page()
    write_page = f"import pathlib; p = pathlib.Path({str(page)!r}); p.parent.mkdir(); p.write_text('page')"
    monkeypatch.setattr(setup_py, "NPM_BUILD", ([sys.executable, "-c", write_page],))
    assert setup_py.ensure_page() == "build" and page.read_text() == "page"
    assert setup_py.ensure_page() == "keep"


# ---------------------------------------------------------------------------- real installs


def copy_checkout_without_page(dest: Path) -> Path:
    """The files a fresh clone has (no gradmon/static/, no node_modules)."""
    skip = shutil.ignore_patterns("static", "node_modules", "__pycache__", "*.egg-info")
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("gradmon", "cells", "dashboard"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    assert not (dest / "gradmon" / "static").exists()
    return dest


@pytest.mark.slow
def test_install_from_a_checkout_without_node_or_page_fails_with_the_command_to_run(tmp_path):
    src = copy_checkout_without_page(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    env = no_node_env(Path(sys.executable).parent)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
                          env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Node.js/npm is not on PATH" in output and "cd dashboard && npm ci && npm run build" in output
    assert list(out.iterdir()) == []


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build`` of this checkout: the sdist, then the wheel built from it."""
    pytest.importorskip("build", reason="the `build` package is in the test extra: pip install -e '.[test]'")
    if not (STATIC / "index.html").is_file() and shutil.which("npm") is None:
        pytest.fail("gradmon/static is not built and npm is missing: run make dashboard")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def built_page_files() -> set[str]:
    return {p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_sdist_and_wheel_carry_the_built_page_once(dist):
    (wheel,) = dist.glob("gradmon-*-py3-none-any.whl")
    (sdist,) = dist.glob("gradmon-*.tar.gz")
    page = built_page_files()
    assert "index.html" in page and "static/echarts.min.js" in page and "static/main.js" in page
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        in_wheel = {n[len("gradmon/static/"):] for n in names if n.startswith("gradmon/static/")}
        assert in_wheel == page
        for name in page:
            assert zf.read(f"gradmon/static/{name}") == (STATIC / name).read_bytes(), name
    # each asset once: no basename twice anywhere in the wheel (the old build mirrored them all)
    basenames = [n.rsplit("/", 1)[-1] for n in names if not n.endswith(".py")]
    assert len(basenames) == len(set(basenames)), sorted(basenames)
    assert "gradmon/cells/train_step.py" in names and not any(n.startswith("cells/") for n in names)
    assert "gradmon/cells/csrc/fused_norm.cc" in names  # the fused kernel's source, compiled at first use
    assert "gradmon/server/csrc/scanlines.c" in names  # the line scanner's, compiled at first use
    assert "gradmon/integrations/mindformers.py" in names  # optional: imported only by mindformers users
    with tarfile.open(sdist) as tf:
        members = [m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name]
    assert {f"gradmon/static/{n}" for n in page} <= set(members)
    assert "cells/csrc/fused_norm.cc" in members
    assert "gradmon/server/csrc/scanlines.c" in members
    assert "setup.py" in members and not any(m.startswith(("dashboard/", "tests/")) for m in members)
    sizes = f"{wheel.stat().st_size / 1e3:.0f} kB; sdist {sdist.stat().st_size / 1e3:.0f} kB"
    print(f"\nwheel {wheel.name}: {sizes}")


class Served:
    """``gradmon serve`` as a child process; its URL read from its first lines."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self._got_url = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._got_url.wait(DEADLINE_S):
            self.stop()
            raise AssertionError(f"no URL from {cmd} within {DEADLINE_S} s: {self.lines}")
        self.url = next(line.split("open ", 1)[1].strip() for line in self.lines if "open http" in line)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "open http" in line:
                self._got_url.set()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def fresh_venv(dist, tmp_path_factory) -> Iterator[Path]:
    """A new venv with only the wheel (and its dependencies) installed by its own pip, no Node."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    (wheel,) = dist.glob("gradmon-*.whl")
    env = no_node_env(venv / "bin")
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield venv


@pytest.mark.slow
@pytest.mark.browser
def test_wheel_in_a_fresh_venv_without_node_serves_the_full_page(fresh_venv, tmp_path):
    env = no_node_env(fresh_venv / "bin")
    python = str(fresh_venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import gradmon; print(gradmon.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert Path(where.strip()).is_relative_to(fresh_venv), where  # the installed copy, not the checkout
    logdir = tmp_path / "logs"
    make_run(logdir, "exp1", 20)
    server = Served([str(fresh_venv / "bin" / "gradmon"), "serve", str(logdir), "--port", "0"], env, tmp_path)
    try:
        port = int(server.url.split(":")[2].split("/")[0])
        status, _, body = request(port, "/")
        assert status == 200 and b'src="static/main.js"' in body
        assert request(port, "/static/echarts.min.js")[0] == 200
        with opened(server.url) as (page, bad):
            page.wait("window.gradmon && window.gradmon.pointCount('exp1', 'loss') === 20", 30)
            # The board lays its charts out on the next frames (and draws those near the viewport).
            panels = page.wait("window.gradmon.panels().length >= 2 && window.gradmon.panels()", 30)
            assert panels[:2] == ["loss", "grad_norm"]
            page.wait("document.querySelectorAll('.chart-card canvas').length >= 2", 30)
            assert page.eval("window.gradmon.state.connection") == "connected"
        assert bad == [] and page.errors == []
    finally:
        server.stop()
