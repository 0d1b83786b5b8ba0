"""The index sidecar (gradmon/server/sidecar.py) is a cache: every answer it gives is the answer of
a fresh parse of the log; a stale, truncated or damaged one is found out and rebuilt; a server
that cannot write it (a read-only directory) works from memory; a kill -9 at any moment of its
writes leaves a state the next start uses or rebuilds."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import append, get_json, header, make_run, step, wait_for

from gradmon.server import history, runs
from gradmon.server import pyramid as pyramid_module
from gradmon.server.app import start_server
from gradmon.server.history import HistoryOptions
from gradmon.server.pyramid import STORED_LEVELS
from gradmon.server.runs import Run
from gradmon.server.sidecar import FORMAT, sidecar_dir

REPO = Path(__file__).resolve().parent.parent
QUERIES = [(None, None, 2000), (None, None, 40), (None, None, 8), (50, 700, 400), (300, 1200, 40),
           (1, 60, 100_000), (900, 5000, 12)]


def answer(run: Run, start, end, points) -> dict:
    body, _gz = history.answer(history.build_job(run, HistoryOptions(points, start, end)))
    return json.loads(body)


def drain(run: Run, max_bytes: int = 1 << 20) -> None:
    while run.poll(max_bytes)[2]:
        pass


def fresh(path: Path) -> Run:
    """The run as a server without sidecars reads it: a fresh parse of the whole log."""
    run = Run("r", str(path), sidecar=False)
    drain(run)
    return run


def assert_same_answers(run: Run, path: Path) -> None:
    ref = fresh(path)
    assert run.cursor() == ref.cursor()
    for q in QUERIES:
        assert answer(run, *q) == answer(ref, *q), q
    # After the queries: a query of the open bucket may list a field first seen as text (steps.py);
    # the order of such a field among the others depends on where the reads' slices fell.
    assert _info(run) == _info(ref)


def _info(run: Run) -> dict:
    info = run.info()
    return {**info, "fields": sorted(info["fields"])}


# ---- random logs ---------------------------------------------------------------------------

_value = st.one_of(st.floats(0.01, 100.0), st.sampled_from([
    float("nan"), float("inf"), 1e300, 3,
    # (odd but valid: a negative zero, the smallest subnormal, integers past 2^53 and past a float)
    -0.0, 5e-324, -1e308, 2**53 + 1, 2**63, -(10**400), True, None]))
_segment = st.tuples(st.integers(1, 900), st.integers(0, 400), st.booleans(), st.booleans())
_extra = st.sampled_from(["", "malformed", "nan_string", "eval", "system", "event", "text", "late_field",
                          "int65"])


def _log_lines(segments, extras, values) -> list[str]:
    """Lines of a log: per segment ``(first step, steps, header?, flagged?)``; ``extras`` sprinkles
    malformed lines (a step beyond int64 too), ``"NaN"`` strings, other record kinds, text values and
    a field that appears late."""
    lines, k = [], 0
    for s, (first, n, has_header, flagged) in enumerate(segments):
        if has_header:
            lines.append(json.dumps(header(f"s{s}")))
        for i in range(first, first + n):
            v = values[k % len(values)]
            k += 1
            rec = step(i, grad_norm=v)
            if flagged and i % 37 == 0:
                rec["spike"] = True
            extra = extras[k % len(extras)]
            if extra == "text":
                rec["note"] = "x" if i % 2 else 4.5
            if extra == "late_field" and i > first + n // 2:
                rec["lr"] = 0.1 * i
            line = json.dumps(rec, allow_nan=True).replace("NaN", '"NaN"').replace("Infinity", '"Infinity"')
            lines.append(line)
            if extra == "malformed":
                lines.append('{"type": "step", "step": ')
            elif extra == "nan_string":
                lines.append(json.dumps({"type": "step", "step": i, "loss": "NaN"}))
            elif extra == "eval" and i % 50 == 0:
                lines.append(json.dumps({"type": "eval", "step": i, "accuracy": 0.5}))
            elif extra == "system" and i % 40 == 0:
                lines.append(json.dumps({"type": "system", "step": i, "ts": 1.0, "cpu_percent": 3.0}))
            elif extra == "event" and i % 90 == 0:
                lines.append(json.dumps({"type": "event", "kind": "note", "step": i}))
            elif extra == "int65" and i % 60 == 0:  # (valid JSON, beyond int64: a malformed line)
                lines.append(json.dumps({"type": "step", "step": 2**64 + i, "loss": 1.0}))
    return lines


def _write(path: Path, lines: list[str], mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments=st.lists(_segment, min_size=1, max_size=4), extras=st.lists(_extra, min_size=1, max_size=6),
       values=st.lists(_value, min_size=1, max_size=20), cut=st.floats(0.0, 1.0),
       rotate=st.booleans(), restart=st.booleans(), tail=st.sampled_from([1, 2, 256]))
def test_the_sidecar_agrees_with_a_fresh_parse(segments, extras, values, cut, rotate, restart, tail):
    # tail: the stored pyramid levels are written every `tail` summaries (and at each checkpoint)
    with _tail_max(tail):
        _agrees_with_a_fresh_parse(segments, extras, values, cut, rotate, restart)


@contextlib.contextmanager
def _tail_max(n: int):
    saved = runs.TAIL_MAX
    runs.TAIL_MAX = n
    try:
        yield
    finally:
        runs.TAIL_MAX = saved


def _agrees_with_a_fresh_parse(segments, extras, values, cut, rotate, restart):
    lines = _log_lines(segments, extras, values)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "metrics.jsonl"
        k = int(len(lines) * cut)
        if rotate:  # a first generation of the file, then truncated and rewritten
            _write(path, _log_lines([(1, 300, True, True)], ["eval"], [1.0]))
            run = Run("r", str(path))
            drain(run, 4096)
            run.close()
            path.write_text("")
        _write(path, lines[:k])
        run = Run("r", str(path))
        drain(run, 4096)  # small slices: rows and checkpoints across many batches
        if restart:  # a server restart in the middle: restored from the checkpoint, then extended
            run.close()
            run = Run("r", str(path))
        _write(path, lines[k:])
        drain(run, 4096)
        assert_same_answers(run, path)
        run.close()
        again = Run("r", str(path))  # and a restart from the final checkpoint
        assert again.restored == again.offset == path.stat().st_size or not lines
        drain(again)
        assert_same_answers(again, path)
        again.close()


# ---- damage --------------------------------------------------------------------------------

@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = make_run(tmp_path, "a", 3000)
    run = Run("r", str(path))
    drain(run)
    run.close()
    return path


def _restored(path: Path) -> Run:
    run = Run("r", str(path))
    drain(run)
    return run


def test_an_intact_sidecar_is_restored_not_reparsed(log: Path):
    run = _restored(log)
    assert run.restored == log.stat().st_size
    assert answer(run, 100, 200, 2000)["series"]["loss"]["step"] == list(range(100, 201))
    assert_same_answers(run, log)


def test_a_stale_sidecar_is_rebuilt_when_the_log_was_rewritten(log: Path):
    data = log.read_bytes()
    log.write_bytes(data.replace(b'"loss":1.0,', b'"loss":7.0,', 1))  # same size, other content
    run = _restored(log)
    assert run.restored == 0
    assert_same_answers(run, log)


def test_a_truncated_log_rebuilds_the_sidecar(log: Path):
    data = log.read_bytes()
    log.write_bytes(data[:len(data) // 2 - 7].rsplit(b"\n", 1)[0] + b"\n")
    run = _restored(log)
    assert run.restored == 0
    assert_same_answers(run, log)


@pytest.mark.parametrize("damage", ["state_payload", "state_header", "column_short", "state_gone",
                                    "dir_file", "level_short", "level_name", "older_format"])
def test_a_damaged_sidecar_is_rebuilt_with_nothing_lost(log: Path, damage: str):
    side = Path(sidecar_dir(str(log)))
    state = side / "state"
    if damage == "state_payload":
        raw = bytearray(state.read_bytes())
        raw[-100] ^= 0xFF
        state.write_bytes(bytes(raw))
    elif damage == "state_header":
        state.write_bytes(b"{not json\n" + state.read_bytes().split(b"\n", 1)[1])
    elif damage == "column_short":
        col = side / "col.0"
        os.truncate(col, col.stat().st_size // 2)
    elif damage == "level_short":
        lvl = side / "lvl0.f0"
        os.truncate(lvl, lvl.stat().st_size - 8)
    elif damage == "level_name":  # a crafted header naming a file outside the directory
        head, payload = state.read_bytes().split(b"\n", 1)
        fields = json.loads(head)
        victim = log.parent / "victim"
        victim.write_bytes(b"keep me")
        fields["files"] = {**fields["files"], "../victim": 0}
        state.write_bytes(json.dumps(fields).encode() + b"\n" + payload)
    elif damage == "older_format":  # an older server's sidecar, intact (FORMAT: what changed since)
        head, payload = state.read_bytes().split(b"\n", 1)
        fields = json.loads(head)
        assert fields["format"] == FORMAT
        state.write_bytes(json.dumps({**fields, "format": FORMAT - 1}).encode() + b"\n" + payload)
    elif damage == "state_gone":
        state.unlink()
    else:  # something that is not a sidecar directory where it would be: from memory
        shutil.rmtree(side)
        side.write_text("not a directory")
    run = _restored(log)
    assert run.restored == 0
    assert (run.sidecar is None) == (damage == "dir_file")
    if damage == "level_name":
        assert (log.parent / "victim").read_bytes() == b"keep me"
    assert_same_answers(run, log)
    if run.sidecar is not None:  # rebuilt: the next start restores it
        run.close()
        assert _restored(log).restored == log.stat().st_size


def test_a_state_file_naming_other_code_is_refused(log: Path, tmp_path: Path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    state = Path(sidecar_dir(str(log))) / "state"
    head = json.loads(state.read_bytes().split(b"\n", 1)[0])
    payload = pickle.dumps(Evil())
    head["crc"] = zlib.crc32(payload)  # a well-formed, checksummed, crafted state
    state.write_bytes(json.dumps(head).encode() + b"\n" + payload)
    run = _restored(log)
    assert run.restored == 0 and not marker.exists()
    assert_same_answers(run, log)


@pytest.mark.parametrize("compiled", [True, False])
def test_stored_levels_extended_as_the_log_grows_agree_with_a_fresh_parse(tmp_path: Path, monkeypatch,
                                                                          compiled: bool):
    monkeypatch.setattr(runs, "TAIL_MAX", 3)  # written every 3 summaries (256 by default)
    if not compiled:  # (the stored summaries' points made in Python, as where nothing compiles)
        monkeypatch.setattr(pyramid_module, "_native_scanner", lambda: None)
    path = make_run(tmp_path, "s", 12_000)  # then 36,000 steps: 281 base buckets, 5 levels
    run = Run("r", str(path))
    drain(run, 1 << 16)
    for first in (12_001, 24_001):  # the log grows while served, the levels' files with it
        append(path, [step(i, grad_norm=1.0 + (i % 7)) for i in range(first, first + 12_000)])
        drain(run, 1 << 16)
        pyramid = run.index.steps.pyramid
        stored = pyramid.levels[:STORED_LEVELS]
        assert all(lvl.stored > 0 and lvl.tail < 3 for lvl in stored)
        assert all(lvl.store is None for lvl in pyramid.levels[STORED_LEVELS:])
        assert_same_answers(run, path)
    assert len(pyramid.levels) > STORED_LEVELS
    size0 = (Path(sidecar_dir(str(path))) / "lvl0.b").stat().st_size
    assert size0 == pyramid.levels[0].stored * 32
    run.close()  # the checkpoint writes the tails
    again = _restored(path)
    assert again.restored == path.stat().st_size
    assert again.index.steps.pyramid.levels[0].tail == 0
    assert_same_answers(again, path)


def test_a_query_leaves_no_level_file_mapped(tmp_path: Path, monkeypatch):
    # (the pages a query read would stay in the server's RSS while mapped)
    monkeypatch.setattr(runs, "TAIL_MAX", 1)
    path = make_run(tmp_path, "m", 3000)
    run = Run("r", str(path))
    drain(run)
    stores = [lvl.store for lvl in run.index.steps.pyramid.levels[:STORED_LEVELS]]
    assert all(s is not None and s.size > 0 for s in stores)
    assert answer(run, 700, 1900, 40) == answer(fresh(path), 700, 1900, 40)
    assert not any(s.mapped for s in stores)


def test_a_sidecar_dropped_by_a_failed_write_keeps_the_stored_levels(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(runs, "TAIL_MAX", 2)
    path = make_run(tmp_path, "d", 3000)
    run = Run("r", str(path))
    drain(run, 8192)
    assert run.index.steps.pyramid.levels[0].stored > 0

    def full(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run.sidecar, "flush", full)
    append(path, [step(i) for i in range(3001, 3500)])
    drain(run, 8192)
    assert run.sidecar is None and not Path(sidecar_dir(str(path)), "lvl0.b").exists()
    assert all(lvl.store is None for lvl in run.index.steps.pyramid.levels)
    assert_same_answers(run, path)


def test_a_second_server_of_the_same_log_works_from_memory(log: Path):
    first = _restored(log)
    second = _restored(log)
    assert first.sidecar is not None and second.sidecar is None
    assert_same_answers(second, log)


@contextlib.contextmanager
def _read_only(path: Path):
    """``path`` made unwritable (root ignores permissions: the immutable attribute instead)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a directory read-only here (chattr)")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)


