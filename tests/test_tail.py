"""File tailing: complete lines only, truncation/replacement, malformed and oversize lines."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("native", [True, False])
def test_an_integer_beyond_64_bits_in_an_int_field_is_a_malformed_line(tmp_path, monkeypatch, native):
    """Valid JSON that no int64 column holds (a step of 2^63 or 10^30, an epoch of 2^64: another
    writer's): the line is skipped and counted, the run indexed around it, its sidecar written.
    (Before, every later poll of the run raised in the sidecar's rows: no live record after the
    line reached a page, and the sidecar stayed at the rows before it.)"""
    if not native:
        monkeypatch.setattr("gradmon.server.parse._native_scanner", lambda: None)
    p = tmp_path / "metrics.jsonl"
    with open(p, "w") as f:
        for i in range(1, 301):
            f.write(_step(i))
            if i in (100, 200):
                f.write('{"type":"step","step":9223372036854775808,"loss":1.0}\n')
                f.write(f'{{"type":"step","step":{i},"loss":1.0,"epoch":18446744073709551616}}\n')
            if i == 250:
                f.write('{"step": 1000000000000000000000000000000, "loss": 2.0}\n')  # (no type)
    run = Run("r", str(p))
    while run.poll(max_bytes=4096)[2]:
        pass
    assert run.index.malformed == 5 and run.index.records == 300
    assert run.index.steps.last_step == 300 and run.offset == p.stat().st_size
    assert run.sidecar is not None and run.sidecar.rows == 300
    run.close()
    again = Run("r", str(p))  # (restored from that sidecar)
    assert again.restored == p.stat().st_size and again.index.malformed == 5


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


def _polled(run: Run, max_bytes: int) -> tuple[list, list[int]]:
    """Poll ``run`` to the end of its file: its batches, and the open bucket's size after each
    poll that left more to read."""
    batches, open_after = [], []
    while True:
        _reset, batch, more = run.poll(max_bytes=max_bytes)
        if batch is not None:
            batches.append(batch)
        if not more:
            return batches, open_after
        open_after.append(run.index.steps.open_records)


def test_a_backlog_is_indexed_in_whole_buckets_with_no_line_lost_or_read_twice(tmp_path):
    # A log read in 32 KB slices: every slice but the last ends on a bucket boundary (the lines after
    # it are read again at the next poll), also where other records and malformed lines lie between
    # the step records. The batches still join up, each line is sent once, the index is the whole
    # log's, and so is the one its sidecar restores.
    plain = tmp_path / "plain" / "metrics.jsonl"
    plain.parent.mkdir()
    plain.write_text("".join(_step(i, grad_norm=1.0 + i % 7) for i in range(1, 6001)))
    _batches, open_after = _polled(Run("p", str(plain), sidecar=False), 32 << 10)
    assert len(open_after) > 10 and set(open_after) == {0}

    mixed = tmp_path / "mixed" / "metrics.jsonl"
    mixed.parent.mkdir()
    lines = [encode_record({"type": "header", "run_id": "r"}) + "\n"]
    for i in range(1, 6001):
        lines.append(_step(i, grad_norm=1.0 + i % 7, spike=i % 500 == 0))
        if i % 333 == 0:
            event = encode_record({"type": "event", "step": i, "kind": "x"}) + "\n"
            lines.append("not json\n" if i % 666 else event)
    mixed.write_text("".join(lines))
    run = Run("m", str(mixed))
    batches, open_after = _polled(run, 32 << 10)
    assert len(open_after) > 10 and set(open_after) == {0}  # (only step records fill buckets)
    assert [b.prev for b in batches[1:]] == [b.cursor for b in batches[:-1]]
    assert batches[0].prev == 0 and batches[-1].cursor == mixed.stat().st_size
    sent = [json.loads(ln) for b in batches for ln in b.lines]
    assert [r["step"] for r in sent if r["type"] == "step"] == list(range(1, 6001))
    whole = RunIndex()
    whole.add_lines(read_lines(str(mixed), 0, mixed.stat().st_size), 0)
    assert run.index.stats() == whole.stats() and run.index.summary() == whole.summary()
    assert run.index.steps.marks == whole.steps.marks
    assert [run.index.steps.pyramid.base.get(i).fields for i in range(run.index.steps.pyramid.base.size)] == \
        [whole.steps.pyramid.base.get(i).fields for i in range(whole.steps.pyramid.base.size)]
    run.close()  # (its sidecar's checkpoint covers the whole log: a restart reads nothing again)
    again = Run("m", str(mixed))
    assert again.restored == mixed.stat().st_size and again.index.stats() == whole.stats()
    again.close()


def test_unread_hands_lines_out_again_and_not_past_the_cursor(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(_step(i) for i in range(1, 6)))
    t = FileTailer(str(p))
    first = t.poll()
    t.unread(first.lines[1][0])
    assert t.offset == first.lines[1][0]
    assert t.poll().lines == first.lines[2:]
    with pytest.raises(ValueError):
        t.unread(t.offset + 1)


def test_a_backlog_read_in_slices_gives_every_line_once_and_frees_its_buffer(tmp_path):
    # Slices of a backlog share one read buffer (cached-only reads, where the system has them);
    # each slice's lines are its own bytes, and the buffer goes once the file is read through.
    p = tmp_path / "metrics.jsonl"
    lines = [_step(i) for i in range(1, 400)]
    p.write_text("".join(lines))
    t = FileTailer(str(p))
    got = []
    polls = []
    while True:
        res = t.poll(1000)
        polls.append(res)
        got.extend(line for _end, line in res.lines)
        if res.more:
            assert t._read_buf is not None or not t._nowait
        if not res.more and not res.waiting:
            break
    assert len(polls) > 10
    assert got == [line.rstrip("\n").encode() for line in lines]
    assert t._read_buf is None
    with open(p, "a") as f:
        f.write(_step(400))
    assert [line for _end, line in t.poll(1000).lines] == [_step(400).rstrip("\n").encode()]
    assert t._read_buf is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=90).map(lambda b: b.replace(b"\n", b"")) | st.sampled_from([b"", b"x\r"]),
                min_size=1, max_size=60),
       st.integers(16, 200))
def test_slices_read_into_one_reused_buffer_give_the_file_s_lines(tmp_path_factory, lines, slice_bytes):
    # A whole slice is split straight from the tailer's read buffer, which the next poll reads
    # into again: every line handed out is bytes of its own (a partial line at a slice's end, a
    # CR, an empty line, a line over max_line included), the same as the file read in one go.
    p = tmp_path_factory.mktemp("reuse") / "metrics.jsonl"
    p.write_bytes(b"".join(line + b"\n" for line in lines))
    t = FileTailer(str(p), max_line=64)
    got = []
    for _ in range(10_000):
        res = t.poll(slice_bytes)
        got.extend(res.lines)
        if not res.more and not res.waiting:
            break
    assert all(line is None or type(line) is bytes for _end, line in got)
    assert got == read_lines(str(p), 0, p.stat().st_size, max_line=64)
