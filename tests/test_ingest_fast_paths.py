"""The ingest's batch shortcuts agree with the general code they stand in for: a bucket column's
ends found by one sort (against the value-by-value summary), a batch's keys proven without a set
union and its flags looked for only when some record holds a bool (against the definitions, and
parse_lines on mixed batches against the same lines parsed one by one), and the alarm rule's
whole-chunk screen (against the rule fed record by record, on runs the screen covers)."""

from __future__ import annotations

import json
import math
import operator
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from server_helpers import line_pairs

from gradmon.logformat.alarms import AlarmConfig
from gradmon.logformat.schema import MARK_FLAGS
from gradmon.server import native
from gradmon.server.alarmrule import BatchAlarmRule
from gradmon.server.parse import KeyColumns, parse_lines
from gradmon.server.pyramid import column_summary, finite_summary

# ------------------------------------------------------------------------ a bucket's column ends


_NUMBERS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1, -1, 2.5, math.nan, math.inf, -math.inf, 10**20, 10**400, -(10**400),
                     1e308, -1e308, 1.5e308, 2**53 + 1]),
    st.floats(-10.0, 10.0), st.integers(-5, 5))


@settings(max_examples=300, deadline=None)
@given(st.lists(_NUMBERS, min_size=1, max_size=40))
@example([-1.0, 0.0, -0.0])  # (ties: min() and max() keep the first of equal values, -0.0 or 0.0)
@example([1.0, -0.0, 0.0])
@example([2, 2.0, 1.0, 1])
@example([0.5, math.nan, 0.25])
def test_a_column_s_summary_by_one_sort_is_the_value_by_value_one(values):
    steps = list(range(100, 100 + len(values)))
    want = finite_summary(values, steps)  # (the definition: the finite numbers, one at a time)
    for plain in (False, True):
        got = column_summary(values, steps, plain)
        assert repr(got) == repr(want)  # (repr: -0.0 and 0.0 told apart, NaN equal to NaN)


@pytest.mark.parametrize("values, want", [
    ([1.0, math.nan, 2.0], [2, 10, 1.0, 12, 2.0, 10, 1.0, 12, 2.0]),
    ([1.0, 2.0, math.nan], [2, 10, 1.0, 11, 2.0, 10, 1.0, 11, 2.0]),
    ([3.0, math.inf, 1.0, math.nan], [2, 10, 3.0, 12, 1.0, 12, 1.0, 10, 3.0]),
])
def test_a_nan_inside_a_bucket_is_neither_counted_nor_its_last_value(values, want):
    # (min() and max() pass over a NaN after the first value: the summary once counted it)
    assert column_summary(values, [10, 11, 12, 13][:len(values)]) == (want, True)


# ---------------------------------------------------------------------------- a batch's keys


_VALUES = [1.5, 2, None, True, False, "text", math.nan, -0.0, 10**20]


def _records(rng: random.Random, n: int) -> list[dict]:
    """Step records, mostly of one shape (the writer's), some with keys in another order, one
    missing or swapped for another (as many keys), None, bools, text and NaN here and there."""
    keys = ["type", "step", "loss", "grad_norm", "lr"]
    recs = []
    step = rng.randrange(5)
    for _ in range(n):
        step += rng.choice([1, 1, 1, 0, -1]) if rng.random() < 0.2 else 1
        rec = {"type": "step", "step": step}
        order = keys[2:] if rng.random() < 0.9 else rng.sample(keys[2:], 3)
        for k in order:
            rec[k] = rng.choice(_VALUES) if rng.random() < 0.05 else rng.random()
        r = rng.random()
        if r < 0.03:
            del rec[rng.choice(order)]
        elif r < 0.06:
            rec[rng.choice(["spike", "clipped", "nonfinite"])] = rec.pop(rng.choice(order))
        elif r < 0.08:
            rec["extra"] = 1.0
        recs.append(rec)
    return recs


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_a_batch_s_keys_bools_and_order_are_what_they_say(seed, n):
    recs = _records(random.Random(seed), n)
    cols = KeyColumns(recs)
    assert cols.key_set() == set().union(*recs)
    if cols.no_bools():
        assert not any(type(v) is bool for r in recs for v in r.values())
    steps = [r["step"] for r in recs]
    assert cols.increasing() == all(a < b for a, b in zip(steps, steps[1:]))
    for k in cols.key_set():  # (the columns the proof took are each record's values)
        assert cols.values(k) == [r.get(k) for r in recs]
        assert cols.types(k) == {type(r.get(k)) for r in recs}