def test_a_read_only_log_directory_works_from_memory(tmp_path: Path):
    path = make_run(tmp_path, "ro", 500)
    with _read_only(path.parent):
        run = _restored(path)
        assert run.sidecar is None
        assert not Path(sidecar_dir(str(path))).exists()
        assert_same_answers(run, path)
        run.close()


def test_a_read_only_log_directory_keeps_its_index_in_an_index_directory(tmp_path: Path):
    path = make_run(tmp_path / "logs", "ro", 3000)
    index_dir = tmp_path / "index"
    with _read_only(path.parent):
        run = Run("r", str(path), index_dir=str(index_dir))
        assert run.sidecar is not None and not run.read_only
        assert Path(run.sidecar.path).parent == index_dir
        drain(run)
        run.close()  # (checkpoints what it read)
        assert not Path(sidecar_dir(str(path))).exists()  # nothing beside the log
        again = Run("r", str(path), index_dir=str(index_dir))
        assert again.restored == path.stat().st_size
        drain(again)
        assert_same_answers(again, path)
        again.close()


def test_an_index_directory_gives_each_log_its_own_sidecar(tmp_path: Path):
    a = make_run(tmp_path / "one", "run 1/x", 10)  # (two logs in run directories of one name)
    b = make_run(tmp_path / "two", "run 1/x", 10)
    (tmp_path / "link").symlink_to(tmp_path / "one")
    idx = str(tmp_path / "index")
    da, db = sidecar_dir(str(a), idx), sidecar_dir(str(b), idx)
    assert da != db and os.path.dirname(da) == idx
    assert os.path.basename(da).startswith("x-") and da.endswith(".gmidx")
    assert sidecar_dir(str(tmp_path / "link" / "run 1" / "x" / "metrics.jsonl"), idx) == da
    odd = make_run(tmp_path, "a b;c", 1)
    assert os.path.basename(sidecar_dir(str(odd), idx)).startswith("a_b_c-")


