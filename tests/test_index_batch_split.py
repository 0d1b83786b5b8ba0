"""The run index is a function of the log's content, not of where its lines are split into
batches (the server polls 64 KB chunks): marks, fields (their order included) and history answers
are the same fed line by line, in random batches, or whole — with keys that appear late, keys
first seen as None/text/bool and later as numbers, NaN/Infinity (strings and bare tokens) and
integers beyond 64 bits."""

from __future__ import annotations

import bisect
import json
import math
import random
from types import SimpleNamespace
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st
from server_helpers import line_pairs

from gradmon.server import history, native
from gradmon.server.history import HistoryOptions, answer, build_job
from gradmon.server.index import RunIndex
from gradmon.server.pyramid import BUCKET
from gradmon.server.steps import StepSeries

_KEYS = ("loss", "grad_norm", "a", "b", "ts")
_ODD = (None, True, False, "NaN", "Infinity", "-Infinity", math.nan, math.inf, 10**20, -(10**25),
        10**400, "text", 1e308)


# Odd values the compiled line scanner decides itself (gradmon/server/native.py: no NaN, no huge
# ints) and valid in every key; bools and text too where no number is required (not in a record's
# number fields, which would make it invalid and its batch taken record by record).
_SCANNED_ODD = (None, 1e308, -(10**15), 0, -0.0)
_SCANNED_ODD_FREE = (*_SCANNED_ODD, True, False, "text")


def _log(rnd, n: int, odd: tuple = _ODD, headers: float = 0.01, free_odd: tuple | None = None) -> list[bytes]:
    """``n`` step records (a header now and then); each key shows up from a random step on
    (``free_odd``: the odd values of the keys that are no number fields, "a" and "b")."""
    first = {k: rnd.randrange(n + 1) for k in _KEYS}
    lines = []
    for s in range(n):
        if s and rnd.random() < headers:
            lines.append(json.dumps({"type": "header", "run_id": "r"}).encode())
        rec: dict = {"type": "step", "step": s if rnd.random() < 0.95 else rnd.randrange(n)}
        for k in _KEYS:
            if s >= first[k] and rnd.random() < 0.8:
                odds = free_odd if free_odd is not None and k in ("a", "b") else odd
                rec[k] = rnd.choice(odds) if rnd.random() < 0.3 else rnd.random() * 10
        for flag in ("spike", "nonfinite", "skipped"):
            if rnd.random() < 0.03:
                rec[flag] = True
        lines.append(json.dumps(rec, separators=(",", ":")).encode())  # (bare NaN/Infinity tokens)
    return lines


def _indexed(pairs: list[tuple[int, bytes]], cuts: list[int]) -> RunIndex:
    idx = RunIndex()
    for a, b in zip([0, *cuts], [*cuts, len(pairs)]):
        if a < b:
            idx.add_lines(pairs[a:b], pairs[a - 1][0] if a else 0)
            idx.steps.open_summary()  # (a query between polls changes nothing either)
    return idx


def _answers(idx: RunIndex, pairs: list[tuple[int, bytes]]) -> tuple:
    ends = [e for e, _ in pairs]

    def read(_path: str, lo: int, hi: int, *_a: object) -> list[tuple[int, bytes]]:
        return pairs[bisect.bisect_right(ends, lo):bisect.bisect_right(ends, hi)]

    run = SimpleNamespace(name="r", path="<memory>", index=idx,
                          cursor=lambda: {"gen": "g", "offset": ends[-1]})
    bodies = []
    with mock.patch.object(history, "read_lines", read):
        for opts in (HistoryOptions(40), HistoryOptions(5000), HistoryOptions(20, 10, 250)):
            bodies.append(answer(build_job(run, opts))[0])
    snap = idx.snapshot()
    return (repr(snap.marks), list(snap.mark_segments), idx.steps.series_names(), idx.summary(), bodies)


def _check(lines: list[bytes], cuts: list[int]) -> None:
    pairs = line_pairs(lines)
    one = _answers(_indexed(pairs, list(range(1, len(pairs)))), pairs)
    assert _answers(_indexed(pairs, cuts), pairs) == one
    assert _answers(_indexed(pairs, []), pairs) == one


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 3 * BUCKET + 20),
       cuts=st.lists(st.integers(1, 4 * BUCKET), max_size=12))
