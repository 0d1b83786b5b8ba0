"""The history answer's fast paths give what the general code gives: strict JSON in one C call
(``jsontext.strict_json``, events spliced in encoded), merging a few points into a series by
insertion (``readback.merge_series``), and a pyramid plan's points read per level from the
stored columns (``Level.extend_points``) rather than summary by summary, and the series encoded by
orjson (``history._series_json``) as the stdlib encodes them."""

from __future__ import annotations

import json
import math
import pickle
import random
from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import index_of

from gradmon.server import history, jsontext, query
from gradmon.server.index import RunIndex
from gradmon.server.jsontext import dumps, json_body, strict_json
from gradmon.server.pyramid import FANOUT, Pyramid, Summary
from gradmon.server.readback import _unkey, _values_key, merge_series

_numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=4), inner, max_size=5)),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_strict_json_is_dumps(value):
    assert strict_json(value) == dumps(value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _json, min_size=1, max_size=5), st.lists(_json, max_size=5),
       st.integers(0, 5))
def test_encoded_items_spliced_in_give_the_whole_encoding(body, items, at):
    keys = list(body)
    key = keys[at % len(keys)]
    whole = dict(body, **{key: items})
    spliced = dict(body, **{key: None})
    encoded = [dumps(x).encode() for x in items]
    assert json_body(spliced, False, {key: encoded}) == json_body(whole, False)
    assert json_body(whole, False) == (dumps(whole).encode(), False)


def _merge_by_sorting(into, extra):  # merge_series as it was: one sort of the union, always
    for name, (steps, values) in extra.items():
        if not steps:
            continue
        old_s, old_v = into.get(name, ([], []))
        pts = sorted(set(zip(old_s, _values_key(old_v))) | set(zip(steps, _values_key(values))),
                     key=lambda p: p[0])
        into[name] = ([p[0] for p in pts], [_unkey(p[1]) for p in pts])


def _same(a, b):
    return a.keys() == b.keys() and all(
        a[n][0] == b[n][0] and [repr(v) for v in a[n][1]] == [repr(v) for v in b[n][1]] for n in a)


def test_merging_a_few_or_many_points_gives_what_sorting_the_union_gives():
    rng = random.Random(5)
    vals = [0.0, -0.0, 1, 1.0, 2.5, math.nan, math.inf]
    for case in range(400):
        n = rng.choice([0, 3, 50, 300])
        old_steps = sorted(rng.sample(range(1000), n))
        if case % 5 == 0 and n > 2:
            old_steps[1] = old_steps[0]  # a step twice: the sort decides
        old = {"a": (old_steps, [rng.choice(vals) for _ in old_steps])}
        k = rng.choice([1, 4, 70, 200])
        steps = [rng.randrange(1000) for _ in range(k)] + rng.sample(old_steps, min(3, n))
        values = [rng.choice(vals) for _ in steps]
        if case % 3 == 0:  # equal to the points there already
            values[-min(3, n):] = [old["a"][1][old_steps.index(s)] for s in steps[-min(3, n):]] if n else []
        extra = {"a": (steps, values), "b": ([5, 5, 7], [1.0, 1.0, math.nan])}
        fast, slow = {k: (list(s), list(v)) for k, (s, v) in old.items()}, dict(old)
        merge_series(fast, extra)
        _merge_by_sorting(slow, extra)
        assert _same(fast, slow), case


def _summary(rng, step, offset, names):
    s = Summary(offset)
    for k in range(rng.randrange(1, 6)):
        s.add(step + k, [(n, rng.choice([1.0, 2.0, rng.random()])) for n in names if rng.random() < 0.8])
    return s


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 3, 256]))
def test_level_points_read_as_columns_are_each_summary_s_points(tmp_path_factory, seed, flush_every):
    """Stored (a sidecar's level files) or in memory, and across the stored part's end."""
    rng = random.Random(seed)
    directory = str(tmp_path_factory.mktemp("lvl"))
    pyr = Pyramid()
    pyr.attach(directory)
    names = ["loss", "lr", "late"]
    for b in range(rng.randrange(1, 200)):
        pyr.push(_summary(rng, b * 10, b * 100, names if b > 20 else names[:2]))
        if b % flush_every == 0:
            pyr.flush()
    for level in pyr.levels:
        nodes = sorted(rng.sample(range(level.size), rng.randrange(0, level.size + 1)))
        for name in [*names, "absent"]:
            got: list = []
            level.extend_points(name, nodes, got)
            assert got == [p for i in nodes for p in level.get(i).points(name)], (name, nodes)
    pyr.release()
    assert FANOUT == 4