def test_a_server_says_once_how_to_keep_the_index_of_logs_it_cannot_write(tmp_path: Path, caplog):
    from gradmon.server.app import GradmonServer

    paths = [make_run(tmp_path / "logs", name, 10) for name in ("a", "b")]
    with _read_only(paths[0].parent), _read_only(paths[1].parent), \
            caplog.at_level("WARNING", "gradmon.server"):
        server = GradmonServer(tmp_path / "logs", port=0)
        server._apply_discovery({p.parent.name: str(p) for p in paths})
        kept = GradmonServer(tmp_path / "logs", port=0, index_dir=tmp_path / "index")
        kept._apply_discovery({p.parent.name: str(p) for p in paths})
        assert [run.sidecar is None for run in server.runs.values()] == [True, True]
        assert [run.sidecar is None for run in kept.runs.values()] == [False, False]
        for run in [*server.runs.values(), *kept.runs.values()]:
            run.close()
    said = [r.getMessage() for r in caplog.records if "--index-dir" in r.getMessage()]
    # (the message docs/troubleshooting.md quotes, for the first run only)
    assert said == [f"{paths[0]} is in a directory this server cannot write: its index is kept in memory "
                    "and built again at every start; --index-dir DIR keeps it in DIR"]


# ---- a live server -------------------------------------------------------------------------