def test_index_does_not_depend_on_batch_boundaries(seed, n, cuts):
    lines = _log(random.Random(seed), n)
    _check(lines, sorted({c % len(lines) for c in cuts} - {0}))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(BUCKET, 4 * BUCKET + 20),
       cuts=st.lists(st.integers(1, 4 * BUCKET), max_size=8))
def test_whole_buckets_summarized_from_the_scanner_s_columns_are_the_same(seed, n, cuts):
    """Batches whose records fill whole buckets are summarized from the compiled scanner's float64
    columns (``StepSeries._whole_buckets``), one-line batches never: the answers must agree."""
    lines = _log(random.Random(seed), n, _SCANNED_ODD, headers=0.003, free_odd=_SCANNED_ODD_FREE)
    taken = [0]
    whole_buckets = StepSeries._whole_buckets

    def spy(self, *args):
        taken.append(whole_buckets(self, *args))
        return taken[-1]

    with mock.patch.object(StepSeries, "_whole_buckets", spy):
        _check(lines, sorted({c % len(lines) for c in cuts} - {0}))
    kinds = b"".join(b"h" if b'"header"' in ln else b"s" for ln in lines)
    longest = max(map(len, kinds.split(b"h")))
    if native.scanner() is not None and longest >= BUCKET:
        assert max(taken) >= BUCKET  # (the unsplit batch, at least, took its whole buckets there)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(BUCKET, 3 * BUCKET + 20),
       cuts=st.lists(st.integers(1, 2 * BUCKET), min_size=1, max_size=10))
@example(seed=256, n=255, cuts=[128])  # (a whole bucket before any field: no scanner asked without one)
def test_open_buckets_summarized_from_the_scanner_s_floats_are_the_python_path_s(seed, n, cuts):
    """A base bucket filled over several batches the compiled scanner read is summarized from the
    float64 pieces it kept (``StepSeries._ob_floats``): the answers must be those of the same log
    indexed without the scanner (the Python path's lists and ``column_summary``), at the same cuts."""
    lines = _log(random.Random(seed), n, _SCANNED_ODD, headers=0.003, free_odd=_SCANNED_ODD_FREE)
    _check_floats_path(line_pairs(lines), sorted({c % len(lines) for c in cuts} - {0}))


def _check_floats_path(pairs: list[tuple[int, bytes]], cuts: list[int]) -> int:
    """Index ``pairs`` at ``cuts`` with and without the scanner: the same answers; returns how many
    summaries the scanner's floats gave."""
    from gradmon.server import parse, steps

    taken = [0]
    summarize = steps.summarize_floats

    def spy(floats, at):
        got = summarize(floats, at)
        taken[0] += got is not None
        return got

    def summaries(idx: RunIndex) -> list:
        got = [(k, s.lo, s.hi, s.n, s.offset, s.fields)
               for k, lvl in enumerate(idx.steps.pyramid.levels) for s in map(lvl.get, range(lvl.size))]
        last = idx.steps.open_summary()
        return repr([*got, None if last is None else (last.lo, last.hi, last.n, last.offset, last.fields)])

    with mock.patch.object(steps, "summarize_floats", spy):
        idx = _indexed(pairs, cuts)
        scanned = (summaries(idx), _answers(idx, pairs))
    with mock.patch.object(parse, "_native_scanner", lambda: None):
        idx = _indexed(pairs, cuts)
        assert (summaries(idx), _answers(idx, pairs)) == scanned
    return taken[0]


def test_a_bucket_filled_by_three_scanned_batches_is_summarized_from_their_floats():
    recs = [{"type": "step", "step": s, "loss": 2.0 - s / 1000, "grad_norm": (s % 7) * 0.5,
             "tokens": s * 4096, "lr": 1e-3} for s in range(1, 2 * BUCKET + 30)]
    recs[40]["grad_norm"] = None  # (no number there: a MISSING row)
    recs[BUCKET + 3]["loss"] = "NaN"  # (a line the scanner leaves: the second bucket's lists, and a mark)
    recs[BUCKET + 9].pop("lr")
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    taken = _check_floats_path(line_pairs(lines), [50, 100, BUCKET + 20, BUCKET + 60])
    if native.scanner() is not None:
        assert taken >= 4  # (the first bucket's four series at least, and the open one's)


