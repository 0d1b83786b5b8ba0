"""The min/max pyramid index answers like a brute-force downsampler: spikes, NaN, min and max of
any step range survive, whatever the run length and the bucket boundaries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.jsonl import encode_record
from gradmon.server import parse
from gradmon.server.downsample import downsample_indices
from gradmon.server.index import BUCKET, RunIndex, Summary, merge_series, merge_summaries


def _build(values, flags=()):
    idx = RunIndex()
    for i, v in enumerate(values):
        rec = {"type": "step", "step": i + 1, "grad_norm": v}
        if i in flags:
            rec["spike"] = True
        idx.add(rec, offset=i * 100)
    return idx


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6000), spike_at=st.integers(0, 10**6), nan_at=st.integers(0, 10**6),
       points=st.integers(8, 600), lo=st.integers(0, 10**6), width=st.integers(0, 10**6))
def test_pyramid_keeps_spike_nan_min_max(n, spike_at, nan_at, points, lo, width):
    values = [math.sin(i) for i in range(n)]
    s, z = spike_at % n, nan_at % n
    values[s] = 1e9
    values[z] = math.nan
    idx = _build(values)
    start = lo % n + 1
    end = min(n, start + width % n)
    plan = idx.plan_history(start, end, points, cursor=n * 100)
    if plan.kind != "pyramid":
        return  # small ranges are read back from the file (tested with the server)
    series = plan.series
    for lo_b, hi_b, s_lo, s_hi in plan.edges:  # what the server reads back from the file
        first, last = lo_b // 100 + 1, hi_b // 100
        edge = [(i, values[i - 1]) for i in range(first, last + 1) if s_lo <= i <= s_hi]
        keep = downsample_indices([v for _, v in edge], 1)  # as series_from_lines(..., points=4)
        merge_series(series, {"grad_norm": ([edge[k][0] for k in keep], [edge[k][1] for k in keep])})
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
    # about `points`: never more than 4 per node of the coarsest cover, plus marks and the edges
    assert len(steps) <= max(points, 16 * len(idx.levels) + 4) + 2 + 4 * len(plan.edges)
    assert steps == sorted(steps)


def test_small_range_is_read_back_exactly_from_byte_offsets():
    idx = _build([float(i) for i in range(10 * BUCKET)])
    plan = idx.plan_history(300, 310, 100, cursor=10 * BUCKET * 100)
    assert plan.kind in ("exact", "read")  # read from the file; exactness decided on the records read
    assert plan.byte_lo <= (300 - 1) * 100 and plan.byte_hi >= 310 * 100
    assert plan.byte_hi - plan.byte_lo <= 2 * BUCKET * 100  # only the buckets that hold the range


def test_levels_merge_and_memory_stays_columnar():
    idx = _build([float(i % 17) for i in range(BUCKET * 64 + 5)])
    assert [lvl.size for lvl in idx.levels] == [64, 16, 4, 1]
    top = idx.levels[3].get(0)
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
    idx = RunIndex()
    idx.add({"type": "header", "run_id": "a"}, 0)
    idx.add({"type": "step", "step": 1, "loss": math.inf, "nonfinite": True, "skipped": True}, 10)
    idx.add({"type": "step", "step": 2, "loss": 1.0, "grad_norm": 50.0, "spike": True}, 20)
    idx.add({"type": "eval", "step": 2, "loss": 0.3, "accuracy": 0.9}, 30)
    idx.add({"type": "event", "kind": "spike", "step": 2}, 40)
    idx.add({"type": "end", "status": "aborted"}, 50)
    assert idx.marks == [(1, "nonfinite", "loss", math.inf), (1, "skip", "loss", math.inf),
                         (2, "spike", "grad_norm", 50.0)]
    assert idx.ended == "aborted" and idx.fields == ["loss", "grad_norm"]
    assert idx.eval_in(2, 2)["accuracy"] == {"step": [2], "value": [0.9]}
    assert idx.events_in(3, 9) == [] and len(idx.events_in(1, 2)) == 1
    idx.add({"type": "header", "run_id": "b"}, 60)  # a restart: a new segment, not ended
    assert idx.ended is None and len(idx.headers) == 2


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
        one.add_line(ln, end)
        end += len(ln) + 1
        pairs.append((end, ln))
    for k in range(0, len(pairs), 37):
        batched.add_lines(pairs[k:k + 37], pairs[k - 1][0] if k else 0)
    for idx in (one, batched):
        assert idx.malformed == 1 and idx.records == len(recs) and idx.step_records == len(recs) - 1
        assert idx.fields == ["loss", "grad_norm", "extra", "x"] and idx.series_names()[-1] == "ts"
        assert (50, "spike", "grad_norm", 1e6) in idx.marks
        assert any(m[:3] == (70, "nonfinite", "loss") and math.isnan(m[3]) for m in idx.marks)
        assert (200, "nonfinite", "grad_norm", math.inf) in idx.marks
        assert idx.levels[0].size == 3
    a, b = one.levels[0], batched.levels[0]
    assert list(a.offset) == list(b.offset)
    assert {n: [list(c) for c in cols] for n, cols in a.fields.items()} == \
        {n: [list(c) for c in cols] for n, cols in b.fields.items()}
    assert one._open.fields == batched._open.fields and one._open.n == 6