def _line(rng: random.Random, rec: dict) -> bytes:
    r = rng.random()
    if r < 0.04:
        return b'{"type":"step","step":'  # malformed
    if r < 0.07:
        return json.dumps({"type": "event", "kind": "spike", "step": rec["step"], "message": "true"}).encode()
    if r < 0.09:
        return json.dumps({**rec, "note": "true story"}, separators=(",", ":")).encode()  # "true" in text
    if r < 0.11:
        return json.dumps({**rec, "loss": "NaN"}, separators=(",", ":")).encode()
    if r < 0.13:  # (the stdlib scanner reads it as inf: a mark at once, as a "true" line's)
        return json.dumps({**rec, "note": "true"}, separators=(",", ":")).encode()[:-1] + b',"g":1e999}'
    return json.dumps(rec, separators=(",", ":"), allow_nan=True).encode()  # (bare NaN tokens too)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60), st.booleans())
def test_parse_lines_on_mixed_batches_agrees_with_the_lines_one_by_one(seed, n, use_orjson):
    rng = random.Random(seed)
    pairs = line_pairs([_line(rng, rec) for rec in _records(rng, n)])
    whole = parse_lines(pairs, 0, use_orjson=use_orjson)
    recs, raw, offsets, malformed, slow = [], [], [], 0, set()
    for k, (end, line) in enumerate(pairs):
        one = parse_lines([(end, line)], pairs[k - 1][0] if k else 0, use_orjson=use_orjson)
        malformed += one.malformed
        if one.check and not any(one.records[0].get(f) is True for f, _k in MARK_FLAGS):
            slow.add(len(recs))  # (decoded in full, or by the stdlib with a "true": checked in any batch)
        recs += one.records
        raw += one.raw
        offsets += one.offsets
    assert json.dumps(list(whole.records)) == json.dumps(recs)
    assert (whole.raw, whole.offsets, whole.malformed) == (raw, offsets, malformed)
    flagged = {i for i, r in enumerate(recs) if any(r.get(f) is True for f, _k in MARK_FLAGS)}
    check = set(whole.check)
    assert flagged | slow <= check  # every record that may carry a mark is checked ...
    assert check <= flagged | slow | {i for i, ln in enumerate(raw) if b"true" in ln}  # ... and few more
    if use_orjson:  # (orjson's records hold finite numbers: only a mark flag can give them a mark)
        assert check == flagged | slow
    else:  # (the stdlib's may hold inf, from 1e999: every line with a "true" is checked)
        assert {i for i, ln in enumerate(raw) if b"true" in ln} <= check
    assert whole.columns is not None and whole.columns.records is whole.records
    for k in whole.columns.key_set():
        assert json.dumps(whole.columns.values(k)) == json.dumps([r.get(k) for r in whole.records])
    if whole.step_columns is not None:  # (the step records' columns, taken by the fast path)
        steps = [r for r in whole.records if r["type"] == "step"]
        assert len(whole.step_columns.records) == len(steps)
        assert all(map(operator.is_, whole.step_columns.records, steps))
        for k in whole.step_columns.key_set():
            assert json.dumps(whole.step_columns.values(k)) == json.dumps([r.get(k) for r in steps])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 40), st.integers(0, 40), st.integers(0, 40))
