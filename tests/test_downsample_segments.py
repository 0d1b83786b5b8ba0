"""A run resumed from an older checkpoint repeats steps (a new header, then lower steps): history
shows each step once, from the latest segment that logged it, whatever the path (pyramid, file
read, marks, eval, system, events). A segment replaces the older segments' records at the steps it
covers (its first to its last step) only: what an older segment logged after that stays."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import answer_from_memory, lines_of

from gradmon.server.index import RunIndex
from gradmon.server.pyramid import BUCKET
from gradmon.server.segments import Replaced, Segments

# s0 trains 1..60000; s1 rolls back to 20000 and trains 20001..30000; s2 rolls back to 25000 (a
# checkpoint of s1) and trains 25001..27000; s3 rolls back to 50000 and trains 50001..52000; s4
# resumes from s0's step-60000 checkpoint and trains 60001..100000.
SEGMENTS = [(1, 60_000, 1.0), (20_001, 30_000, 2.0), (25_001, 27_000, 3.0), (50_001, 52_000, 4.0),
            (60_001, 100_000, 5.0)]
SPIKES = {26_000: (0, 1, 2), 29_000: (0, 1), 40_000: (0,), 51_000: (0, 3)}  # step -> segments flagging it
EVALS = {0: (25_000, 45_000), 1: (30_000,), 2: (27_000,), 3: (52_000,), 4: (100_000,)}


def _expected(step):
    if 25_001 <= step <= 27_000:
        return 3.0
    if 20_001 <= step <= 30_000:
        return 2.0
    if 50_001 <= step <= 52_000:
        return 4.0
    return 5.0 if step > 60_000 else 1.0


class _Run:
    def __init__(self):
        recs = []
        for k, (a, b, v) in enumerate(SEGMENTS):
            recs.append({"type": "header", "run_id": f"s{k}"})
            for i in range(a, b + 1):
                rec = {"type": "step", "step": i, "loss": v, "ts": 1e9 + k * 1e6 + i}
                if k in SPIKES.get(i, ()):
                    rec.update(spike=True, grad_norm=9.0 * v)
                recs.append(rec)
                if i in EVALS[k]:
                    recs.append({"type": "eval", "step": i, "accuracy": v})
                if i in (26_000, 26_500, 40_000):
                    recs.append({"type": "event", "kind": "note", "step": i, "segment": k})
                    recs.append({"type": "system", "step": i, "ts": 1.0, "cpu_percent": v})
        recs.append({"type": "event", "kind": "note", "segment": 4})  # no step: always kept
        self.pairs = lines_of(recs)
        self.idx = RunIndex()
        for k in range(0, len(self.pairs), 4000):
            self.idx.add_lines(self.pairs[k:k + 4000], self.pairs[k - 1][0] if k else 0)

    def __repr__(self):
        return "<resumed run>"


@pytest.fixture(scope="module")
def run():
    return _Run()


def _history(run, start, end, points):
    plan, series, _exact = answer_from_memory(run.idx, run.pairs, start, end, points)
    return plan, series


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 100_000), width=st.integers(0, 100_000),
       points=st.sampled_from([40, 400, 2000, 8000]))
def test_latest_segment_wins_for_repeated_steps(run, start, width, points):
    end = min(100_000, start + width)
    plan, series = _history(run, start, end, points)
    steps, values = series["loss"]
    assert steps == sorted(set(steps)), plan.kind  # one value per step, in step order
    assert all(start <= s <= end for s in steps)
    assert all(v == _expected(s) for s, v in zip(steps, values)), plan.kind
    ts_steps, ts = series["ts"]
    assert ts_steps == sorted(set(ts_steps))
    assert all(t == 1e9 + 1e6 * _segment_of(s) + s for s, t in zip(ts_steps, ts))  # the winner's time
    if end - start + 1 <= points:
        assert steps == list(range(start, end + 1))


def _segment_of(step):
    return {1.0: 0, 2.0: 1, 3.0: 2, 4.0: 3, 5.0: 4}[_expected(step)]


def test_steps_after_a_rollback_stay_and_replaced_ones_go(run):
    _plan, series = _history(run, 1, 100_000, 100_000)
    steps, values = series["loss"]
    assert steps == list(range(1, 100_001))  # every step once: the rolled-back stretches included
    assert values[30_000] == 1.0 and values[29_999] == 2.0  # step 30001 is s0's again, 30000 s1's


def test_marks_eval_system_and_events_go_with_their_steps(run):
    idx = run.idx.snapshot()
    assert [idx.replaced.intervals(k) for k in range(5)] == [
        ((20_001, 30_000), (50_001, 52_000)), ((25_001, 27_000),), (), (), ()]
    # the spike at 26000 of s0 and s1 is replaced by s2's, at 29000 s0's by s1's, at 51000 s0's by s3's
    assert [(m["step"], m["value"]) for m in idx.marks_in(1, 100_000)] == [
        (26_000, 27.0), (29_000, 18.0), (40_000, 9.0), (51_000, 36.0)]
    assert idx.eval_in(1, 100_000)["accuracy"] == {
        "step": [27_000, 30_000, 45_000, 52_000, 100_000], "value": [3.0, 2.0, 1.0, 4.0, 5.0]}
    assert idx.system_in(1, 100_000, 100)["cpu_percent"] == {
        "step": [26_000, 26_500, 40_000], "value": [3.0, 3.0, 1.0]}
    assert [(e.get("step"), e["segment"]) for e in idx.events_in(1, 100_000)] == [
        (40_000, 0), (26_000, 2), (26_500, 2), (None, 4)]
    assert idx.latest_segment() == {"first_step": 60_001, "last_step": 100_000}
    _plan, series = _history(run, 1, 100_000, 400)
    assert list(zip(*series["grad_norm"])) == [(26_000, 27.0), (29_000, 18.0), (40_000, 9.0), (51_000, 36.0)]


def _lines_read(run, plan):
    return sum(1 for end, _ln in run.pairs for lo, hi in plan.ranges if lo < end <= hi)


def test_a_replaced_stretch_is_skipped_not_read_back(run):
    # The pyramid plan reads back only the few base buckets at the edges of each replaced stretch.
    plan, _series = _history(run, 1, 100_000, 2000)
    assert plan.kind == "pyramid" and len(plan.edges) <= 12
    # A zoom inside s1's stretch reads s1's buckets, not the 40000 records between them and s0's.
    plan, series = _history(run, 21_000, 21_100, 2000)
    assert plan.kind == "exact" and series["loss"][0] == list(range(21_000, 21_101))
    assert _lines_read(run, plan) <= 3 * BUCKET
    # A zoom across s0's last kept steps and the start of s1's stretch reads two separate ranges.
    plan, series = _history(run, 19_950, 20_050, 2000)
    assert len(plan.ranges) == 2 and _lines_read(run, plan) <= 4 * BUCKET + 4
    assert series["loss"][1] == [1.0] * 51 + [2.0] * 50


# ---- pure parts ------------------------------------------------------------------------------


def test_replaced_is_the_union_of_the_later_segments_spans():
    rep = Replaced.of_spans([1, 21, 11, 15, 31, math.inf], [40, 30, 25, 16, 32, -math.inf])
    assert rep.intervals(0) == ((11, 32),)  # [11, 25], [21, 30] and [31, 32] overlap or touch: one
    assert [rep.intervals(k) for k in (1, 2, 3, 4, 5)] == [((21, 25),), ((15, 16),), (), (), ()]
    assert [s for s in range(1, 42) if rep.hides(0, s)] == list(range(11, 33))
    assert [s for s in range(1, 42) if rep.hides(1, s)] == list(range(21, 26))
    assert not rep.hides(2, 14) and rep.hides(2, 15) and rep.any
    assert not Replaced.of_spans([1, 41], [40, 60]).any  # a plain resume replaces nothing


def test_bucket_cover_finds_whole_and_partial_buckets_by_bisection():
    seg = Segments()
    seg.note_steps(1, 1000)  # buckets of 10 steps: 1-10, 11-20, ..., 991-1000
    seg.start(offset=5000, bucket=100)
    seg.note_steps(95, 305)
    lo = [1 + 10 * b for b in range(100)] + [95 + 10 * b for b in range(22)]
    hi = [10 + 10 * b for b in range(100)] + [min(305, 104 + 10 * b) for b in range(22)]
    cover = seg.bucket_cover(seg.replaced(), lo, hi, len(lo))
    assert (cover.gone_starts, cover.gone_ends) == ([10], [30])  # steps 101..300: buckets 10..29
    assert cover.partial == {9: ((95, 305),), 30: ((95, 305),)}  # 91-100 and 301-310: partly
    assert cover.all_gone(12, 20) and not cover.all_gone(9, 12)
    assert cover.touches(0, 10) and cover.touches(29, 31) and not cover.touches(31, 122)


@settings(max_examples=40, deadline=None)
@given(segs=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 900), st.integers(1, 3), st.booleans(),
                               st.integers(0, 2**32)), min_size=1, max_size=5),
       start=st.integers(0, 4000), width=st.integers(0, 4000), points=st.sampled_from([8, 60, 400, 100_000]))
def test_any_segments_match_a_brute_force_reading(segs, start, width, points):
    """Random segments (sparse log steps, steps out of order within a segment) against the rule
    read literally: record (k, s) shows unless a later segment's first..last steps include s."""
    recs, logged = [], []
    for k, (a, n, stride, ordered, seed) in enumerate(segs):
        steps = list(range(a, a + n * stride, stride))
        if not ordered:
            random.Random(seed).shuffle(steps)
        recs.append({"type": "header", "run_id": f"s{k}"})
        for s in steps:
            rec = {"type": "step", "step": s, "loss": k * 10_000.0 + s}
            if s % 97 == 0:
                rec["spike"] = True
            recs.append(rec)
            logged.append((k, s))
    spans = [(min(s for j, s in logged if j == k), max(s for j, s in logged if j == k))
             for k in range(len(segs)) if any(j == k for j, _ in logged)]
    seg_ids = [k for k in range(len(segs)) if any(j == k for j, _ in logged)]
    span_of = dict(zip(seg_ids, spans))
    visible = {(s, k * 10_000.0 + s) for k, s in logged
               if not any(j > k and span_of[j][0] <= s <= span_of[j][1] for j in span_of)}
    pairs = lines_of(recs)
    idx = RunIndex()
    for i in range(0, len(pairs), 333):
        idx.add_lines(pairs[i:i + 333], pairs[i - 1][0] if i else 0)
    end = start + width
    want = sorted(p for p in visible if start <= p[0] <= end)
    plan, series, exact = answer_from_memory(idx, pairs, start, end, points)
    got = sorted(zip(*series.get("loss", ([], []))))
    assert set(got) <= set(want), plan.kind
    if exact or len(want) <= points:
        assert got == want, plan.kind
    elif want:
        values = [v for _s, v in want]
        assert min(values) in {v for _s, v in got} and max(values) in {v for _s, v in got}
        if all(ordered for _a, _n, _stride, ordered, _seed in segs):  # the range's first and last steps
            assert got[0] == want[0] and got[-1] == want[-1], plan.kind
    marks = idx.snapshot().marks_in(start, end)
    assert sorted(m["step"] for m in marks) == sorted(s for s, _v in want if s % 97 == 0)


