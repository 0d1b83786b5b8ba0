"""A run resumed from an older checkpoint repeats steps (a new header, then lower steps): history
shows each step once, from the latest segment that logged it, whatever the path (pyramid, file
read, marks, eval)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import answer_from_memory

from gradmon.jsonl import encode_record
from gradmon.server.index import RunIndex

# Segment 1: steps 1..60000 (value 1.0), crash; segment 2 resumes at 40001..90000 (value 2.0), crash;
# segment 3 resumes at 70001..100000 (value 3.0). Visible: 1..40000 -> 1, 40001..70000 -> 2, then 3.
SEGMENTS = [(1, 60_000, 1.0), (40_001, 90_000, 2.0), (70_001, 100_000, 3.0)]


def _expected(step):
    return 1.0 if step <= 40_000 else 2.0 if step <= 70_000 else 3.0


class _Run:
    def __init__(self):
        self.pairs, end = [], 0
        recs = []
        for k, (a, b, v) in enumerate(SEGMENTS):
            recs.append({"type": "header", "run_id": f"s{k}"})
            for i in range(a, b + 1):
                rec = {"type": "step", "step": i, "loss": v, "ts": 1e9 + k * 1e6 + i}
                if i in (50_000, 80_000):  # a spike in each overridden stretch and in the winner
                    rec.update(spike=True, grad_norm=9.0 * v)
                recs.append(rec)
            recs.append({"type": "eval", "step": b - b % 1000, "accuracy": v})
        for r in recs:
            ln = encode_record(r).rstrip("\n").encode()
            end += len(ln) + 1
            self.pairs.append((end, ln))
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
    assert all(t == 1e9 + 1e6 * (_expected(s) - 1) + s for s, t in zip(ts_steps, ts))  # the winner's time
    if end - start + 1 <= points:
        assert steps == list(range(start, end + 1))


def test_marks_and_eval_of_overridden_steps_are_left_out(run):
    idx = run.idx.snapshot()
    assert idx.cutoffs == [40_001, 70_001, float("inf")]
    # spikes at 50000 (segments 1 and 2) and 80000 (segments 2 and 3): only the winners' are left
    assert [(m["step"], m["value"]) for m in idx.marks_in(1, 100_000)] == [(50_000, 18.0), (80_000, 27.0)]
    # segment 1's eval at 60000 and segment 2's at 90000 are overridden; segment 3's at 100000 stays
    assert idx.eval_in(1, 100_000)["accuracy"] == {"step": [100_000], "value": [3.0]}
    _plan, series = _history(run, 1, 100_000, 400)
    assert list(zip(*series["grad_norm"])) == [(50_000, 18.0), (80_000, 27.0)]
