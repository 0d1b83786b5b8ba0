"""`system` and `layers` records in the server's history: the pure capped series (sampled.py), the
index, and a real server (port 0) read over HTTP and WebSocket after the file was written."""

from __future__ import annotations

import asyncio
import math

import psutil
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import append, get_json, header, index_of, recv_json, step, wait_for
from websockets.asyncio.client import connect

from gradmon.monitor.sysmetrics import sample_system
from gradmon.server import start_server
from gradmon.server.sampled import SampledSeries
from gradmon.server.segments import Replaced

NOTHING = Replaced.none()  # one segment, nothing replaced
NO_CUT = lambda: NOTHING  # noqa: E731


# ---- SampledSeries (pure) -----------------------------------------------------------------------

def test_sampled_series_keeps_one_point_per_step_newest_wins():
    s = SampledSeries(cap=16)
    s.add(5, [("rss", 1.0), ("cpu", 10.0)], 0, NO_CUT)
    s.add(5, [("rss", 2.0)], 0, NO_CUT)  # same step, training did not advance: replaces
    s.add(7, [("rss", 3.0)], 0, NO_CUT)
    out = s.query(-math.inf, math.inf, 100, NOTHING)
    assert out == {"rss": {"step": [5, 7], "value": [2.0, 3.0]}, "cpu": {"step": [5], "value": [10.0]}}
    assert s.query(6, 100, 100, NOTHING)["rss"] == {"step": [7], "value": [3.0]}
    assert s.query(6, 100, 100, NOTHING)["cpu"] == {"step": [], "value": []}


def test_sampled_series_cap_is_bounded_and_keeps_the_peak():
    s = SampledSeries(cap=64)
    for i in range(10_000):
        s.add(i, [("rss", 1000.0 + (1e9 if i == 4321 else 0.0) - (500.0 if i == 777 else 0.0))], 0, NO_CUT)
        assert len(s.fields["rss"].steps) <= 64
    out = s.query(-math.inf, math.inf, 10_000, NOTHING)["rss"]
    pts = dict(zip(out["step"], out["value"]))
    assert pts[4321] == 1e9 + 1000.0 and pts[777] == 500.0  # max and min survive every compaction
    assert out["step"] == sorted(out["step"]) and out["step"][-1] == 9999
    assert s.compactions > 0


def test_sampled_series_query_downsamples_min_max_and_leaves_out_replaced_steps():
    s = SampledSeries(cap=100_000)
    for i in range(1, 1001):
        s.add(i, [("cpu", 50.0 + (40.0 if i == 500 else 0.0))], 0, NO_CUT)
    out = s.query(-math.inf, math.inf, 40, NOTHING)["cpu"]
    assert len(out["step"]) <= 40 and dict(zip(out["step"], out["value"]))[500] == 90.0
    # a later segment covering steps 300-400 replaces those of segment 0, and only those
    rolled_back = Replaced([((300, 400),), ()])
    for i in range(300, 401):
        s.add(i, [("cpu", 1.0)], 1, lambda: rolled_back)
    out = s.query(-math.inf, math.inf, 10_000, rolled_back)["cpu"]
    assert out["step"] == list(range(1, 1001))
    assert all(v == (1.0 if 300 <= st <= 400 else 90.0 if st == 500 else 50.0)
               for st, v in zip(out["step"], out["value"]))


def test_sampled_series_caps_fields_and_rejects_a_tiny_cap():
    s = SampledSeries(cap=8, max_fields=2)
    s.add(1, [("a", 1.0), ("b", 2.0), ("c", 3.0)], 0, NO_CUT)
    assert s.names() == ["a", "b"]
    try:
        SampledSeries(cap=2)
    except ValueError as e:
        assert "cap" in str(e)
    else:
        raise AssertionError("cap=2 accepted")


# ---- RunIndex ------------------------------------------------------------------------------------

_SYSTEM_VALUE = st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.just(10**400), st.none(),
                          st.booleans(), st.just("x"))
_SYSTEM_NAMES = st.lists(st.sampled_from(["cpu", "mem", "gpu", "io"]), unique=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), _SYSTEM_NAMES, st.lists(_SYSTEM_VALUE, min_size=4, max_size=4)),
                max_size=40),
       st.integers(1, 5), st.integers(0, 3), st.booleans())
