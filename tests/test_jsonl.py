"""The shared strict-JSON codec (gradmon.logformat.jsonl)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gradmon.logformat.jsonl import RecordError, decode_line, decode_record, encode_record, to_jsonable


def test_encode_is_strict_json_with_nonfinite_strings():
    line = encode_record({"type": "step", "step": 1, "loss": math.nan, "grad_norm": math.inf,
                          "lr": -math.inf, "arr": np.array([1.0, np.nan], np.float32), "n": np.int64(3),
                          "t": (1, 2), "msg": "a\nb"})
    assert line.endswith("\n") and line.count("\n") == 1

    def reject(token):
        raise AssertionError(token)

    raw = json.loads(line, parse_constant=reject)
    assert (raw["loss"], raw["grad_norm"], raw["lr"]) == ("NaN", "Infinity", "-Infinity")
    assert raw["arr"] == [1.0, "NaN"] and raw["n"] == 3 and raw["t"] == [1, 2]


def test_decode_round_trip_and_text_fields():
    rec = decode_line(encode_record({"type": "event", "kind": "x", "message": "NaN", "step": 2,
                                     "loss": math.nan, "nested": {"v": math.inf, "name": "NaN"}}))
    assert math.isnan(rec["loss"]) and rec["nested"]["v"] == math.inf
    assert rec["message"] == "NaN" and rec["nested"]["name"] == "NaN"  # text keys stay text


@pytest.mark.parametrize("line", [
    "[1]", '{"loss":1}', '{"step":1.0}', '{"step":true}', '{"step":"1"}', '{"type":null,"step":1}',
    '{"type":"step","step":true}', '{"type":"step"}', '{"type":"x","ts":"soon"}', '{"step":1,"ts":"soon"}',
    b'{"type":"x","s":"\xff"}', "", "{", "NaN", '{"step":1,"loss":nan}', '{"step":1,"epoch":1.5}',
    '{"type":"step","step":9223372036854775808}', '{"type":"x","pid":-9223372036854775809}',
    '{"step":100000000000000000000000000000}',
])
def test_decode_rejects(line):
    with pytest.raises(RecordError):
        decode_line(line)


def test_integer_fields_hold_the_signed_64_bit_integers():
    """Every reader stores steps as int64 (the server's columns and sidecar): beyond that range an
    integer field makes the record invalid (skipped and counted), not a reader's crash."""
    assert decode_line('{"type":"step","step":9223372036854775807}')["step"] == 2**63 - 1
    assert decode_line('{"type":"step","step":-9223372036854775808,"epoch":0}')["step"] == -(2**63)
    with pytest.raises(RecordError, match="64-bit"):
        decode_line('{"type":"end","steps":9223372036854775808}')
    # (not an int field: a number, however big)
    assert decode_line('{"type":"step","step":1,"loss":9223372036854775808}')["loss"] == 2**63


def test_logs_of_other_writers_are_read_and_normalized():
    """Python's default json.dumps (bare NaN/Infinity) and records without `type` (the design
    article's callback): read as step records, flagged for re-encoding."""
    line = json.dumps({"step": 1, "loss": math.nan, "lr": 1e-3, "throughput": math.inf, "x": -math.inf})
    rec, normalized = decode_record(line)
    assert normalized and next(iter(rec)) == "type" and rec["type"] == "step" and rec["step"] == 1
    assert math.isnan(rec["loss"]) and rec["throughput"] == math.inf and rec["x"] == -math.inf
    assert encode_record(rec) == ('{"type":"step","step":1,"loss":"NaN","lr":0.001,"throughput":"Infinity",'
                                  '"x":"-Infinity"}\n')
    rec, normalized = decode_record('{"type":"eval","step":2,"loss":NaN,"cfg":{"a":[Infinity]}}')
    assert normalized and math.isnan(rec["loss"]) and rec["cfg"]["a"] == [math.inf]
    rec, normalized = decode_record('{"step":3,"loss":0.5}')
    assert normalized and rec == {"type": "step", "step": 3, "loss": 0.5}
    strict = encode_record({"type": "step", "step": 4, "loss": math.nan})
    assert decode_record(strict)[1] is False  # strict records are passed on as they are


def test_to_jsonable_other_objects():
    assert to_jsonable({1: {2, 3}.__class__}) == {"1": "<class 'set'>"}
    assert to_jsonable(np.float32(2.5)) == 2.5 and to_jsonable(np.bool_(True)) is True
