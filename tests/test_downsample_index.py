"""The min/max pyramid index answers like a brute-force downsampler: spikes, NaN, min and max of
any step range survive, whatever the run length and the bucket boundaries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import answer_from_memory, index_of, lines_of

from gradmon.logformat.jsonl import encode_record
from gradmon.server import parse
from gradmon.server.index import RunIndex
from gradmon.server.pyramid import BUCKET, FANOUT, Summary, merge_summaries


def _build(values, flags=()):
    """An index of step records ``grad_norm = values[i]`` at step ``i + 1``, each line 100 bytes
    (record ``i`` starts at byte ``i * 100``), and the lines."""
    recs = [{"type": "step", "step": i + 1, "grad_norm": v, **({"spike": True} if i in flags else {})}
            for i, v in enumerate(values)]
    pairs = lines_of(recs, width=100)
    idx = RunIndex()
    for k in range(0, len(pairs), 500):
        idx.add_lines(pairs[k:k + 500], pairs[k - 1][0] if k else 0)
    return idx, pairs


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6000), spike_at=st.integers(0, 10**6), nan_at=st.integers(0, 10**6),
       points=st.integers(8, 600), lo=st.integers(0, 10**6), width=st.integers(0, 10**6))
def test_pyramid_keeps_spike_nan_min_max(n, spike_at, nan_at, points, lo, width):
    values = [math.sin(i) for i in range(n)]
    s, z = spike_at % n, nan_at % n
    values[s] = 1e9
    values[z] = math.nan
    idx, pairs = _build(values)
    start = lo % n + 1
    end = min(n, start + width % n)
    plan, series, _exact = answer_from_memory(idx, pairs, start, end, points)
    if plan.kind != "pyramid":
        return  # small ranges are read back from the file (tested with the server)
    steps, vals = series["grad_norm"]
    got = dict(zip(steps, vals))
    assert all(start <= st_ <= end for st_ in steps)
    if start <= s + 1 <= end and s != z:
        assert got[s + 1] == 1e9
    if start <= z + 1 <= end:
        assert math.isnan(got[z + 1])
    fin = [values[i - 1] for i in range(start, end + 1) if math.isfinite(values[i - 1])]
    if fin:
        assert min(fin) in vals and max(fin) in vals
    # about `points`: never more than 4 per node of the coarsest cover, plus marks and the edges,
    # plus the nodes split at the range's two ends (at most FANOUT - 1 per level each; e.g. n=4608,
    # points=60, [1, 4352] gets 65)
    levels = len(idx.steps.pyramid.levels)
    split = 4 * 2 * (FANOUT - 1) * levels
    assert len(steps) <= max(points, 16 * levels + 4) + 2 + 4 * len(plan.edges) + split
    assert steps == sorted(steps)


def test_small_range_is_read_back_exactly_from_byte_offsets():
    idx, _pairs = _build([float(i) for i in range(10 * BUCKET)])
    plan = idx.plan_history(300, 310, 100, cursor=10 * BUCKET * 100)
    assert plan.kind in ("exact", "read")  # read from the file; exactness decided on the records read
    assert plan.byte_lo <= (300 - 1) * 100 and plan.byte_hi >= 310 * 100
    assert plan.byte_hi - plan.byte_lo <= 2 * BUCKET * 100  # only the buckets that hold the range


def test_levels_merge_and_memory_stays_columnar():
    idx, _pairs = _build([float(i % 17) for i in range(BUCKET * 64 + 5)])
    levels = idx.steps.pyramid.levels
    assert [lvl.size for lvl in levels] == [64, 16, 4, 1]
    top = levels[3].get(0)
    assert top.n == BUCKET * 64 and top.lo == 1 and top.hi == BUCKET * 64
    assert top.fields["grad_norm"][6] == 0.0 and top.fields["grad_norm"][8] == 16.0


def test_merge_summaries_keeps_extremes_and_ends():
    a, b = Summary(0), Summary(50)
    a.add(1, [("x", 5.0)])
    a.add(2, [("x", -1.0)])
    b.add(3, [("x", 9.0)])
    b.add(4, [("y", 1.0)])
    m = merge_summaries([a, b])
    assert m.n == 4 and m.offset == 0 and (m.lo, m.hi) == (1, 4)
    assert m.fields["x"] == [3, 1, 5.0, 3, 9.0, 2, -1.0, 3, 9.0]
    assert m.points("x") == [(1, 5.0), (2, -1.0), (3, 9.0)]
    assert m.points("y") == [(4, 1.0)]


def test_marks_events_eval_headers_and_end():
    idx = index_of([
        {"type": "header", "run_id": "a", "alarm_rule": {}},  # its writer judges alarms: none derived
        {"type": "step", "step": 1, "loss": math.inf, "nonfinite": True, "skipped": True},
        {"type": "step", "step": 2, "loss": 1.0, "grad_norm": 50.0, "spike": True},
        {"type": "eval", "step": 2, "loss": 0.3, "accuracy": 0.9},
        {"type": "event", "kind": "spike", "step": 2},
        {"type": "end", "status": "aborted"},
    ])
    assert idx.steps.marks == [(1, "nonfinite", "loss", math.inf, None), (1, "skip", "loss", math.inf, None),
                               (2, "spike", "grad_norm", 50.0, None)]
    assert idx.ended == "aborted" and idx.steps.fields == ["loss", "grad_norm"]
    snap = idx.snapshot()
    assert snap.eval_in(2, 2)["accuracy"] == {"step": [2], "value": [0.9]}
    assert snap.events_in(3, 9) == [] and len(snap.events_in(1, 2)) == 1
    idx.add_lines([(200, encode_record({"type": "header", "run_id": "b"}).rstrip("\n").encode())], 150)
    assert idx.ended is None and len(idx.headers) == 2  # a restart: a new segment, not ended


def test_loss_scale_overflow_step_is_a_skip_mark_not_a_nonfinite_one():
    overflow = {"type": "step", "step": 2, "loss": 0.7, "grad_norm": "Infinity", "grad_norm_local": "NaN",
                "loss_scale": 65536.0, "skipped": True, "skip_reason": "overflow"}
    idx = index_of([
        {"type": "header", "run_id": "a"},
        {"type": "step", "step": 1, "loss": 0.8, "grad_norm": 1.0, "grad_norm_local": 1.0},
        overflow,
        # a non-finite loss is never an overflow: marked whatever the record says
        {**overflow, "step": 3, "loss": "NaN"},
        {"type": "step", "step": 4, "loss": 0.6, "grad_norm": "Infinity", "nonfinite": True, "skipped": True,
         "skip_reason": "nonfinite"},
    ])
    assert idx.steps.marks == [
        (2, "skip", "grad_norm", math.inf, "overflow"),
        (3, "nonfinite", "loss", pytest.approx(math.nan, nan_ok=True), None),
        (3, "skip", "grad_norm", math.inf, "overflow"),
        (4, "nonfinite", "grad_norm", math.inf, None), (4, "skip", "grad_norm", math.inf, "nonfinite"),
    ]
    assert idx.snapshot().marks_in(2, 2) == [
        {"step": 2, "kind": "skip", "field": "grad_norm", "value": math.inf, "reason": "overflow"}]


@pytest.mark.parametrize("orjson", [True, False])
def test_batched_building_matches_record_by_record_and_marks_late_overflow(orjson, monkeypatch):
    """Lines indexed in batches give the same pyramid as records added one by one; a number
    literal too big for a float (1e999, never flagged by the writer) still gets its mark."""
    if not orjson:
        monkeypatch.setattr(parse, "_orjson_loads", None)

    recs = [{"type": "header", "run_id": "a"}]
    for i in range(1, 3 * BUCKET + 7):
        rec = {"type": "step", "step": i, "ts": 1e9 + i, "loss": math.sin(i), "grad_norm": float(i % 13)}
        if i == 50:
            rec.update(spike=True, grad_norm=1e6)
        if i == 70:
            rec.update(loss=math.nan, nonfinite=True)
        if i == 99:
            rec["extra"] = 7  # a field that appears late
        recs.append(rec)
    lines = [encode_record(r).rstrip("\n").encode() for r in recs]
    lines[200] = lines[200].replace(b'"grad_norm":', b'"grad_norm":1e999,"x":')  # overflow literal
    lines.insert(10, b"garbage")
    one, batched = RunIndex(), RunIndex()
    pairs, end = [], 0
    for ln in lines:
        one.add_lines([(end + len(ln) + 1, ln)], end)
        end += len(ln) + 1
        pairs.append((end, ln))
    for k in range(0, len(pairs), 37):
        batched.add_lines(pairs[k:k + 37], pairs[k - 1][0] if k else 0)
    for idx in (one, batched):
        steps = idx.steps
        assert idx.malformed == 1 and idx.records == len(recs) and steps.count == len(recs) - 1
        assert steps.fields == ["loss", "grad_norm", "extra", "x"] and steps.series_names()[-1] == "ts"
        assert (50, "spike", "grad_norm", 1e6, None) in steps.marks
        assert any(m[:3] == (70, "nonfinite", "loss") and math.isnan(m[3]) for m in steps.marks)
        assert (200, "nonfinite", "grad_norm", math.inf, None) in steps.marks
        assert steps.pyramid.base.size == 3
    a, b = one.steps.pyramid.base, batched.steps.pyramid.base
    assert list(a.offset) == list(b.offset)
    assert {n: [list(c) for c in cols] for n, cols in a.fields.items()} == \
        {n: [list(c) for c in cols] for n, cols in b.fields.items()}
    open_one, open_batched = one.steps.open_summary(), batched.steps.open_summary()
    assert open_one.fields == open_batched.fields and open_one.n == 6
