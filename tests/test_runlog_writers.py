"""One writer per run log (the advisory lock), and a writer that finds its log ending in a partial
line left by a writer that died mid-write (issue #14 C): real processes, real kills."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from server_helpers import get_json, wait_for

from gradmon.logformat.reader import ReadStats, read_records
from gradmon.monitor.writelock import LogInUseError, lock_path
from gradmon.monitor.writer import RunLogWriter

ROOT = Path(__file__).resolve().parent.parent


def child(code: str, *args: str) -> subprocess.Popen:
    """A Python child running ``code`` (gradmon importable); its stdout is a pipe."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def steps_of(path) -> list[int]:
    return [r["step"] for r in read_records(path) if r["type"] == "step"]


# A writer that writes steps 1..N and then waits to be killed (or, with "--die-mid-line", writes half
# a record and kills itself: the "writer dies mid-line").
HOLDER = """
    import os, signal, sys, time
    from gradmon.monitor.writer import RunLogWriter
    path, n = sys.argv[1], int(sys.argv[2])
    w = RunLogWriter(path, header={"log_interval": 1})
    for s in range(1, n + 1):
        w.write({"type": "step", "step": s, "ts": time.time(), "loss": 1.0})
    if "--die-mid-line" in sys.argv:
        os.write(w._fd, b'{"type":"step","step":%d,"lo' % (n + 1))
        os.kill(os.getpid(), signal.SIGKILL)
    print("ready", flush=True)
    time.sleep(120)
"""


def test_a_second_writer_in_the_same_process_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    first = RunLogWriter(path, header={"log_interval": 1})
    first.write({"type": "step", "step": 1})
    with pytest.raises(LogInUseError) as info:
        RunLogWriter(path, header={"log_interval": 1})
    message = str(info.value)
    assert f"pid {os.getpid()}" in message and socket.gethostname() in message and "this process" in message
    assert info.value.holder["pid"] == os.getpid()
    first.write({"type": "step", "step": 2})
    first.close()
    assert [r["type"] for r in read_records(path)] == ["header", "step", "step", "end"]  # nothing else
    assert not os.path.exists(lock_path(str(path)))  # given back on close
    with RunLogWriter(path, header={}) as third:  # the log is free again
        third.write({"type": "step", "step": 3})
    assert steps_of(path) == [1, 2, 3]


def test_a_writer_in_another_process_is_refused_with_the_holder_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with RunLogWriter(path, header={}) as w:
        w.write({"type": "step", "step": 1})
        proc = child("""
            import sys
            from gradmon.monitor.writelock import LogInUseError
            from gradmon.monitor.writer import RunLogWriter
            try:
                RunLogWriter(sys.argv[1], header={})
            except LogInUseError as exc:
                print(exc)
                sys.exit(3)
        """, str(path))
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, err
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in out
        w.write({"type": "step", "step": 2})
    recs = list(read_records(path))
    assert [r["type"] for r in recs] == ["header", "step", "step", "end"] and recs[0]["pid"] == os.getpid()


def test_a_killed_holder_never_blocks_the_next_writer(tmp_path):
    path = tmp_path / "metrics.jsonl"
    holder = child(HOLDER, str(path), "3")
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(LogInUseError, match=f"pid {holder.pid}"):
            RunLogWriter(path, header={})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert os.path.exists(lock_path(str(path)))  # a killed holder leaves its lock file behind...
    with RunLogWriter(path, header={}) as w:  # ...which holds no lock
        w.write({"type": "step", "step": 4})
        note = json.loads(Path(lock_path(str(path))).read_text())
        assert note["pid"] == os.getpid()
    assert steps_of(path) == [1, 2, 3, 4]


def test_a_writer_superseded_after_its_directory_was_removed_drops_its_records(tmp_path):
    import shutil

    class Clock:
        t = 1000.0

        def __call__(self):
            return self.t

    clock = Clock()
    run = tmp_path / "run"
    path = run / "metrics.jsonl"
    old = RunLogWriter(path, header={}, check_interval=1.0, clock=clock)
    shutil.rmtree(run)  # the run directory (and the lock file in it) removed under the writer
    new = RunLogWriter(path, header={})  # another writer starts on the recreated path
    new.write({"type": "step", "step": 1})
    clock.t += 2  # the old writer notices, reopens, finds the log taken
    with pytest.warns(RuntimeWarning, match="being written by"):
        assert old.write({"type": "step", "step": 99}) is False
    assert old.write({"type": "step", "step": 100}) is False and old.dropped_records == 2
    old.close()
    new.close()
    assert steps_of(path) == [1]


def test_a_writer_ends_the_partial_line_of_a_writer_that_died_mid_line(tmp_path):
    """Issue #14 C: before, the new header was glued to the fragment (one malformed line) and the
    resumed steps 6..15 showed under the dead writer's header, twice and out of order."""
    from gradmon.server import start_server

    path = tmp_path / "logs" / "exp" / "metrics.jsonl"
    proc = child(HOLDER, str(path), "10", "--die-mid-line")
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not path.read_bytes().endswith(b"\n")
    w2 = RunLogWriter(path, header={})  # resumed from step 5
    for s in range(6, 16):
        w2.write({"type": "step", "step": s, "ts": time.time(), "loss": 2.0})
    w2.close()

    stats = ReadStats()
    recs = list(read_records(path, stats=stats))
    assert stats.malformed == 1 and stats.partial_tail_bytes == 0  # the fragment, ended: one bad line
    assert [r["type"] for r in recs].count("header") == 2
    assert [r["step"] for r in recs if r["type"] == "step"] == [*range(1, 11), *range(6, 16)]

    handle = start_server(tmp_path / "logs", port=0, discover_interval=0.1)
    try:
        wait_for(lambda: get_json(handle.port, "/api/runs/exp")[0] == 200)
        status, hist = get_json(handle.port, "/api/runs/exp/history")
    finally:
        handle.stop()
    assert status == 200 and hist["malformed"] == 1 and len(hist["headers"]) == 2
    loss = hist["series"]["loss"]
    assert loss["step"] == list(range(1, 16))  # once each, in order: the resumed segment wins 6..15
    assert loss["value"] == [1.0] * 5 + [2.0] * 10
