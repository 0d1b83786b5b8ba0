"""The compiled scanner's step records, made when read (gradmon.server.steprecords): they read as
the lists of dicts they stand for, hand out one object per record, and a cold index makes few."""

from __future__ import annotations

import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import line_pairs

from gradmon.logformat.jsonl import encode_record
from gradmon.server import native
from gradmon.server.index import RunIndex
from gradmon.server.parse import parse_lines
from gradmon.server.pyramid import BUCKET
from gradmon.server.steprecords import LineRecords, StepRecords, records_at

needs_scanner = pytest.mark.skipif(native.scanner() is None, reason="no compiled scanner here")


def _line(rec: dict) -> bytes:
    return encode_record(rec).rstrip("\n").encode()


def _records(rng: random.Random, n: int) -> list[dict]:
    """Step records whose keys change order and number now and then, and other kinds between."""
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.15:
            out.append({"type": "system", "step": i, "cpu": rng.random()})
            continue
        rec = {"type": "step", "step": i, "loss": rng.random()}
        if r < 0.4:
            rec["grad_norm"] = rng.choice([1.5, None, "x", True])
        if r < 0.5:
            rec = {"type": "step", "step": i, **{k: v for k, v in rec.items() if k not in ("type", "step")}}
            rec = dict(reversed(list(rec.items())))  # (another key order: another shape)
        out.append(rec)
    return out


def _scanned(recs: list[dict]) -> tuple[StepRecords, list[int]]:
    scan = native.scanner()
    shapes, _undecided, columns, _types, floats, rows, holes = scan.scan_steps([_line(r) for r in recs])
    return StepRecords.scanned(columns, floats, shapes, rows, scan.build_records), holes


@needs_scanner
@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 40), st.integers(-45, 45), st.integers(-45, 45), st.booleans())
def test_step_records_read_as_the_list_they_stand_for(seed, n, a, b, read_one_first):
    rng = random.Random(seed)
    recs = _records(rng, n)
    want = [r for r in recs if r["type"] == "step"]
    steps, holes = _scanned(recs)
    first = steps[a % len(steps)] if read_one_first and steps else None  # (made alone, before the rest)
    assert len(steps) == len(want) and steps == want and list(steps) == want
    assert [list(r) for r in steps] == [list(r) for r in want]  # (key order included)
    assert list(reversed(steps)) == want[::-1]
    assert steps[a:b] == want[a:b] and list(steps[a:b]) == want[a:b] and len(steps[a:b]) == len(want[a:b])
    assert steps[::2] == want[::2]
    if first is not None:
        assert steps[a % len(steps)] is first and list(steps)[a % len(steps)] is first
    # One object per record, however it was reached: by index, by iteration, through a slice.
    made = list(steps)
    assert all(x is y for x, y in zip(made, [steps[i] for i in range(len(steps))]))
    assert all(x is y for x, y in zip(steps[a:b], made[a:b]))
    for key in ("loss", "grad_norm", "cpu", "absent"):
        assert steps[a:b].has_key(key) == any(key in r for r in want[a:b])
    for i in (-len(want) - 1, len(want)):
        with pytest.raises(IndexError):
            steps[i]
    assert pickle.loads(pickle.dumps(steps)) == want and type(pickle.loads(pickle.dumps(steps))) is list
    # Line by line: None at the other lines, until a record is put there.
    lines = LineRecords(steps, holes, len(recs))
    by_line = [r if r["type"] == "step" else None for r in recs]
    assert len(lines) == len(recs) and lines == by_line and list(lines) == by_line
    assert [lines[i] for i in range(len(recs))] == by_line and lines[a:b] == by_line[a:b]
    for i in holes[::2]:
        lines[i] = recs[i]
        by_line[i] = recs[i]
    assert list(lines) == by_line and [lines[-k] for k in range(1, len(recs) + 1)] == by_line[::-1]
    assert all(x is y for x, y in zip([r for r in lines if r is not None and r["type"] == "step"], steps))
    # Read at chosen positions (any order, repeated), and put at once, as one by one.
    positions = [rng.randrange(len(recs)) for _ in range(rng.randrange(8))] if recs else []
    got = records_at(lines, positions)
    assert got == [by_line[i] for i in positions] and all(map(lambda x, i: x is lines[i], got, positions))
    assert records_at(by_line, positions) == [by_line[i] for i in positions]
    rest = holes[1::2]
    lines.put(rest, [recs[i] for i in rest])
    by_line = list(recs)  # (every hole put now)
    assert list(lines) == by_line and lines[a:b] == by_line[a:b] and lines[b:a:-1] == by_line[b:a:-1]
    assert records_at(lines, holes) == [recs[i] for i in holes]
    if recs:
        with pytest.raises(IndexError):
            lines.put([len(recs)], [{}])