def test_sampled_series_add_columns_is_add_record_by_record(records, max_fields, seg, primed):
    # Records at steps that repeat (the newest point wins), fields that start late or hold no
    # number (None, text, bools), NaN, a huge integer, more fields than max_fields, a series that
    # already holds points: a field at a time is record by record, field order included.
    from gradmon.logformat.values import number

    def fresh() -> SampledSeries:
        out = SampledSeries(cap=20_000, max_fields=max_fields)
        if primed:
            out.add(0, [("mem", 1.0)], seg, lambda: Replaced.of_spans([], [], []))
        return out

    recs, steps = [], []
    step = 0
    for gap, names, values in records:
        step += gap
        steps.append(step)
        recs.append({"type": "system", "step": step, **dict(zip(names, values))})
    one = fresh()
    for s, rec in zip(steps, recs):
        values = [(k, v) for k, raw in rec.items()
                  if k not in ("type", "step") and (v := number(raw)) is not None]
        one.add(s, values, seg, lambda: Replaced.of_spans([], [], []))
    names = dict.fromkeys(k for r in recs for k in r if k not in ("type", "step"))
    together = fresh()
    together.add_columns(steps, {k: [number(r.get(k)) for r in recs] for k in names}, recs, seg)
    assert list(together.fields) == list(one.fields)
    for name, pts in one.fields.items():
        got = together.fields[name]
        assert (list(got.steps), repr(list(got.values)), list(got.seg)) == \
            (list(pts.steps), repr(list(pts.values)), list(pts.seg)), name


def test_index_keeps_system_fields_and_latest_layers():
    recs = [header(), step(1), {"type": "system", "ts": 1.0, "cpu_percent": 3.0},  # no step: skipped
            {"type": "system", "ts": 2.0, "step": 1, "cpu_percent": 5.0, "rss_bytes": 1_200_000_000},
            {"type": "system", "ts": 2.5, "step": 10**20, "cpu_percent": 7.0},  # beyond int64: skipped
            {"type": "layers", "step": 1, "top": [{"name": "w", "grad_norm": 1.0}]},
            step(2),
            {"type": "system", "ts": 3.0, "step": 2, "cpu_percent": math.inf, "rss_bytes": 1_300_000_000},
            {"type": "layers", "step": 2, "top": [{"name": "w", "grad_norm": 2.0}]}]
    idx = index_of(recs, batch=1)
    assert idx.summary()["system_fields"] == ["cpu_percent", "rss_bytes"]
    assert "cpu_percent" not in idx.summary()["fields"]
    sysd = idx.snapshot().system_in(-math.inf, math.inf, 2000)
    assert sysd["rss_bytes"] == {"step": [1, 2], "value": [1.2e9, 1.3e9]}
    assert sysd["cpu_percent"]["value"] == [5.0, math.inf]
    assert idx.layers["step"] == 2 and idx.layers["top"][0]["grad_norm"] == 2.0


# ---- a real server --------------------------------------------------------------------------------

def test_history_has_system_points_and_layers_of_a_file_written_before_start(tmp_path):
    logdir = tmp_path / "logs"
    proc = psutil.Process()
    recs = [header()]
    sampled = {}
    for i in range(1, 601):
        recs.append(step(i))
        if i % 50 == 0:  # a real sample of this process, as LiveMonitor(system_metrics=True) writes
            rec = {"type": "system", "ts": 1.0e9 + i, "step": i, **sample_system(proc)}
            sampled[i] = rec
            recs.append(rec)
        if i % 200 == 0:
            recs.append({"type": "layers", "step": i, "ts": 1.0e9 + i,
                         "top": [{"name": "fc.weight", "grad_norm": float(i), "param_norm": 3.0,
                                  "update_ratio": math.nan}]})
    recs.append({"type": "system", "ts": 2.0e9, "step": 600, "cpu_percent": math.nan,
                 "rss_bytes": sampled[600]["rss_bytes"]})  # same step again: replaces the sample
    append(logdir / "exp1" / "metrics.jsonl", recs)
    with start_server(logdir, port=0, discover_interval=0.1) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["last_step"] == 600)
        _, info = get_json(h.port, "/api/runs/exp1")
        assert set(info["system_fields"]) >= {"cpu_percent", "process_cpu_percent", "rss_bytes",
                                              "host_mem_percent"}
        status, hist = get_json(h.port, "/api/runs/exp1/history")
        assert status == 200
        rss = hist["system"]["rss_bytes"]
        assert rss["step"] == list(range(50, 601, 50))
        assert rss["value"] == [sampled[s]["rss_bytes"] for s in rss["step"]]
        cpu = hist["system"]["cpu_percent"]
        assert cpu["value"][-1] == "NaN" and cpu["step"][-1] == 600  # strict JSON, newest sample wins
        assert hist["layers"]["step"] == 600 and hist["layers"]["top"][0]["update_ratio"] == "NaN"
        _, part = get_json(h.port, "/api/runs/exp1/history?start=100&end=250")
        assert part["system"]["rss_bytes"]["step"] == [100, 150, 200, 250]
        _, few = get_json(h.port, "/api/runs/exp1/history?points=4")
        assert 2 <= len(few["system"]["host_mem_percent"]["step"]) <= 4

        async def hello():
            async with connect(f"ws://127.0.0.1:{h.port}/ws") as ws:
                return await recv_json(ws)

        msg = asyncio.run(hello())
        assert msg["type"] == "hello" and "rss_bytes" in msg["runs"][0]["system_fields"]


