"""File tailing: complete lines only, truncation/replacement, malformed and oversize lines."""

from __future__ import annotations

import json
import math
import os

from gradmon.logformat.jsonl import encode_record
from gradmon.logformat.lines import LineSplitter
from gradmon.server.index import RunIndex
from gradmon.server.runs import Run
from gradmon.server.tail import FileTailer, make_gen, read_lines


def _step(i: int, **kw) -> str:
    return encode_record({"type": "step", "step": i, "loss": 1.0 / i, **kw})


def test_splitter_holds_partial_line_until_newline():
    s = LineSplitter(0)
    assert s.feed(b'{"a":1}\n{"b"') == [(8, b'{"a":1}')]
    assert s.line_start == 8 and s.pending == 4
    assert s.feed(b":2}") == []
    assert s.feed(b"\n") == [(16, b'{"b":2}')]
    assert s.line_start == 16 and s.pending == 0


def test_splitter_strips_cr_and_keeps_empty_lines():
    s = LineSplitter(10)
    assert s.feed(b"x\r\n\n") == [(13, b"x"), (14, b"")]


def test_splitter_skips_oversize_line_without_buffering_it():
    s = LineSplitter(0, max_line=100)
    chunk = b"a" * 60
    out = []
    for _ in range(1000):  # 60 kB in pieces: never buffered beyond max_line
        out += s.feed(chunk)
        assert len(s._buf) <= 100
    out += s.feed(b"\n" + b'{"ok":1}\n')
    assert out == [(60_001, None), (60_010, b'{"ok":1}')]


def test_tailer_reads_appends_and_waits_for_partial_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_step(1))
    t = FileTailer(str(p))
    res = t.poll()
    assert t.gen is not None and [ln for _, ln in res.lines] == [_step(1).rstrip("\n").encode()]
    line2 = _step(2)
    with open(p, "a") as f:
        f.write(line2[:10])
        f.flush()
        assert t.poll().lines == []
        assert t.offset == len(_step(1))
        f.write(line2[10:])
    res = t.poll()
    assert [ln for _, ln in res.lines] == [line2.rstrip("\n").encode()]
    assert t.offset == p.stat().st_size
    assert t.poll().lines == [] and not t.poll().reset


def test_tailer_without_complete_line_has_no_generation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"type":"hea')
    t = FileTailer(str(p))
    res = t.poll()
    assert t.gen is None and res.lines == [] and not res.reset
    with open(p, "a") as f:
        f.write('der"}\n')
    assert [ln for _, ln in t.poll().lines] == [b'{"type":"header"}']
    assert t.gen is not None


def test_truncation_gives_new_generation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_step(1) + _step(2) + _step(3))
    t = FileTailer(str(p))
    t.poll()
    gen1 = t.gen
    p.write_text(_step(1))  # truncated (same first line!) and rewritten shorter
    res = t.poll()
    assert res.reset and t.gen != gen1
    assert [ln for _, ln in res.lines] == [_step(1).rstrip("\n").encode()]
    assert t.offset == len(_step(1))


def test_truncate_and_rewrite_longer_between_polls_is_detected(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_step(1))
    t = FileTailer(str(p))
    t.poll()
    gen1 = t.gen
    with open(p, "w") as f:  # same inode, different first line, longer than before
        f.write(_step(100) + _step(101))
    res = t.poll()
    assert res.reset and t.gen != gen1
    assert len(res.lines) == 2


def test_replacement_by_rename_gives_new_generation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_step(1) + _step(2))
    t = FileTailer(str(p))
    t.poll()
    gen1 = t.gen
    q = tmp_path / "new.jsonl"
    q.write_text(_step(1) + _step(2) + _step(3))
    os.replace(q, p)
    res = t.poll()
    assert res.reset and t.gen != gen1 and len(res.lines) == 3


def test_generation_is_stable_across_tailers(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_step(1))
    a, b = FileTailer(str(p)), FileTailer(str(p))
    a.poll()
    with open(p, "a") as f:
        f.write(_step(2))
    b.poll()  # a "restarted server" sees more of the same file: same generation
    st = p.stat()
    assert a.gen == b.gen == make_gen(st.st_dev, st.st_ino, _step(1).rstrip("\n").encode())


def test_run_skips_and_counts_malformed_lines_including_5mb(tmp_path):
    p = tmp_path / "metrics.jsonl"
    huge = '{"type":"step","step":2,"pad":"' + "x" * (5 << 20) + '"}\n'
    with open(p, "w") as f:
        f.write(_step(1))
        f.write('{"type":"step","step":3,"loss":NaN}\n')  # bare NaN: another writer's, read
        f.write("not json\n")
        f.write(huge)
        f.write('{"type":"step","step":"4"}\n')  # wrong type for a known field
        f.write(_step(5, grad_norm=math.inf))
    run = Run("r", str(p))
    batches = []
    while True:
        _reset, batch, more = run.poll(max_bytes=1 << 20)
        if batch is not None:
            batches.append(batch)
        if not more:
            break
    assert run.index.malformed == 3
    sent = [json.loads(ln) for b in batches for ln in b.lines]  # strict JSON: the bare NaN re-encoded
    assert [r["step"] for r in sent if r["type"] == "step"] == [1, 3, 5] and sent[1]["loss"] == "NaN"
    # the alarm the server derived for the NaN loss (no header: nobody else judges), after its step
    assert sent[2]["kind"] == "alarm" and sent[2]["step"] == 3 and sent[2]["source"] == "server"
    assert batches[-1].cursor == p.stat().st_size
    # the 5 MB line was never held whole: the splitter's buffer is capped
    assert run.tailer._split.max_line < len(huge)
    assert [m[:3] for m in run.index.steps.marks] == [(3, "nonfinite", "loss"), (5, "nonfinite", "grad_norm")]


def test_read_lines_reads_a_range_back(tmp_path):
    p = tmp_path / "metrics.jsonl"
    text = "".join(_step(i) for i in range(1, 6))
    p.write_text(text)
    start = len(_step(1))
    end = start + len(_step(2)) + len(_step(3))
    got = read_lines(str(p), start, end, chunk=7)
    assert [ln for _, ln in got] == [_step(2).rstrip("\n").encode(), _step(3).rstrip("\n").encode()]
    assert got[-1][0] == end
    assert read_lines(str(tmp_path / "missing"), 0, 10) == []


def test_index_counts_malformed_lines():
    idx = RunIndex()
    line = _step(1).rstrip("\n").encode()
    parsed = idx.add_lines([(60, None), (66, b"[1,2]"), (67 + len(line), line)], 0)
    assert [r["step"] for r in parsed.records] == [1] and parsed.offsets == [66]
    assert (idx.malformed, idx.records) == (2, 1)