def test_an_index_checkpointed_before_events_were_kept_encoded_encodes_them_on_load():
    idx = RunIndex()
    idx._add_events([{"type": "event", "kind": "alarm", "step": 3, "value": math.nan},
                     {"type": "event", "kind": "note"}])
    state = dict(vars(idx))
    del state["event_json"], state["event_steps"]
    old = RunIndex.__new__(RunIndex)
    old.__setstate__(state)
    assert list(old.event_json) == list(idx.event_json) == [
        dumps(e).encode() for e in idx.events]
    assert list(old.event_steps) == [3, None]
    again = pickle.loads(pickle.dumps(idx))
    assert again.snapshot().events_in(0, 10) == idx.snapshot().events_in(0, 10) == [
        {"type": "event", "kind": "alarm", "step": 3, "value": "NaN"}, {"type": "event", "kind": "note"}]


def _series_node_by_node(idx, start, end, points):
    """A pyramid plan's series as plan_history made them before: each inner node's points in the
    nodes' order, then one stable sort by step."""
    steps, segs = idx.steps, idx.segments
    base = steps.pyramid.base
    view = query._View(steps.pyramid, steps.open_summary(),
                       segs.bucket_cover(segs.replaced(), base.lo, base.hi, base.size))
    nodes = view.cover(start, end, max(1, points // 4))
    inner = [nd for nd in nodes if not view.partial(nd, start, end)]
    out = {}
    for name in steps.series_names():
        pts = sorted((p for nd in inner for p in view.node(nd).points(name)), key=itemgetter(0))
        out[name] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def test_a_pyramid_plan_s_series_are_those_node_by_node_with_segments_and_repeated_steps():
    rng = random.Random(3)
    for case in range(4):
        recs, step = [], 1
        for _seg in range(rng.randrange(1, 4)):
            recs.append({"type": "header", "run_id": "r"})
            step = max(1, step - rng.randrange(0, 6000))  # a resume from an older checkpoint
            for _ in range(rng.randrange(2000, 6000)):
                recs.append({"type": "step", "step": step, "loss": rng.choice([1.0, 2.0, rng.random()]),
                             "lr": 0.1})
                step += 0 if (case % 2 and rng.random() < 0.01) else 1  # (odd cases: a step logged twice)
        if case == 0:  # each base bucket's first record at its predecessor's last step: a tie per node
            recs = [{"type": "header", "run_id": "r"}] + [
                {"type": "step", "step": b * 127 + j, "loss": rng.random()}
                for b in range(200) for j in range(128)]
        idx = index_of(recs)
        for start, end, points in ((-math.inf, math.inf, 200), (2000, 7000, 120), (-math.inf, 5000, 60)):
            plan = idx.plan_history(start, end, points, 1 << 40)
            if plan.kind == "pyramid":
                assert plan.series == _series_node_by_node(idx, start, end, points), (case, start, end)


_series_values = st.lists(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _series_values, max_size=4))
def test_series_encoded_by_orjson_are_the_stdlib_s_numbers(values):
    # history._series_json (orjson) or, when it declines, the stdlib's strict encoding: the same
    # JSON values, each non-finite number named; never a NaN written as null.
    series = {name: (list(range(len(v))), v) for name, v in values.items()}
    want = json.loads(strict_json({n: {"step": s, "value": v} for n, (s, v) in series.items()}))
    plain, fast = history._series_json(series)
    assert json.loads(strict_json(plain)) == want
    if fast is None:  # (an integer orjson cannot take, or a sum too big for a float)
        assert any(type(x) is int and abs(x) >= 2**63 for v in values.values() for x in v) or any(
            _sum_overflows(v) for v in values.values())
        return
    assert json.loads(fast) == want  # (a NaN written as null would not be the stdlib's "NaN")


def _sum_overflows(values: list) -> bool:
    try:
        math.isfinite(sum(values))
    except OverflowError:
        return True
    return False


def test_a_history_answer_is_the_same_with_orjson_or_without(tmp_path, monkeypatch):
    # A log with a NaN loss and an infinite norm: the body orjson encodes parses to the stdlib's.
    from gradmon.server.history import HistoryOptions, answer, build_job
    from gradmon.server.runs import Run

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"type": "step", "step": s, "loss": 1.0 / s, "grad_norm": 2.0 + s % 7, "lr": 1e-07})
             for s in range(1, 3000)]
    lines[500] = '{"type": "step", "step": 501, "loss": "NaN", "grad_norm": "Infinity"}'
    # system records (one with a NaN) and eval records between them: encoded by orjson too
    for s in range(2998, 0, -3):
        cpu = '"NaN"' if s == 1501 else 50.0 + s % 11
        lines.insert(s, f'{{"type": "system", "step": {s}, "cpu_percent": {cpu}, "rss_mb": {1000 + s}}}')
    for s in range(2900, 0, -100):
        lines.insert(s, json.dumps({"type": "eval", "step": s, "eval_loss": 1.0 / s}))
    path.write_text("\n".join(lines) + "\n")
    run = Run("r", str(path), sidecar=False)
    while run.poll()[2]:
        pass
    bodies = {}
    for label in ("orjson", "stdlib"):
        if label == "stdlib":
            monkeypatch.setattr(jsontext, "_orjson_dumps", None)
        for span in ((None, None), (400, 600), (1, 2999)):
            job = build_job(run, HistoryOptions(200, *span))
            if label == "orjson":  # (the series, system and eval points took the orjson path)
                assert history._series_json(history.answer_series(job)[0])[1] is not None
                lo, hi = job.options.lo, job.options.hi
                assert history._points_json(job.index.system_in(lo, hi, 200))[1] is not None
                assert history._points_json(job.index.eval_in(lo, hi))[1] is not None
            bodies[label, span] = answer(job)[0]
    for span in ((None, None), (400, 600), (1, 2999)):
        fast, plain = json.loads(bodies["orjson", span]), json.loads(bodies["stdlib", span])
        assert fast == plain, span
        assert 501 in fast["series"]["loss"]["step"], span  # (the NaN point: exact, or added by its mark)
        assert fast["series"]["loss"]["value"][fast["series"]["loss"]["step"].index(501)] == "NaN", span
        assert fast["system"]["cpu_percent"]["step"] and fast["eval"]["eval_loss"]["step"], span
        # (the marks, by orjson too: non-finite values named, as the stdlib's strict encoding names them)
        assert {m["value"] for m in fast["marks"] if m["step"] == 501} == {"NaN", "Infinity"}, span
        if span != (400, 600):
            cpu = fast["system"]["cpu_percent"]
            assert cpu["value"][cpu["step"].index(1501)] == "NaN", span