def test_a_log_that_grows_while_served_extends_its_sidecar_and_a_restart_restores_it(tmp_path: Path):
    path = make_run(tmp_path, "g", 1000)
    with start_server(tmp_path, port=0, poll_interval=0.02) as h:
        wait_for(lambda: get_json(h.port, "/api/runs")[1]["runs"])
        _s, first = get_json(h.port, "/api/runs/g/history?start=10&end=20")
        assert first["series"]["loss"]["step"] == list(range(10, 21))
        append(path, [step(i) for i in range(1001, 1500)])
        wait_for(lambda: get_json(h.port, "/api/runs")[1]["runs"][0]["last_step"] == 1499)
        _s, grown = get_json(h.port, "/api/runs/g/history?start=1400&end=1499")
        assert h.stats()["runs"]["g"]["sidecar_rows"] == 1499
    assert grown["series"]["loss"]["step"] == list(range(1400, 1500))
    ref = fresh(path)
    assert grown["series"] == answer(ref, 1400, 1499, 2000)["series"]
    with start_server(tmp_path, port=0, poll_interval=0.02) as h:
        wait_for(lambda: get_json(h.port, "/api/runs")[1]["runs"])
        assert h.stats()["runs"]["g"]["restored"] == path.stat().st_size
        _s, again = get_json(h.port, "/api/runs/g/history?points=300")
    assert again["series"] == answer(ref, None, None, 300)["series"]


