"""Downsampling never loses a spike, a NaN, the minimum or the maximum (property tests)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.server.downsample import bucket_bounds, downsample, downsample_indices

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
special = st.sampled_from([math.nan, math.inf, -math.inf])


@settings(max_examples=300, deadline=None)
@given(
    base=st.lists(finite, min_size=1, max_size=400),
    spike_at=st.integers(min_value=0, max_value=10_000),
    spike=st.sampled_from([1e12, -1e12, math.nan, math.inf, -math.inf]),
    extra=st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), special), max_size=5),
    buckets=st.integers(min_value=1, max_value=200),
)
def test_spike_nan_min_max_survive(base, spike_at, spike, extra, buckets):
    values = list(base)
    i = spike_at % len(values)
    values[i] = spike
    for j, v in extra:
        values[j % len(values)] = v
    steps = [10 * k + 1 for k in range(len(values))]  # steps need not be contiguous
    out_steps, out_values = downsample(steps, values, buckets)
    pairs = set(zip(out_steps, map(repr, out_values)))
    # the spike's exact value at its step
    assert (steps[i], repr(values[i])) in pairs
    # every non-finite value
    for k, v in enumerate(values):
        if not math.isfinite(v):
            assert (steps[k], repr(v)) in pairs
    # the global min and max of the finite values
    fin = [v for v in values if math.isfinite(v)]
    if fin:
        assert min(fin) in out_values and max(fin) in out_values
    # bounded size, in step order
    nonfinite = sum(not math.isfinite(v) for v in values)
    assert len(out_steps) <= 4 * buckets + nonfinite
    assert out_steps == sorted(out_steps)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=300), buckets=st.integers(1, 50),
       keep=st.lists(st.integers(0, 299), max_size=10))
def test_kept_indices_are_kept(values, buckets, keep):
    idx = downsample_indices(values, buckets, keep)
    for k in keep:
        if k < len(values):
            assert k in idx
    assert len(idx) <= 4 * buckets + len(set(keep))


def test_small_series_is_returned_whole():
    s, v = downsample([1, 2, 3], [3.0, math.nan, 1.0], 1)
    assert s == [1, 2, 3] and math.isnan(v[1])
    s, v = downsample([1, 2, 3], [3.0, 2.0, 1.0], 1)
    assert (s, v) == ([1, 2, 3], [3.0, 2.0, 1.0])


def test_bucket_bounds_cover_everything_once():
    for n in (0, 1, 7, 100):
        for b in (1, 3, 100, 1000):
            bounds = bucket_bounds(n, b)
            assert sum(hi - lo for lo, hi in bounds) == n
            assert all(hi > lo for lo, hi in bounds)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="differ"):
        downsample([1, 2], [1.0], 1)


def _indices_value_by_value(values, buckets, keep=()):
    """downsample_indices by its definition, one value at a time (the reference)."""
    n = len(values)
    if n <= 4 * max(1, buckets):
        return list(range(n))
    chosen = {i for i in keep if 0 <= i < n}
    for lo, hi in bucket_bounds(n, buckets):
        finite = [i for i in range(lo, hi) if math.isfinite(values[i])]
        chosen.update(i for i in range(lo, hi) if not math.isfinite(values[i]))
        if finite:
            imin = min(finite, key=lambda i: (values[i], i))  # the first of the smallest
            imax = min(finite, key=lambda i: (-values[i], i))  # the first of the largest
            chosen.update((finite[0], finite[-1], imin, imax))
    return sorted(chosen)


_some = st.sampled_from([0.0, -0.0, 1.0, 1.0, 2.5, -3.0, math.nan, math.inf, -math.inf, 1e308])


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.one_of(_some, finite), min_size=1, max_size=300), buckets=st.integers(1, 60),
       keep=st.sets(st.integers(-3, 310), max_size=4), as_tuple=st.booleans())
def test_indices_are_the_value_by_value_definition(values, buckets, keep, as_tuple):
    # (ties, -0.0 against 0.0, NaN and infinities anywhere, buckets all finite or not)
    got = downsample_indices(tuple(values) if as_tuple else values, buckets, keep)
    assert got == _indices_value_by_value(values, buckets, keep)
