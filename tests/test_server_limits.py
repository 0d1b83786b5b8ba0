"""`gradmon serve` raises its open-files soft limit towards the hard limit at start, says what it
set, and serves whatever it gets: a real ``gradmon serve`` process started with a low limit, its
limit read back from /proc; the refusals through a stand-in ``resource`` module."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from server_helpers import get_json, make_run

from gradmon.server.limits import MAX_OPEN_FILES, raise_open_files_limit

resource = pytest.importorskip("resource")
linux_only = pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc/<pid>/limits")


def _soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def _serve(logdir: Path, soft: int, hard: int) -> tuple[subprocess.Popen, list[str], int]:
    """``gradmon serve`` started with the open-files limits ``(soft, hard)``; its output lines up to
    the URL, and its port."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.Popen([sys.executable, "-m", "gradmon", "serve", str(logdir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit)
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.startswith("gradmon: open "):
            return proc, lines, int(line.rsplit(":", 1)[1].strip().strip("/"))
    proc.kill()
    proc.wait(timeout=15)
    raise AssertionError(f"gradmon serve did not start: {lines}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=15)


@linux_only
def test_serve_raises_a_low_soft_limit_towards_the_hard_limit(tmp_path):
    make_run(tmp_path, "exp1", 2)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if want <= 256:
        pytest.skip(f"the hard limit ({hard}) leaves nothing to raise")
    proc, lines, port = _serve(tmp_path, 256, hard)
    try:
        assert _soft_limit_of(proc.pid) == want
        shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        assert f"gradmon: open-files limit raised from 256 to {want} (hard limit {shown})" in lines
        assert get_json(port, "/api/runs")[0] == 200
    finally:
        _stop(proc)


@linux_only
def test_serve_runs_when_the_hard_limit_leaves_nothing_to_raise(tmp_path):
    make_run(tmp_path, "exp1", 2)
    proc, lines, port = _serve(tmp_path, 200, 200)
    try:
        assert _soft_limit_of(proc.pid) == 200
        note = [ln for ln in lines if ln.startswith("gradmon: open-files limit")]
        assert note == ["gradmon: open-files limit 200 (hard limit 200); about 200 WebSocket clients at most "
                        "(raise the hard limit, ulimit -Hn, for more)"]
        status, body = get_json(port, "/api/runs")
        assert status == 200 and body["runs"][0]["name"] == "exp1"
    finally:
        _stop(proc)


class _Resource(SimpleNamespace):
    """A stand-in for the ``resource`` module that refuses limits above ``ceiling``."""

    RLIMIT_NOFILE = 7
    RLIM_INFINITY = -1

    def getrlimit(self, which):
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which, limits):
        self.tried.append(limits[0])
        if limits[0] > self.ceiling:
            raise ValueError("not allowed to raise maximum limit")
        self.limits = limits


def test_a_refused_value_is_halved_and_a_refusal_is_never_an_error():
    res = _Resource(limits=(1024, -1), ceiling=20_000, tried=[])  # hard unlimited, kernel maximum 20000
    out = raise_open_files_limit(resource_module=res)
    assert res.tried == [MAX_OPEN_FILES, MAX_OPEN_FILES // 2, MAX_OPEN_FILES // 4]
    assert (out.before, out.after, out.hard, out.error) == (1024, 16_384, None, None)
    assert out.describe() == "open-files limit raised from 1024 to 16384 (hard limit unlimited)"

    stuck = _Resource(limits=(1024, 4096), ceiling=0, tried=[])
    out = raise_open_files_limit(resource_module=stuck)
    assert stuck.tried == [4096, 2048] and stuck.limits == (1024, 4096)
    assert out.after == 1024 and "could not raise it (not allowed to raise maximum limit)" in out.describe()

    enough = _Resource(limits=(100_000, 200_000), ceiling=0, tried=[])
    assert raise_open_files_limit(resource_module=enough).describe() == \
        "open-files limit 100000 (hard limit 200000)"
    assert enough.tried == []