def test_a_zoom_too_fine_for_the_pyramid_is_read_back_without_taking_its_points(monkeypatch):
    # 2,000 of 40,000 steps at 2,000 points: 15 base buckets give at most 60 points a series, fewer
    # than half the points asked for, so the range is read back; the points are not taken first.
    from gradmon.server.pyramid import Level

    recs = [{"type": "step", "step": s, "loss": 1.0 / s, "grad_norm": float(s % 13)}
            for s in range(1, 40_001)]
    idx = index_of(recs)
    plan = idx.plan_history(10_000, 14_000, 2000, 1 << 60)
    assert plan.kind == "read" and plan.ranges

    def no_points(*_a, **_k):
        raise AssertionError("the pyramid's points were taken")

    monkeypatch.setattr(Level, "extend_points", no_points)
    assert idx.plan_history(10_000, 14_000, 2000, 1 << 60).kind == "read"
    with pytest.raises(AssertionError, match="points were taken"):  # (a coarse range takes them)
        idx.plan_history(1, 40_000, 2000, 1 << 60)


_point_values = st.sampled_from([0.0, -0.0, 1.0, 2.0, -1.5])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.tuples(st.integers(0, 2), _point_values), min_size=1,
                                                      max_size=5)), max_size=12))
def test_a_level_s_points_by_columns_are_each_summary_s_sorted_distinct_points(nodes):
    # Summaries built record by record (steps that go up, repeat or go back; -0.0 beside 0.0; ties),
    # some without the field (count 0): pyramid._extend_points against each summary's distinct
    # points sorted (of equal points the first of first, min, max, last kept: repr-equal), which
    # are Summary.points (equal; at a repeated step it may keep a -0.0 for a 0.0).
    from gradmon.server.pyramid import _extend_points

    summaries, step = [], 0
    for gap, recs in nodes:
        s = Summary(0)
        if gap == 3:  # (no value of the field here)
            s.add(step, [])
        for d, v in recs:
            step += d - 1 if gap == 2 else d  # (gap 2: steps may repeat or go back)
            if gap != 3:
                s.add(step, [("f", v)])
        summaries.append(s)
    cols = [[(s.fields["f"][k] if "f" in s.fields else 0) for s in summaries] for k in range(9)]
    got: list = []
    _extend_points(got, cols)
    fields = [s.fields["f"] for s in summaries if "f" in s.fields]
    want = [p for f in fields for p in sorted({(f[1], f[2]), (f[5], f[6]), (f[7], f[8]), (f[3], f[4])})]
    assert repr(got) == repr(want)
    assert got == [p for s in summaries for p in s.points("f")]