def test_key_first_none_then_nan_across_a_bucket_close_in_one_batch():
    """The case that differed: ``x`` is None first, a number later in the same base bucket, and
    NaN right after that bucket closes, all in one batch: its NaN was no mark (the key became a
    field at the bucket's close, after the batch's marks were taken), and ``y`` (new in the next
    bucket) came before ``x`` in ``fields``."""
    recs = [{"type": "step", "step": s, "loss": 1.0} for s in range(BUCKET + 10)]
    recs[3]["x"] = None
    recs[5]["x"] = 2.0
    recs[BUCKET + 1]["y"] = 1.0
    recs[BUCKET + 2]["x"] = "NaN"
    lines = [json.dumps(r).replace(" ", "").encode() for r in recs]
    pairs = line_pairs(lines)
    whole = _indexed(pairs, [])
    assert whole.steps.fields == ["loss", "x", "y"]
    assert [m[:3] for m in whole.steps.marks] == [(BUCKET + 2, "nonfinite", "x")]
    _check(lines, [7, BUCKET + 5])


def _mixed_log(rnd: random.Random, n: int) -> list[bytes]:
    """Step records with every other kind among them: ``system`` and ``eval`` records often,
    ``layers``, events, headers (a resumed run: steps go back and repeat) and ``end`` records now
    and then."""
    lines, step = [], 0
    for _ in range(n):
        r = rnd.random()
        if r < 0.03:
            lines.append({"type": "header", "run_id": "r"})
            step = max(0, step - rnd.randrange(60))  # (resumed from an older checkpoint)
        elif r < 0.05:
            lines.append({"type": "event", "step": step, "kind": "note", "message": "m"})
        elif r < 0.06:
            lines.append({"type": "end", "status": "finished"})
        elif r < 0.2:
            extra = {"gpu_mem": rnd.random()} if rnd.random() < 0.5 else {}
            if rnd.random() < 0.5:  # (bytes as the writer logs them: ints, now and then one beyond a float)
                big = rnd.randrange(1 << 40)
                extra["rss_bytes"] = rnd.choice([big, big + 1, 10**400, None])
            lines.append({"type": "system", "step": step, "ts": float(step), "cpu": rnd.random(), **extra})
        elif r < 0.25:
            lines.append({"type": "eval", "step": step, "eval_loss": rnd.random()})
        elif r < 0.26:
            lines.append({"type": "layers", "step": step, "names": ["a"], "grad_norm": [rnd.random()]})
        else:
            step += 1
            rec = {"type": "step", "step": step, "loss": rnd.random() * (30 if rnd.random() < 0.02 else 1),
                   "grad_norm": rnd.random(), "ts": float(step)}
            if rnd.random() < 0.02:
                rec["spike"] = True
            lines.append(rec)
    return [json.dumps(rec, separators=(",", ":")).encode() for rec in lines]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 4 * BUCKET), cap=st.sampled_from([8, 20_000]),
       cuts=st.lists(st.integers(1, 5 * BUCKET), max_size=10))
def test_other_records_among_the_step_records_do_not_depend_on_batch_boundaries(seed, n, cap, cuts):
    # A batch's system, eval and layers records are taken after the step records around them
    # (RunIndex._add_mixed): the index is the one fed line by line, also where a system field is
    # compacted (cap 8: its kept points depend on the segments at that record, so every record is
    # then taken in its place) and where headers, events and ends order the step records.
    from gradmon.server import index as index_module

    lines = _mixed_log(random.Random(seed), n)
    with mock.patch.object(index_module, "MAX_SYSTEM_POINTS", cap):
        pairs = line_pairs(lines)
        by_line = _indexed(pairs, list(range(1, len(pairs))))
        for idx in (_indexed(pairs, sorted({c % len(lines) for c in cuts} - {0})), _indexed(pairs, [])):
            assert _answers(idx, pairs) == _answers(by_line, pairs)
            snap, want = idx.snapshot(), by_line.snapshot()
            assert (snap.events, snap.eval, snap.layers, snap.headers) == \
                (want.events, want.eval, want.layers, want.headers)
            assert snap.system_in(-math.inf, math.inf, 10**6) == want.system_in(-math.inf, math.inf, 10**6)
            assert idx.system.compactions == by_line.system.compactions
