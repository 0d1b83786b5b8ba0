"""A history request gets about the points it asks for, whatever the range: between half and all
of them (4 per bucket), never more (but for the nodes split at the range's two ends)."""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from server_helpers import answer_from_memory

from gradmon.logformat.jsonl import encode_record
from gradmon.server.index import RunIndex
from gradmon.server.pyramid import FANOUT

N = 300_000  # step records in the run


@pytest.fixture(scope="module")
def run():
    """A noisy run (4 distinct points per bucket: first, last, min, max) and its 'file'."""
    rnd = random.Random(7)
    lines, ends, end = [], [], 0
    for i in range(1, N + 1):
        ln = encode_record({"type": "step", "step": i, "v": rnd.random()}).rstrip("\n").encode()
        end += len(ln) + 1
        lines.append(ln)
        ends.append(end)
    idx = RunIndex()
    pairs = list(zip(ends, lines))
    for k in range(0, N, 5000):
        idx.add_lines(pairs[k:k + 5000], ends[k - 1] if k else 0)
    return _Run(idx, pairs)


class _Run:
    def __init__(self, idx, pairs):
        self.idx, self.pairs = idx, pairs

    def __repr__(self):  # (hypothesis prints the arguments of a failing example)
        return f"<run of {len(self.pairs)} records>"

    def __iter__(self):
        return iter((self.idx, self.pairs))


def _answer(idx, pairs, start, end, points):
    """The series ``v`` as the server answers (file reads included)."""
    plan, series, _exact = answer_from_memory(idx, pairs, start, end, points)
    return plan, series["v"][0]


@settings(max_examples=120, deadline=None)
@given(start=st.integers(1, N), width=st.one_of(st.integers(0, 200_000), st.integers(20_000, 140_000)),
       points=st.sampled_from([200, 500, 1000, 2000, 4000, 8000]))
@example(start=1, width=63_872, points=4000)  # 500 base buckets whose first/last/min/max coincide at times
@example(start=1, width=64_000, points=4000)  # the same, with two edge buckets that give fewer than 4 points
def test_points_between_half_and_all_requested(run, start, width, points):
    idx, pairs = run
    end = min(N, start + width)
    plan, steps = _answer(idx, pairs, start, end, points)
    in_range = end - start + 1
    assert all(start <= s <= end for s in steps) and steps == sorted(steps)
    assert len(steps) >= min(in_range, points // 2), (plan.kind, len(steps))
    # Beyond `points`: the nodes split at the range's two ends (at most FANOUT - 1 per level each).
    ends = 4 * 2 * (FANOUT - 1) * len(idx.steps.pyramid.levels) if plan.kind == "pyramid" else 0
    assert len(steps) <= points + ends, (plan.kind, len(steps))


def test_the_reported_gap_100k_steps_2000_points(run):
    idx, pairs = run
    _plan, steps = _answer(idx, pairs, 100_001, 200_000, 2000)
    assert 1000 <= len(steps) <= 2000 + 8
