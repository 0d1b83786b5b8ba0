"""The shared strict-JSON codec (gradmon.jsonl)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gradmon.jsonl import RecordError, decode_line, encode_record, to_jsonable


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
    '{"type":"step","step":1,"loss":NaN}', "[1]", '{"step":1}', '{"type":"step","step":true}',
    '{"type":"step"}', '{"type":"x","ts":"soon"}', b'{"type":"x","s":"\xff"}', "", "{",
])
def test_decode_rejects(line):
    with pytest.raises(RecordError):
        decode_line(line)


def test_to_jsonable_other_objects():
    assert to_jsonable({1: {2, 3}.__class__}) == {"1": "<class 'set'>"}
    assert to_jsonable(np.float32(2.5)) == 2.5 and to_jsonable(np.bool_(True)) is True