@needs_scanner
def test_a_slice_of_a_batch_s_lines_makes_only_its_own_step_records():
    # (the alarm rule reads a batch's records decoded one by one, a diverged run's, each as a slice)
    recs = [{"type": "step", "step": s, "loss": 0.5} if s % 10 else {"type": "system", "step": s, "cpu": 1.0}
            for s in range(1, 201)]
    steps, holes = _scanned(recs)
    lines = LineRecords(steps, holes, len(recs))
    assert lines[95:103] == [r if r["type"] == "step" else None for r in recs[95:103]]
    made = steps._rows.made
    assert made is not None and sum(r is not None for r in made) == 7  # (8 lines, one a system record's)


@needs_scanner
def test_a_few_records_read_together_make_only_their_values():
    # (an open bucket's piece of a mixed batch: its records are made, not the batch's columns of floats)
    recs = [{"type": "step", "step": s, "loss": 1.0 / s, "lr": 0.5, "note": "n"} for s in range(1, 41)]
    steps, _holes = _scanned(recs)
    columns = steps._rows.columns
    assert columns["loss"] is None and columns["lr"] is None  # (every value a float: not made yet)
    assert list(steps[30:37]) == recs[30:37] and steps[30:37] == recs[30:37]
    assert [type(r["loss"]) for r in steps[30:37]] == [float] * 7
    assert columns["loss"] is None and columns["lr"] is None
    assert steps[30] is list(steps[28:32])[2]  # (one object per record still)
    # Most of the batch at once: its whole columns, made once for their next readers.
    assert list(steps[5:40]) == recs[5:40]
    assert columns["loss"] == [r["loss"] for r in recs]
    assert list(steps) == recs


@needs_scanner
def test_a_cold_index_makes_few_step_records():
    # Whole buckets of the writer's plain lines, a flagged spike among them, after a first batch
    # (whose records are read one by one: their keys are new): the index reads their columns (the
    # last ts too); the spike's record alone is read (its new key, its marks).
    recs = [{"type": "step", "step": s, "ts": 1.7e9 + s, "loss": 1.0 / s, "grad_norm": 0.5}
            for s in range(1, 1 + 9 * BUCKET)]
    recs[BUCKET + 100] = {**recs[BUCKET + 100], "grad_norm": 50.0, "spike": True}
    pairs = line_pairs([_line(r) for r in recs])
    idx = RunIndex()
    idx.add_lines(pairs[:BUCKET], 0)
    parsed = idx.add_lines(pairs[BUCKET:], pairs[BUCKET - 1][0])
    assert isinstance(parsed.records, StepRecords)
    made = parsed.records._rows.made
    assert made is not None and [i for i, r in enumerate(made) if r is not None] == [100]
    assert idx.steps.count == len(recs) and idx.last_ts == recs[-1]["ts"] and idx.first_ts == recs[0]["ts"]
    assert [m[:3] for m in idx.steps.marks] == [(BUCKET + 101, "spike", "grad_norm")]
    # The same as from records made one by one (a batch per line).
    ref = RunIndex()
    for k, (end, line) in enumerate(pairs):
        ref.add_lines([(end, line)], pairs[k - 1][0] if k else 0)
    assert ref.steps.marks == idx.steps.marks and (ref.last_ts, ref.first_ts) == (idx.last_ts, idx.first_ts)
    assert ref.steps.pyramid.base.size == idx.steps.pyramid.base.size


@needs_scanner
@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([None, "absent", 0, 7, -2.5, 1.7e9 + 0.125, 2**53]), min_size=1, max_size=12))
def test_a_batch_s_first_and_last_ts_are_its_first_and_last_finite_number(stamps):
    # (read off the scanner's float64 column, no record made for them: null or no ts is no number)
    recs = []
    for s, ts in enumerate(stamps, 1):
        rec = {"type": "step", "step": s, "loss": 0.5}
        if ts != "absent":
            rec["ts"] = ts
        recs.append(rec)
    idx = RunIndex()
    parsed = idx.add_lines(line_pairs([_line(r) for r in recs]), 0)
    assert isinstance(parsed.records, StepRecords)
    numbers = [float(t) for t in stamps if type(t) in (int, float)]
    assert (idx.first_ts, idx.last_ts) == ((numbers[0], numbers[-1]) if numbers else (None, None))
    assert all(type(t) is float for t in (idx.first_ts, idx.last_ts) if t is not None)


@needs_scanner
def test_a_mixed_batch_puts_its_other_records_at_their_lines():
    recs = [{"type": "step", "step": 1, "loss": 0.5}, {"type": "system", "step": 1, "cpu": 3.0},
            {"type": "step", "step": 2, "loss": 0.25, "x": 1}, {"type": "event", "kind": "note", "step": 2}]
    parsed = parse_lines(line_pairs([_line(r) for r in recs]), 0)
    assert isinstance(parsed.records, LineRecords) and list(parsed.records) == recs
    assert isinstance(parsed.step_columns.records, StepRecords)
    assert parsed.step_columns.records[1] is parsed.records[2]
    # A malformed line dropped: the rest as a list (of the same records).
    lines = [_line(r) for r in recs]
    parsed = parse_lines(line_pairs([*lines[:2], b"not json", *lines[2:]]), 0)
    assert parsed.records == recs and parsed.malformed == 1
    assert parsed.step_columns.records[1] is parsed.records[2]