# ---- kill -9 -------------------------------------------------------------------------------

_WRITER = """
import sys, time
from gradmon.server import runs
runs.CHECKPOINT_S = 0.0  # checkpoint on every poll: the kill lands in the middle of one
run = runs.Run("r", sys.argv[1])
print("ready", flush=True)
while True:
    run.poll(1 << 14)
"""


@pytest.mark.parametrize("delay", [0.15, 0.4, 0.9])
def test_a_kill_9_while_the_sidecar_is_written_leaves_a_usable_state(tmp_path: Path, delay: float):
    path = tmp_path / "k" / "metrics.jsonl"
    append(path, [header()] + [step(i) for i in range(1, 6000)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        with open(path, "a", encoding="utf-8") as f:  # the log grows while it is being indexed
            for i in range(6000, 9000):
                f.write(json.dumps(step(i)) + "\n")
        wait_for(lambda: (Path(sidecar_dir(str(path))) / "state").exists())
        import time

        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    run = _restored(path)
    assert_same_answers(run, path)
    run.close()
    assert _restored(path).restored == path.stat().st_size


@pytest.mark.parametrize("option", [None, "--no-index-sidecar", "--index-dir"])
def test_gradmon_serve_stopped_by_sigterm_checkpoints_what_it_read(tmp_path: Path, option):
    path = make_run(tmp_path / "logs", "t", 2000)
    index_dir = str(tmp_path / "index")
    args = {None: [], "--no-index-sidecar": [option], "--index-dir": [option, index_dir]}[option]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "gradmon", "serve", str(tmp_path / "logs"), "--port", "0",
                             *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = next(line.split()[-1] for line in proc.stdout if line.startswith("gradmon: open "))
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        wait_for(lambda: get_json(port, "/api/runs")[1]["runs"][0]["last_step"] == 2000)
        append(path, [step(i) for i in range(2001, 2300)])  # read after the backlog's checkpoint
        wait_for(lambda: get_json(port, "/api/runs")[1]["runs"][0]["last_step"] == 2299)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    if option:  # in memory, or in the index directory: nothing written beside the log
        assert not Path(sidecar_dir(str(path))).exists()
        assert Path(sidecar_dir(str(path), index_dir)).exists() == (option == "--index-dir")
        if option == "--no-index-sidecar":
            return
    run = Run("r", str(path), index_dir=index_dir if option else None)
    assert run.restored == path.stat().st_size
    drain(run)
    assert_same_answers(run, path)


@pytest.mark.parametrize("fork", [True, False])
def test_a_checkpoint_is_written_by_a_child_or_where_there_is_no_fork_in_the_process(tmp_path: Path,
                                                                                  monkeypatch, fork: bool):
    from gradmon.server import sidecar

    if not fork:
        monkeypatch.setattr(sidecar, "_fork", lambda: -1)
    monkeypatch.setattr(sidecar.Sidecar, "background", True)
    path = make_run(tmp_path, "c", 1500)
    run = _restored(path)  # the backlog read: its checkpoint started
    assert (run.sidecar._child is not None) == (fork and hasattr(os, "fork"))
    run.close()  # waits for it
    again = _restored(path)
    assert again.restored == path.stat().st_size
    assert_same_answers(again, path)