def test_pyramid_points_are_in_step_order_when_a_rollback_fills_whole_buckets():
    # s1 replaces exactly base buckets 2 and 3 of s0 with two whole buckets of its own: no bucket is
    # partly replaced, so the answer is made of whole pyramid nodes, from two segments.
    recs = [{"type": "header", "run_id": "s0"}]
    recs += [{"type": "step", "step": i, "loss": 1.0 + i % 3} for i in range(1, 10 * BUCKET + 1)]
    recs += [{"type": "header", "run_id": "s1"}]
    recs += [{"type": "step", "step": i, "loss": 2.0 + i % 5} for i in range(2 * BUCKET + 1, 4 * BUCKET + 1)]
    pairs = lines_of(recs)
    idx = RunIndex()
    idx.add_lines(pairs, 0)
    for points in (8, 40):
        plan, series, _exact = answer_from_memory(idx, pairs, 1, 10 * BUCKET, points)
        assert plan.kind == "pyramid" and not plan.edges
        steps, values = series["loss"]
        assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 10 * BUCKET
        assert all(v == (2.0 + s % 5 if 2 * BUCKET < s <= 4 * BUCKET else 1.0 + s % 3)
                   for s, v in zip(steps, values))
        assert {1.0, 3.0, 2.0, 6.0} <= set(values)  # the min and max of both segments