def test_history_without_system_or_layers_has_empty_system_and_null_layers(tmp_path):
    logdir = tmp_path / "logs"
    append(logdir / "exp1" / "metrics.jsonl", [header()] + [step(i) for i in range(1, 11)])
    with start_server(logdir, port=0, discover_interval=0.1) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/exp1")[1]["last_step"] == 10)
        _, hist = get_json(h.port, "/api/runs/exp1/history")
        assert hist["system"] == {} and hist["layers"] is None
        assert get_json(h.port, "/api/runs/exp1")[1]["system_fields"] == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 3), st.floats(allow_nan=False, width=32)), max_size=60),
       st.integers(-5, 40), st.integers(0, 60), st.integers(4, 30))
def test_sampled_series_query_of_increasing_steps_is_the_general_one(points, start, span, wanted):
    # One segment, nothing replaced: a field whose steps increase is answered by bisection; one
    # whose steps go back or repeat (gaps <= 0 here) by the general loop; both give what the
    # general loop gives.


    series, step = SampledSeries(cap=20_000), 0
    rep = Replaced.of_spans([0], [0], [0])  # (one segment: replaces nothing)
    for gap, value in points:
        step += gap
        series.add(step, [("f", value), ("g", -value)], 0, lambda: rep)
    assert not rep.any
    got = series.query(start, start + span, wanted, rep)
    general = series.copy()
    for pts in general.fields.values():
        pts.increasing = False
    want = general.query(start, start + span, wanted, rep)
    assert repr(got) == repr(want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(-2, 3), st.integers(0, 1)),
                                                  max_size=12)), max_size=12),
       st.integers(8, 20))
def test_sampled_series_knows_whether_its_steps_increase(batches, cap):
    # Points one by one and a batch at a time, steps that repeat or go back, segments, compactions
    # (a small cap): each field's flag is what a pass over its steps says, in copies and pickles
    # too, and a checkpoint written before the flag gets it computed.
    import pickle

    from gradmon.server import sampled

    rep = Replaced.of_spans([0], [0], [0])
    series, step = SampledSeries(cap=cap), 0
    for together, points in batches:
        steps, segs = [], []
        for gap, seg in points:
            step += gap
            steps.append(step)
            segs.append(seg)
        if together and len(set(segs)) <= 1:
            series.add_columns(steps, {"f": [float(s) for s in steps]},
                               [{"f": 0.0} for _ in steps], segs[0] if segs else 0)
        else:
            for s, seg in zip(steps, segs):
                series.add(s, [("f", float(s))], seg, lambda: rep)
        for pts in series.fields.values():
            assert pts.increasing == sampled._increasing(pts.steps), list(pts.steps)
    for copy in (series.copy(), pickle.loads(pickle.dumps(series))):
        for name, pts in series.fields.items():
            assert copy.fields[name].increasing == pts.increasing
    for pts in series.fields.values():
        before = pts.__getstate__()
        del before[1]["increasing"]
        old = sampled._Points.__new__(sampled._Points)
        old.__setstate__(before)
        assert old.increasing == pts.increasing and list(old.steps) == list(pts.steps)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0])),
                min_size=1, max_size=120),
       st.integers(8, 40), st.booleans())
def test_a_compacted_field_is_the_same_with_and_without_the_scanner(values, cap, rolled_back):
    # A field downsampled past its cap (min/max kept: the compiled m4_indices, else the Python
    # downsample_indices): the same points either way, NaN, infinities and ties included, with or
    # without points a later segment replaced.
    from unittest import mock

    from gradmon.server import sampled

    rep = Replaced.of_spans([0, 0], [200, 60], [0, 1]) if rolled_back else Replaced.of_spans([0], [0], [0])

    def fed() -> SampledSeries:
        series = SampledSeries(cap=cap)
        for i, v in enumerate(values):
            series.add(i, [("f", v)], i % 2 if rolled_back else 0, lambda: rep)
        return series

    native = fed()
    with mock.patch.object(sampled, "_native_scanner", lambda: None):
        python = fed()
    assert native.compactions == python.compactions
    for name, pts in python.fields.items():
        got = native.fields[name]
        assert (list(got.steps), repr(list(got.values)), list(got.seg)) == \
            (list(pts.steps), repr(list(pts.values)), list(pts.seg))