def test_a_slice_of_a_batch_s_columns_is_the_slice_s_own(seed, n, a, b):
    recs = _records(random.Random(seed), n)
    whole = KeyColumns(recs)
    whole.types("loss")  # (a part reads the whole's columns, taken or not)
    if seed % 2:
        whole.key_set()  # (a part's keys are read off the whole's when it knows them)
    part = whole.sliced(a, b)
    assert part.records == recs[a:b]
    own = KeyColumns(recs[a:b])
    assert part.key_set() == own.key_set()
    if part.no_bools():  # (proven: no bool; not proven says nothing)
        assert not any(type(v) is bool for r in part.records for v in r.values())
    if part.records:
        assert part.increasing() == own.increasing()
    for k in [*own.key_set(), "loss", "absent"]:
        lo, hi = sorted((seed % 7, n // 3))  # (before the part's own column is taken)
        assert json.dumps(part.piece(k, lo, hi)) == json.dumps(own.values(k)[lo:hi])
        assert part.fast(k) == own.fast(k)
        assert not part.known_plain(k) or own.fast(k)  # (known plain: plain; else not known)
        assert json.dumps(part.values(k)) == json.dumps(own.values(k))
        assert part.types(k) == own.types(k)


# ------------------------------------------------------------- the alarm rule's whole chunks


def _run(rng: random.Random, n: int, drift: float) -> list[dict]:
    """A long run of plain steps (a stationary or drifting noisy loss, a noisy norm) with a few
    spikes and loss jumps: the chunks between them are the whole-chunk screen's."""
    recs = []
    for s in range(1, n + 1):
        norm = 1.0 + 0.3 * rng.random()
        loss = 2.0 + drift * s + 0.2 * rng.random()
        if rng.random() < 0.004:
            norm *= rng.choice([4, 40])
        if rng.random() < 0.004:
            loss += rng.choice([0.5, 5.0])
        recs.append({"type": "step", "step": s, "loss": loss, "grad_norm": norm})
    return recs


@pytest.mark.parametrize("scanned", [False, True])
def test_the_whole_chunk_screen_gives_the_rule_s_events_and_covers_most_records(scanned):
    # scanned: the batches as the server parses them, whose loss and norm columns the compiled
    # scanner took as float64s (the screen's chunk maxima then come from those in one C call)
    if scanned and native.scanner() is None:
        pytest.skip(f"no compiled scanner here: {native.unavailable_reason()}")
    rng = random.Random(3)
    for config, drift in [(AlarmConfig(), 0.0), (AlarmConfig(), -1e-4), (AlarmConfig(), 1e-4),
                          (AlarmConfig(window=21, min_history=4, quiet_steps=5, loss_over_max=2.0), 0.0)]:
        recs = _run(rng, 6000, drift)
        if scanned:  # (a loss that is an int sometimes: the float64 column holds it as float())
            for r in recs[::97]:
                r["loss"] = round(r["loss"])
        plain = BatchAlarmRule(config)
        want = [(i, e) for i, r in enumerate(recs) for e in plain.update(r)]
        want += [(len(recs), e) for e in plain.finish()]
        rule, covered, from_floats = BatchAlarmRule(config), [0], [0]
        screen = rule._quiet_chunks

        def counted(losses, norms, lo, hi, floats=None, screen=screen, covered=covered,
                    from_floats=from_floats):
            end = screen(losses, norms, lo, hi, floats)
            covered[0] += end - lo
            from_floats[0] += floats is not None and None not in floats
            return end

        rule._quiet_chunks = counted  # type: ignore[method-assign]
        got, i = [], 0
        while i < len(recs):
            j = min(len(recs), i + rng.choice([317, 320, 1000]))  # (the server's 64 KB batches: ~320)
            if scanned:
                parsed = parse_lines(line_pairs([json.dumps(r).encode() for r in recs[i:j]]), 0)
                assert parsed.columns.floats("loss") is not None
                got += [(i + k, e) for k, e in rule.update_steps(parsed.records, parsed.columns)]
            else:
                got += [(i + k, e) for k, e in rule.update_steps(recs[i:j])]
            i = j
        got += [(len(recs), e) for e in rule.finish()]
        assert want and json.dumps(got) == json.dumps(want)
        assert covered[0] > 0.6 * len(recs), (config, drift, covered[0])
        assert (from_floats[0] > 0) == scanned


def _ramps(seed: int) -> list[dict]:
    """A loss that ramps up and down piecewise with jumps on it: the window's median moves within
    a batch, so a chunk's median ceiling must count the chunks learnt before it in that batch."""
    rng = random.Random(seed)
    recs, loss, slope = [], 1.0, 0.0
    rng.choice([0, 1])  # (the config draw of the search that found seed 225)
    for s in range(1, 3001):
        if rng.random() < 0.01:
            slope = rng.choice([0, 0, 0.002, 0.01, 0.05, -0.01])
        loss += slope
        value = loss + 0.05 * rng.random()
        if rng.random() < 0.01:
            value += rng.choice([0.3, 1.0, 3.0]) * max(1, abs(loss))
        recs.append({"type": "step", "step": s, "loss": value, "grad_norm": 1.0 + 0.1 * rng.random()})
    return recs


def test_the_whole_chunk_screen_follows_a_moving_median():
    for seed in (225, 7, 11):
        recs = _ramps(seed)
        plain, rule = BatchAlarmRule(), BatchAlarmRule()
        want = [(i, e) for i, r in enumerate(recs) for e in plain.update(r)]
        got = [(i + k, e) for i in range(0, len(recs), 1000) for k, e in rule.update_steps(recs[i:i + 1000])]
        assert want and json.dumps(got) == json.dumps(want), seed
