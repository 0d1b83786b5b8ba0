"""The batch line splitter and the fast batch decoder agree with the simple, obvious versions:
``bytes.split`` on whole data, and ``jsonl.decode_line`` on every line."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.logformat.jsonl import RecordError, decode_line, decode_record, encode_record
from gradmon.logformat.lines import LineSplitter
from gradmon.logformat.schema import MARK_FLAGS
from gradmon.server.parse import parse_lines


def _reference_lines(data: bytes, max_line: int) -> list[tuple[int, bytes | None]]:
    out, pos = [], 0
    while (nl := data.find(b"\n", pos)) >= 0:
        line = data[pos:nl]
        out.append((nl + 1, None if len(line) > max_line else line.removesuffix(b"\r")))
        pos = nl + 1
    return out


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from([b"\n", b"\r\n", b"ab", b"x" * 7, b"\r", b"{}", b""]), max_size=40),
       cuts=st.lists(st.integers(0, 200), max_size=12), max_line=st.integers(1, 12))
def test_splitter_matches_a_split_of_the_whole_data(pieces, cuts, max_line):
    data = b"".join(pieces)
    split = LineSplitter(0, max_line)
    got, pos = [], 0
    for c in [*sorted(cuts), len(data)]:
        c = min(c, len(data))
        got.extend(split.feed(data[pos:c]))
        pos = max(pos, c)
    assert got == _reference_lines(data, max_line)
    assert split.line_start == (got[-1][0] if got else 0) and split.fed == len(data)


_GOOD = [
    encode_record({"type": "step", "step": 3, "ts": 1.5, "loss": 0.25, "grad_norm": 2.0}),
    encode_record({"type": "step", "step": 4, "loss": math.nan, "grad_norm": math.inf, "nonfinite": True}),
    encode_record({"type": "step", "step": 5, "spike": True, "clipped": False, "note": "NaN"}),
    encode_record({"type": "step", "step": 6, "loss": 0.5, "clipped": True}),  # (a flag, no mark flag)
    encode_record({"type": "event", "kind": "spike", "step": 5, "message": "Infinity"}),
    encode_record({"type": "header", "schema": 1, "run_id": "a", "config": {"x": [math.nan, 1]}}),
    encode_record({"type": "step", "step": 6, "unit": "é", "loss": 1.0}),  # non-ASCII
    '{"type":"step","step":3,"loss":NaN}',  # other writers: bare tokens, no type
    '{"step": 7, "loss": Infinity, "lr": 0.001, "throughput": -Infinity}', '{"step":8,"loss":0.5}',
    '{"step": 9, "loss": 0.5, "note": "NaN", "spike": true}', '{"step": 10, "loss": 2.5, "lr": 0.1}',
    # (the signed 64-bit integers' ends: schema.INT_MIN, INT_MAX)
    '{"type":"step","step":9223372036854775807,"loss":1}', '{"type":"step","step":-9223372036854775808}',
    '{"step": 9223372036854775807, "loss": 0.5}', '{"type":"eval","step":1,"epoch":-9223372036854775808}',
]
_BAD = [
    '{"step":3.0,"loss":1}', "not json", "[1,2]", '{"type":"step","step":"4"}',
    '{"type":"step","step":1}{"type":"step","step":2}', '{"type":"step","step":1},', "",
    '  {"type":"step","step":7,"loss":1e999}  ', '{"type":"step","step":8,"loss":1}  ', '{"a":[[1',
    '2]]}', '{"type":"step","step":9,"ts":"NaN"}', '{"type":"step","step":10,"loss":-1e999}',
    '{"type":"step","step":11,"loss":"N\\u0061N"}', '{"typ\\u0065":"step","step":"12"}', '{"type":"step"}',
    '{"type":"eval","step":null}', '{"type":"step","step":null}', '{"type":"step","step":true}',
    '{"type":"step","step":1,"epoch":1.5}', '{"type":"step","epoch":1}', '{"type":"step","step":1e3}',
    '{"type":"step","step":123456789012345678901234567890}', ' {"type":"step","step":1}',
    '{"type":"step","step":1}\t', '\r{"type":"step","step":1}',
    '{"type":"step","step":1,"big":-123456789012345678901234567890}',
    '{"type":"step","step":2,"pid":null,"rank":1.0}', '{"type":"step","step":1,"ts":false}', '{"type":1}',
    '"\\ud800"', "\ufeff{}", '{"type":""}',
    # (just past the signed 64-bit integers: orjson reads these, as ints)
    '{"type":"step","step":9223372036854775808,"loss":1}', '{"type":"step","step":-9223372036854775809}',
    '{"step": 9223372036854775808, "loss": 0.5}', '{"type":"step","step":1,"epoch":18446744073709551615}',
    '{"type":"system","step":9223372036854775808,"cpu_percent":1.0}',
]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from([ln.rstrip("\n") for ln in _GOOD] + _BAD), max_size=30),
       oversize=st.sets(st.integers(0, 29)), start=st.integers(0, 1000), use_orjson=st.booleans())
def test_parse_lines_agrees_with_decode_line(lines, oversize, start, use_orjson):
    encoded = [None if i in oversize else ln.encode() for i, ln in enumerate(lines)]
    pairs, end = [], start
    for ln in encoded:
        end += (len(ln) if ln is not None else 50) + 1
        pairs.append((end, ln))
    got = parse_lines(pairs, start, use_orjson=use_orjson)
    want, offsets, raw, offset = [], [], [], start
    for e, ln in pairs:
        try:
            if ln is None:
                raise RecordError("oversize")
            rec, normalized = decode_record(ln)
            want.append(rec)
            offsets.append(offset)
            # passed on as it is, or as strict JSON when it was not (bare NaN, no type)
            raw.append(json.loads(encode_record(rec)) if normalized else ln.strip())
        except RecordError:
            pass
        offset = e
    assert _comparable(got.records) == _comparable(want)
    assert got.offsets == offsets and got.end == (pairs[-1][0] if pairs else start)
    assert [_strict(r) if isinstance(w, dict) else r for r, w in zip(got.raw, raw)] == raw
    assert got.malformed == len(pairs) - len(want)
    for i, rec in enumerate(got.records):  # a record not in `check` has no mark flag set and no NaN
        if i not in got.check:  # (±inf only from a literal too big for a float, like -1e999: stdlib)
            assert not any(rec.get(flag) is True for flag, _kind in MARK_FLAGS)
            assert not any(math.isnan(v) for v in rec.values() if isinstance(v, float))
            if not use_orjson:  # (the stdlib scanner's: no true at all)
                assert not any(v is True for v in rec.values())
            else:
                assert not any(isinstance(v, float) and not math.isfinite(v) for v in rec.values())


@pytest.mark.parametrize("use_orjson", [False, True])
def test_one_bad_record_in_a_plain_batch_is_the_only_one_dropped(use_orjson):
    plain = encode_record({"type": "step", "step": 1, "epoch": 1, "ts": 2.0, "loss": 0.5}).rstrip("\n")
    for bad in _BAD:
        lines = [plain.encode(), bad.encode(), plain.encode()]
        pairs = [(sum(len(x) + 1 for x in lines[: i + 1]), ln) for i, ln in enumerate(lines)]
        got = parse_lines(pairs, 0, use_orjson=use_orjson)
        want = []
        for ln in lines:
            with contextlib.suppress(RecordError):
                want.append(decode_line(ln))
        assert _comparable(got.records) == _comparable(want), bad


def _strict(line: bytes):
    """A line as a browser's JSON.parse reads it: bare NaN/Infinity tokens are errors."""
    def refuse(token):
        raise AssertionError(f"bare {token} passed on")
    return json.loads(line, parse_constant=refuse)


def _comparable(recs):
    """NaN != NaN, but repr(nan) == repr(nan). Integers beyond 64 bits in a step record's values
    may come back as floats from orjson (documented in gradmon.server.parse): compared as floats."""
    def norm(v):
        return float(v) if type(v) is int and abs(v) >= 2**63 else v
    return [repr({k: norm(v) for k, v in r.items()}) for r in recs]
