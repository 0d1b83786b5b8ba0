"""The compiled line scanner (gradmon/server/native.py, csrc/scanlines.c) reads exactly what orjson
and the standard library read, on every line it decides; ``parse_lines`` gives the same answer with
it and without it; and without a compiler the index still works (the Python path)."""

from __future__ import annotations

import importlib.machinery
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
from array import array
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.logformat.alarms import ZERO_NORM, is_zero_norm
from gradmon.logformat.jsonl import NONFINITE_STRINGS, encode_record
from gradmon.logformat.schema import TEXT_KEYS
from gradmon.logformat.values import number
from gradmon.server import native
from gradmon.server.columns import MISSING, MISSING_BITS
from gradmon.server.parse import KeyColumns, parse_lines
from gradmon.server.steprecords import LineRecords, StepRecords, scanned_column

_HEADERS = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
needs_scanner = pytest.mark.skipif(not (_HEADERS and _CC), reason="no C compiler or Python headers here")


@needs_scanner
def test_the_scanner_is_built_and_used_where_a_compiler_is():
    assert native.scanner() is not None, native.unavailable_reason()
    assert native.unavailable_reason() is None
    assert native.scanner().MISSING_BITS == MISSING_BITS


# (prefixes of one another too: a key is first compared with the one at its place in the step
# record before, whose bytes may begin the line's key without being all of it)
_KEYS = ["type", "step", "loss", "grad_norm", "lr", "spike", "note", "xNaN", "Infinity", "a b", "é",
         "k\\u0041", "ts", "epoch", "loss_scale", "grad", "lr2"]
_STRINGS = ["step", "event", "eval", "", "a", "NaN", "-Infinity", "Infinity", "xNaN", "é", "tab\there",
            "\x7f", "quote\"d", "back\\slash", "true", "}", "{", ",", ":", "step "]


def _number_text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        return repr(rng.uniform(-1e6, 1e6))
    if r < 0.4:
        return f"{rng.uniform(-10, 10):.{rng.randrange(0, 18)}f}"
    if r < 0.55:
        return f"{rng.random():.{rng.randrange(1, 20)}e}".replace("e", rng.choice(["e", "E"]))
    if r < 0.65:
        return repr(rng.choice([5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1e22, 1e23,
                                -0.0]))
    if r < 0.8:
        return str(rng.choice([0, -1, 1, 7, 2**31, -(2**53) - 1, 10**17, 10**18 - 1, 10**18, -(10**18),
                               2**63, 10**30]))
    return rng.choice(["1e999", "-1e999", "1e-400", "01", "1.", ".5", "-", "+1", "1e", "1e+", "-0", "0e0",
                       "123456789012345.6", "1234567890123456.7", "9007199254740993.0",
                       "1.000000000000000000001", "0.000000000000000000000000000001", "NaN", "Infinity",
                       "1_0", "0x10"])


def _value_text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.55:
        return _number_text(rng)
    if r < 0.75:
        return json.dumps(rng.choice(_STRINGS), ensure_ascii=rng.random() < 0.5)
    if r < 0.9:
        return rng.choice(["true", "false", "null", "tru", "nul"])
    return rng.choice(["[1,2]", '{"a":1}', "[]", "{}"])


def _line(rng: random.Random) -> bytes | None:
    r = rng.random()
    if r < 0.02:
        return None  # (an oversize line)
    keys = rng.sample(_KEYS[2:], rng.randrange(0, 6))
    if rng.random() < 0.9:
        keys.insert(rng.randrange(len(keys) + 1), "step")
    if rng.random() < 0.93:
        keys.insert(rng.randrange(len(keys) + 1), "type")
    if keys and rng.random() < 0.05:
        keys.append(rng.choice(keys))  # a repeated key
    colon, comma = rng.choice([(":", ","), (": ", ", "), (" : ", " , "), (":\t", ",\r")]) \
        if rng.random() < 0.3 else (":", ",")
    parts = []
    for k in keys:
        if k == "type":
            v = json.dumps(rng.choice(["step"] * 8 + ["event", "eval", ""])) if rng.random() < 0.97 else "3"
        elif k == "step":
            v = str(rng.randrange(-5, 10**6)) if rng.random() < 0.9 else _value_text(rng)
        else:
            v = _value_text(rng)
        parts.append(f"{json.dumps(k) if rng.random() < 0.97 else chr(34) + k + chr(34)}{colon}{v}")
    text = "{" + comma.join(parts) + "}"
    r = rng.random()
    if r < 0.03:
        text = " " + text
    elif r < 0.06:
        text += rng.choice([" ", "\r", "\t", ",", "}"])
    elif r < 0.08:
        text = text[: rng.randrange(len(text) + 1)]
    return text.encode("utf-8")


def _scan_steps(texts: list[bytes | None]) -> tuple:
    """``scan_steps`` with its step records made as ``parse_lines`` makes them when read
    (``steprecords``): (records line by line, undecided, columns, types, floats, the step records,
    not_steps), each record checked against its shape on the way; every column made (a column of
    floats that reading the records left unmade, by ``scanned_column`` as its readers make it)."""
    scan = native.scanner()
    shapes, undecided, columns, types, floats, rows, not_steps = scan.scan_steps(list(texts))
    steps = StepRecords.scanned(columns, floats, shapes, rows, scan.build_records)
    records = LineRecords(steps, not_steps, len(texts)) if not_steps else steps
    made = list(records)
    # A shape starts at the first step record and wherever the keys' order changes, nowhere else.
    keys = [tuple(r) for r in made if r is not None]
    assert shapes == [(i, k) for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert rows == len(keys) and [i for i, r in enumerate(made) if r is None] == not_steps
    columns = {key: scanned_column(columns, floats, key) for key in columns}
    return made, undecided, columns, types, floats, list(steps), not_steps


def _same(a, b) -> bool:
    """Equal records, value types and float bits (repr), key order included."""
    return list(a) == list(b) and all(type(a[k]) is type(b[k]) and repr(a[k]) == repr(b[k]) for k in a)


def _reads(line: bytes):
    """What orjson and the standard library read (both must agree for a line the scanner decides),
    with decode_record's non-finite strings: a flat object's "NaN", "Infinity" and "-Infinity"
    values are floats, except under the text keys."""
    try:
        return _nonfinite_read(orjson.loads(line)), _nonfinite_read(json.loads(line))
    except ValueError:
        return None, None


def _nonfinite_read(obj):
    if not isinstance(obj, dict):
        return obj
    return {k: NONFINITE_STRINGS.get(v, v) if isinstance(v, str) and k not in TEXT_KEYS else v
            for k, v in obj.items()}


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 40))
def test_every_line_the_scanner_decides_is_what_orjson_and_the_stdlib_read(seed, n):
    rng = random.Random(seed)
    _check_scan([_line(rng) for _ in range(n)])


# Value tokens that are prefixes of one another, or the same text as another kind (a string "true"):
# the scanner takes a token that is the bytes of the last step record's token for the key as the
# same value, and must tell these apart.
_ALIKE = ["1", "12", "1.0", "1.0e5", "1.05", "0.1", "0.10", "-1", "-1.5", "0", "-0", '"a"', '"ab"', '"a b"',
          "true", "false", "null", '"true"', '"step"', "1e999", '"xNaN"', "[1]", "01", "1.",
          "9007199254740993"]


def _alike_line(rng: random.Random) -> bytes:
    keys = ["step", "a", "b", "c"]
    if rng.random() < 0.2:
        rng.shuffle(keys)
    if rng.random() < 0.2:
        keys.remove(rng.choice(keys))
    keys.insert(0 if rng.random() < 0.8 else len(keys), "type")
    colon, comma = rng.choice([(":", ","), (": ", ", "), (":\t", " ,")])
    parts = []
    for k in keys:
        v = (rng.choice(['"step"'] * 9 + ['"event"']) if k == "type" else str(rng.randrange(3)) if k == "step"
             else rng.choice(_ALIKE[:4] if rng.random() < 0.5 else _ALIKE))
        parts.append(f'"{k}"{colon}{v}')
    return ("{" + comma.join(parts) + rng.choice(["}", "}", " }"])).encode()


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 30))
def test_a_token_like_the_last_one_is_read_for_itself(seed, n):
    rng = random.Random(seed)
    _check_scan([_alike_line(rng) for _ in range(n)])


@needs_scanner
def test_tokens_after_the_same_text_are_each_read():
    values = ["1", "12", "1", "1.0", "1.0e5", "1.05", "1.05", "0.1", "0.10", '"a"', '"ab"', '"a"', "true",
              '"true"', "true", "null", "0", "-0", "-0", "-1", "-1.5"]
    texts = [f'{{"type":"step","step":{i},"v":{v}}}'.encode() for i, v in enumerate(values)]
    records = _scan_steps(texts)[0]
    assert [r["v"] for r in records] == [json.loads(v) for v in values]
    assert [type(r["v"]) for r in records] == [type(json.loads(v)) for v in values]
    assert math.copysign(1, records[17]["v"]) == 1 and repr(records[18]["v"]) == "0"  # ("-0" is the int 0)
    _check_scan(texts)


def _check_scan(texts: list[bytes | None]) -> None:
    """What the scanner makes of ``texts`` is what orjson, the standard library, ``KeyColumns`` and the
    sidecar's reading make of the lines it decides."""
    n = len(texts)
    records, undecided, columns, types, floats, steps, not_steps = _scan_steps(list(texts))
    assert len(records) == n
    assert not_steps == [i for i, r in enumerate(records) if r is None]
    assert steps == [r for r in records if r is not None] and all(map(lambda a, b: a is b, steps,
                                                                       [r for r in records if r is not None]))
    assert set(undecided) <= set(not_steps) and undecided == sorted(undecided)
    for i, (line, rec) in enumerate(zip(texts, records)):
        if rec is not None:  # a step record: exactly what both parsers read
            by_orjson, by_stdlib = _reads(line)
            assert isinstance(by_orjson, dict) and _same(rec, by_orjson) and _same(rec, by_stdlib), line
            assert rec["type"] == "step"
        elif i not in undecided:  # another kind of record, decided: decode_record reads it
            by_orjson, by_stdlib = _reads(line)
            assert isinstance(by_orjson, dict) and "type" in by_orjson and by_orjson["type"] != "step", line
            assert by_stdlib == by_orjson
    # scan_records (for the lines parse_lines leaves to decode_record) decides the same lines, as
    # the same records, and decode_record validates them alone: the same record, or none.
    from gradmon.logformat.jsonl import RecordError, decode_record, validate_record

    scanned = native.scanner().scan_records(list(texts))
    assert [i for i, r in enumerate(scanned) if r is None] == undecided
    for line, rec, by_steps in zip(texts, scanned, records):
        if rec is None:
            continue
        assert _same(rec, _reads(line)[0]) and (by_steps is None or _same(rec, by_steps)), line
        try:
            want_rec, normalized = decode_record(line)
        except RecordError:
            with pytest.raises(RecordError):
                validate_record(rec)
        else:
            assert not normalized and _same(validate_record(rec), want_rec), line
    want = KeyColumns(steps)
    assert set(columns) == want.key_set() == set(types)
    for key, column in columns.items():
        assert json.dumps(column) == json.dumps(want.values(key))
        assert {t for bit, t in ((1, int), (2, float), (4, str), (8, bool), (16, type(None)))
                if types[key] & bit} == want.types(key)
        nonfinite = any(type(v) is float and not math.isfinite(v) for v in want.values(key))
        assert bool(types[key] & 32) == nonfinite
        # (the sidecar's reading of the column: values.number, MISSING where none)
        sidecar = array("d", [MISSING if (x := number(v)) is None else x for v in column])
        assert floats[key] == sidecar.tobytes()


@needs_scanner
def test_the_scanner_decides_the_writers_lines():
    recs = [{"type": "step", "step": 1, "epoch": 1, "ts": 1700000000.01, "loss": 2.357221, "grad_norm": 1.5,
             "lr": 0.001, "spike": False, "clipped": True, "note": "warm-up"},
            {"type": "step", "step": 2, "loss": 1e-9, "grad_norm": 12345678.0, "lr": None, "zscore": -3.25}]
    texts = [encode_record(r).rstrip("\n").encode() for r in recs]
    records, undecided, columns, _types, _floats, steps, not_steps = _scan_steps(texts)
    assert undecided == not_steps == [] and records == recs and steps == recs
    assert columns["lr"] == [0.001, None] and columns["zscore"] == [None, -3.25]


@needs_scanner
def test_a_column_of_floats_alone_is_made_when_read_and_once():
    recs = [{"type": "step", "step": s, "lr": 0.1 * s, "mixed": 1 if s == 2 else s / 4,
             "text": 0.5 if s < 3 else "x", "gap": 2.5} for s in range(1, 5)]
    del recs[1]["gap"]
    texts = [encode_record(r).rstrip("\n").encode() for r in recs]
    scan = native.scanner()
    shapes, _undecided, columns, types, floats, rows, _not_steps = scan.scan_steps(texts)
    # Only "lr" holds floats alone: no object made. The floats among other values are made, exactly.
    assert [k for k, c in columns.items() if c is None] == ["lr"]
    assert columns["mixed"] == [0.25, 1, 0.75, 1.0] and type(columns["mixed"][1]) is int
    assert columns["text"] == [0.5, 0.5, "x", "x"] and columns["gap"] == [2.5, None, 2.5, 2.5]
    # The records and the batch's columns make "lr" once, from its float64s, and share it.
    steps = StepRecords.scanned(columns, floats, shapes, rows, scan.build_records)
    assert steps[2] == recs[2] and columns["lr"] is None  # (one record read: its value alone)
    cols = KeyColumns(steps)
    cols.prefill(columns, types, floats)
    lr = cols.values("lr")
    assert lr == [0.1 * s for s in range(1, 5)] and columns["lr"] is lr and cols.values("lr") is lr
    assert list(steps) == recs and steps[3]["lr"] is lr[3]
    assert cols.sliced(1, 3).values("lr") == lr[1:3]


def _pairs(texts: list[bytes | None]) -> list[tuple[int, bytes | None]]:
    out, end = [], 0
    for t in texts:
        end += (len(t) if t is not None else 50) + 1
        out.append((end, t))
    return out


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 50))
def test_parse_lines_is_the_same_with_and_without_the_scanner(seed, n):
    rng = random.Random(seed)
    # (mostly the writer's step records, as a real batch, with other lines among them)
    plain = [encode_record({"type": "step", "step": s, "loss": rng.random(), "grad_norm": rng.random() * 3,
                            **({"spike": True} if rng.random() < 0.1 else {})}).rstrip("\n").encode()
             for s in range(n)]
    texts = [p if rng.random() < 0.7 else _line(rng) for p in plain]
    pairs = _pairs(texts)
    got = parse_lines(pairs, 0)
    want = parse_lines(pairs, 0, use_native=False)
    assert [repr(r) for r in got.records] == [repr(r) for r in want.records]
    assert (got.raw, got.offsets, got.check, got.malformed, got.end) == \
        (want.raw, want.offsets, want.check, want.malformed, want.end)
    for parsed in (got, want):
        cols = parsed.columns
        assert cols is not None and cols.records is parsed.records
        assert cols.key_set() == set().union(*parsed.records)
        for k in cols.key_set():
            assert repr(cols.values(k)) == repr([r.get(k) for r in parsed.records])
            assert cols.types(k) == {type(r.get(k)) for r in parsed.records}
        if cols.no_bools():
            assert not any(type(v) is bool for r in parsed.records for v in r.values())
        if parsed.step_columns is not None:
            steps = [r for r in parsed.records if r["type"] == "step"]
            assert all(map(lambda a, b: a is b, parsed.step_columns.records, steps))
            assert len(parsed.step_columns.records) == len(steps)
            for k in parsed.step_columns.key_set():
                assert repr(parsed.step_columns.values(k)) == repr([r.get(k) for r in steps])


_PROBE = """
import json, sys
from gradmon.server import native
from gradmon.server.columns import MISSING, MISSING_BITS
from gradmon.logformat.values import number
from gradmon.server.parse import parse_lines
line = b'{"type":"step","step":1,"loss":0.5}'
parsed = parse_lines([(len(line) + 1, line)], 0)
print(json.dumps([native.scanner() is not None, native.unavailable_reason(), list(parsed.records)]))
"""


def _probe(tmp_path, **env) -> list:
    """[scanner used, why not, records parsed, stderr] of a fresh process."""
    environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **env}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True, text=True,
                         timeout=120, check=True)
    return [*json.loads(out.stdout), out.stderr]


def test_without_the_scanner_the_python_path_indexes(tmp_path):
    used, reason, records, stderr = _probe(tmp_path, GRADMON_NATIVE="0")
    assert not used and "GRADMON_NATIVE=0" in reason
    assert records == [{"type": "step", "step": 1, "loss": 0.5}]
    assert "scanner" not in stderr  # (asked for: nothing to warn about)
    assert not (tmp_path / "cache").exists()  # (nothing built)


def test_a_missing_compiler_is_named_and_the_python_path_indexes(tmp_path):
    used, reason, records, stderr = _probe(tmp_path, GRADMON_CC=str(tmp_path / "no-such-cc"))
    assert not used and "no C compiler" in reason
    assert records == [{"type": "step", "step": 1, "loss": 0.5}]
    # (the message of docs/troubleshooting.md, "A slow first index", once)
    assert stderr.count("indexing without the compiled line scanner (the Python path, about three times as "
                        "slow on big logs): no C compiler found") == 1


@needs_scanner
def test_a_module_whose_self_test_raises_is_not_used(monkeypatch, caplog):
    # (the self-test's own checks raise NativeBuildError; a module that raises anything else on
    # the way, as a changed scan_steps once did, is broken as well: the Python path indexes)
    def broken(module):
        raise ValueError("build_records: each column a list of at least stop values")

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_self_test", broken)
    assert native.scanner() is None
    assert native.unavailable_reason() == "ValueError: build_records: each column a list of at least stop " \
                                          "values"
    assert "indexing without the compiled line scanner" in caplog.text


@needs_scanner
def test_the_scanner_is_built_once_into_the_cache(tmp_path):
    assert _probe(tmp_path)[:2] == [True, None]
    built = list((tmp_path / "cache" / "gradmon" / "native").glob("*/_scanlines*"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert _probe(tmp_path)[:2] == [True, None]  # (a second process loads it, compiles nothing)
    assert [p.stat().st_mtime_ns for p in (tmp_path / "cache" / "gradmon" / "native").glob("*/_scanlines*")] \
        == [mtime]


@needs_scanner
@settings(max_examples=500, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                 st.tuples(st.floats(-1e30, 1e30), st.integers(0, 25), st.sampled_from("fegE")).map(
                     lambda t: f"{t[0]:.{t[1]}{t[2]}}"),
                 st.integers(-(10**20), 10**20).map(str),
                 st.from_regex(r"\A-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?\Z")))
def test_a_number_the_scanner_reads_is_the_one_orjson_and_the_stdlib_read(text):
    line = b'{"type":"step","step":1,"v":' + text.encode() + b"}"
    records, undecided, *_ = _scan_steps([line])
    if records[0] is None:  # (left to orjson: a number beyond what the scanner reads, or not JSON)
        assert undecided == [0]
        return
    by_orjson, by_stdlib = _reads(line)
    assert _same(records[0], by_orjson) and _same(records[0], by_stdlib), text


def test_the_powers_of_ten_are_their_leading_128_bits_rounded_down():
    # Two rows of the table Go's strconv and Wuffs publish (their range is wider: -348..347).
    assert native.power_of_ten_mantissa(-348) == 0xFA8FD5A0081C0288_1732C869CD60E453
    assert native.power_of_ten_mantissa(43) >> 64 == 0xE596B7B0C643C719
    for q in range(native.POW10_MIN, native.POW10_MAX + 1):  # (each against exact rationals)
        m = native.power_of_ten_mantissa(q)
        exact = Fraction(10) ** q
        e = 127 - math.floor(math.log2(10) * q)  # (a guess within one of the exponent that fits)
        while exact * Fraction(2) ** e >= 2**128:
            e -= 1
        while exact * Fraction(2) ** e < 2**127:
            e += 1
        assert m == math.floor(exact * Fraction(2) ** e), q
    header = native.powers_of_ten_header()
    assert header.count("ULL}, /* 1e") == native.POW10_MAX - native.POW10_MIN + 1


def _float_tokens(rng: random.Random, n: int) -> list[str]:
    """``n`` number tokens of each kind a float reader gets wrong first: any double's repr; float32
    values widened (the writer's device values); time stamps; numbers of up to 19 digits with
    exponents; near the smallest normal double and below; ties between two doubles and their
    neighbours (to even), written with up to 19 digits."""
    def float32() -> float:
        x = rng.uniform(-1e3, 1e3) * 10.0 ** rng.randrange(-9, 9)
        return struct.unpack("<f", struct.pack("<f", x))[0]

    def any_double() -> float:
        while not math.isfinite(x := struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]):
            pass
        return x

    def tie() -> str:
        ulp = 2 ** rng.randrange(1, 12)  # (between 2^53 and 2^64: a tie is an integer)
        x = rng.randrange(2**52, 2**53) * ulp
        text = str(x + ulp // 2 + rng.choice([-1, 0, 0, 1]))
        k = rng.randrange(1, len(text))
        return rng.choice([text + ".0", text + "e0", f"{text[:len(text) - k]}.{text[len(text) - k:]}e{k}"])

    kinds = [
        lambda: repr(any_double()),
        lambda: repr(float32()),
        lambda: repr(1.7e9 + rng.random() * 1e8),
        lambda: f"{rng.choice(['', '-'])}{rng.randrange(10 ** rng.randrange(1, 20))}"
                f".{rng.randrange(10 ** rng.randrange(1, 12))}e{rng.randrange(-330, 310)}",
        lambda: repr(rng.uniform(0.5, 8) * 2.0 ** rng.randrange(-1080, -1015)),
        tie,
    ]
    return [kind() for kind in kinds for _ in range(n)]


_HARD_TOKENS = [
    "9007199254740993.0", "9007199254740995.0", "9007199254740993.0000001", "1e23", "8.98846567431158e307",
    "1.7976931348623157e308", "1.7976931348623159e308", "2.2250738585072014e-308", "2.2250738585072011e-308",
    "4.9406564584124654e-324", "0.1", "0.30000000000000004", "-0.0e10", "0e-400", "123456789012345678.9e-5",
    "7.2057594037927933e16", "1e-300", "1.00000000000000011102230246251565404236316680908203125",
]


def _scanned_floats(tokens: list[str], module: Any = None) -> list[float | None]:
    """Each token as the scanner (``module``, else the one the server uses) reads it (its float64
    column's value), ``None`` where it leaves the token to orjson: 64 tokens to a line, a line with
    one left read token by token."""
    scan = (module or native.scanner()).scan_steps
    out: list[float | None] = []
    for i in range(0, len(tokens), 64):
        chunk = [t.encode() for t in tokens[i:i + 64]]
        fields = b",".join(b'"k%d":%s' % (j, t) for j, t in enumerate(chunk))
        _, undecided, columns, _, floats, _, _ = scan([b'{"type":"step","step":1,%s}' % fields])
        if not undecided:
            for j in range(len(chunk)):
                value = struct.unpack("<d", floats[f"k{j}"])[0]
                # (a column of floats alone is made when read, from the float64s: the same)
                assert columns[f"k{j}"] is None
                assert repr(scanned_column(columns, floats, f"k{j}")[0]) == repr(value)
                out.append(value)
            continue
        for t in chunk:
            _, undecided, _, _, floats, _, _ = scan([b'{"type":"step","k":%s}' % t])
            out.append(None if undecided else struct.unpack("<d", floats["k"])[0])
    return out


@needs_scanner
def test_the_scanner_reads_each_float_as_cpython_does_bit_for_bit():
    # (Clinger's path, Eisel and Lemire's, and CPython's parser where neither is sure: what a
    # token is read as must not depend on which one read it)
    tokens = _float_tokens(random.Random(20261207), 10_000) + _HARD_TOKENS
    for token, value in zip(tokens, _scanned_floats(tokens)):
        if value is None:  # (only what orjson refuses: beyond the largest double)
            assert math.isinf(float(token)), token
        else:
            assert struct.pack("<d", value) == struct.pack("<d", float(token)), token


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(10**15), 10**15), st.sampled_from([0.0, -0.0, 1.5, -1.5]),
                          st.floats(allow_nan=False, allow_infinity=False, width=64)),
                min_size=1, max_size=64),
       st.integers(1, 16), st.integers(0, 3), st.booleans())
def test_bucket_summaries_are_column_summary_of_each_bucket(values, size, start, shuffled):
    from gradmon.server.pyramid import column_summary

    start = min(start, len(values) - 1)
    buckets = (len(values) - start) // size
    steps = list(range(100, 100 + len(values)))
    if shuffled:
        random.Random(len(values)).shuffle(steps)
    floats = array("d", [MISSING if v is None else float(v) for v in values]).tobytes()
    got = native.scanner().bucket_summaries(floats, steps, start, buckets, size)
    want = []
    for b in range(buckets):
        a = start + b * size
        f, nonfinite = column_summary(values[a:a + size], steps[a:a + size])
        assert not nonfinite
        want.append(f)
    assert repr(got) == repr(want)
    bad = array("d", floats)
    bad[start] = math.inf
    assert native.scanner().bucket_summaries(bad.tobytes(), steps, start, max(buckets, 1), 1) is None
    with pytest.raises(ValueError):
        native.scanner().bucket_summaries(floats, steps, start, buckets + len(values), size)


@needs_scanner
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -1.5]),
                                   st.floats(allow_nan=False, allow_infinity=False, width=64)),
                         min_size=24, max_size=24) | st.none(), min_size=0, max_size=6),
       st.integers(1, 8), st.integers(0, 3), st.integers(-1, 23))
def test_bucket_columns_are_each_name_s_bucket_summaries_column_wise(columns, size, start, bad_row):
    # Columns of one batch (None: a name none of the records has; rows without a number), summed
    # up for several buckets at once: per name, its bucket_summaries as the pyramid's nine
    # columns (a row of zeros for a bucket without a number), None for a name with no number in
    # any bucket; None for the whole call as soon as one value in the buckets is not finite.
    names = [f"k{j}" for j in range(len(columns))]
    steps = list(range(7, 7 + 24))
    buckets = (24 - start) // size
    floats = [None if c is None else array("d", [MISSING if v is None else v for v in c]).tobytes()
              for c in columns]
    got = native.scanner().bucket_columns(names, floats, steps, start, buckets, size)
    want: list = []
    for f in floats:
        summaries = [] if f is None else native.scanner().bucket_summaries(f, steps, start, buckets, size)
        if all(s is None for s in summaries):
            want.append(None)
            continue
        rows = [s if s is not None else [0] * 9 for s in summaries]
        want.append([array(tc, [row[c] for row in rows]).tobytes()
                     for c, tc in enumerate(("I", "q", "d", "q", "d", "q", "d", "q", "d"))])
    assert got == want
    scanned = [j for j, f in enumerate(floats) if f is not None]
    if scanned and start <= bad_row < start + buckets * size:
        bad = array("d", floats[scanned[-1]])
        bad[bad_row] = -math.inf
        floats[scanned[-1]] = memoryview(bad.tobytes())
        assert native.scanner().bucket_columns(names, floats, steps, start, buckets, size) is None
    with pytest.raises(ValueError):
        native.scanner().bucket_columns(names, floats, steps, start, buckets + 30, size)


@needs_scanner
def test_an_integer_beyond_2_to_the_53_is_left_to_orjson():
    # (2**53 + 1 and 2**53 are one double: a bucket's minimum taken from the float64 column would
    # be the first of them, Python's is the smaller)
    for v, decided in ((2**53, True), (2**53 + 1, False), (-(2**53) - 1, False), (10**17, False)):
        records, undecided, *_ = _scan_steps([b'{"type":"step","step":1,"v":%d}' % v])
        assert (records[0] is not None) == decided and (undecided == []) == decided, v
        if decided:
            assert records[0]["v"] == v and type(records[0]["v"]) is int


@needs_scanner
def test_the_portable_128_bit_product_reads_floats_alike(tmp_path):
    # (Eisel and Lemire's product of two 64-bit halves without __int128, for compilers that lack
    # it: built here with the macro that selects it, self-tested, and read over the same tokens)
    (tmp_path / "powers_of_ten.h").write_text(native.powers_of_ten_header(), encoding="ascii")
    out = tmp_path / ("_scanlines" + importlib.machinery.EXTENSION_SUFFIXES[0])
    cmd = [native._compiler(dict(os.environ)), *native.CC_FLAGS, "-DGRADMON_PORTABLE_MUL",
           f"-I{sysconfig.get_paths()['include']}", f"-I{tmp_path}", "-o", str(out), str(native.SOURCE)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    portable = native._load(out)
    native._self_test(portable)
    tokens = _float_tokens(random.Random(7), 3000) + _HARD_TOKENS

    def bits(values: list[float | None]) -> list[bytes | None]:
        return [None if v is None else struct.pack("<d", v) for v in values]

    assert bits(_scanned_floats(tokens, portable)) == bits(_scanned_floats(tokens))


_M4_VALUES = st.one_of(
    st.floats(width=64), st.sampled_from([0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf])
)


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_M4_VALUES, st.sampled_from([0.0, -0.0, 1e-31, ZERO_NORM, 1e-29, MISSING])),
                max_size=200))
def test_rows_in_are_the_zero_norms_of_the_alarm_rule(values):
    # The batch alarm rule finds its zero norms by it (alarmrule._zero_norms); a row without a
    # number (MISSING, a NaN) is none.
    got = native.scanner().rows_in(array("d", values), 0.0, ZERO_NORM)
    assert got == [i for i, v in enumerate(values) if is_zero_norm(v)]


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.lists(_M4_VALUES, max_size=300), st.integers(-1, 80))
def test_m4_indices_are_downsample_indices(values, buckets):
    # Ties (repeated values, 0.0 and -0.0) keep the first; NaN and infinities are always kept.
    from gradmon.server.downsample import downsample_indices

    got = native.scanner().m4_indices(array("d", values), buckets)
    assert got == downsample_indices(values, max(1, buckets))
    if values:  # a row without a number: not the scanner's to decide (the caller drops such rows first)
        holed = array("d", values)
        holed[len(values) // 2] = MISSING
        assert native.scanner().m4_indices(holed, buckets) is None


@needs_scanner
@settings(max_examples=150, deadline=None)
@given(st.lists(_M4_VALUES, min_size=1, max_size=400), st.integers(4, 120), st.sets(st.integers(0, 450)),
       st.booleans())
def test_a_column_is_downsampled_alike_with_and_without_the_scanner(values, points, flagged, ts):
    from gradmon.server import columns

    steps = list(range(7, 7 + len(values)))
    flags = bytes(1 if i in flagged else 0 for i in range(len(values)))
    cols = {"ts" if ts else "loss": (0, array("d", values))}
    got = columns.series_from_columns(steps, steps, flags, cols, -math.inf, math.inf, points)
    saved = columns._native_scanner
    columns._native_scanner = lambda: None
    try:
        want = columns.series_from_columns(steps, steps, flags, cols, -math.inf, math.inf, points)
    finally:
        columns._native_scanner = saved
    assert repr(got) == repr(want)


_point_values = st.sampled_from([0.0, -0.0, 1.0, 2.0, -1.5])


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.tuples(st.integers(0, 2), _point_values), min_size=1,
                                                      max_size=5)), min_size=1, max_size=12),
       st.integers(0, 5), st.data())
def test_field_points_are_the_python_points_of_the_stored_records(nodes, first, data):
    # Summaries built record by record (steps that repeat or go back, -0.0 beside 0.0, ties, some
    # without the field), stored as levelfiles.FIELD records from bucket `first` on: the compiled
    # field_points of any increasing subset of them is pyramid._extend_points of their columns.
    from gradmon.server.levelfiles import FIELD, field_columns
    from gradmon.server.pyramid import Summary, _extend_points, _pick

    summaries, step = [], 0
    for gap, recs in nodes:
        s = Summary(0)
        for d, v in recs:
            step += d - 1 if gap == 2 else d
            if gap != 3:
                s.add(step, [("f", v)])
        summaries.append(s)
    raw = b"".join(FIELD.pack(*s.fields.get("f", [0] * 9)) for s in summaries)
    picked = sorted(data.draw(st.sets(st.integers(first, first + len(summaries) - 1))))
    want: list = []
    _extend_points(want, _pick(field_columns(raw), first, picked))
    got = native.scanner().field_points(raw, first, picked)
    assert repr(got) == repr(want)
    with pytest.raises(IndexError):
        native.scanner().field_points(raw, first, [first + len(summaries)])
    nan = FIELD.pack(1, 5, math.nan, 5, math.nan, 5, math.nan, 5, math.nan)
    assert native.scanner().field_points(raw + nan, first, [first + len(summaries)]) is None


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b""))
                | st.sampled_from([b"\r", b"a\r", b"\r\r"]), max_size=14),
       st.sampled_from([b"", b"\n", b"tail"]), st.integers(0, 1 << 40), st.sampled_from([1, 4, 8, 1 << 20]),
       st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_the_compiled_line_splitter_splits_as_the_python_loop(lines, end, offset, max_line, cuts):
    # A stream of lines (empty ones, CRs before and inside them, some longer than max_line) fed in
    # blocks cut anywhere: the tailer's splitter (the compiled loop) hands out the same lines, and
    # keeps the same partial line, as the plain LineSplitter.
    from gradmon.logformat.lines import LineSplitter
    from gradmon.server.tail import line_splitter

    data = b"\n".join(lines) + end
    compiled, plain = line_splitter(offset, max_line), LineSplitter(offset, max_line)
    assert compiled._split_lines is not None
    got, want, i = [], [], 0
    for cut in cuts * (len(data) // sum(cuts) + 1):
        block, i = data[i:i + cut], i + cut
        got += compiled.feed(block)
        want += plain.feed(block)
        assert (compiled.line_start, compiled.fed) == (plain.line_start, plain.fed)
        if i >= len(data):
            break
    assert got == want
    assert bytes(compiled._buf) == bytes(plain._buf)


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(-6, 6).map(lambda i: i / 4) | st.floats(-1e300, 1e300)
                | st.sampled_from([-0.0, 0.0]), max_size=700),
       st.booleans())
def test_the_compiled_median_is_the_median_of_sorted(values, as_deque):
    # Ties, zeros of both signs, small and big windows (a C array on the stack or the heap), a deque
    # (WindowBaseline's window): the median the alarm rule judges with is the one sorted() gives,
    # to the bit, or None where the selection could differ from it (a zero: sorted keeps 0.0 and
    # -0.0 in their order; an empty window).
    from collections import deque

    got = native.scanner().median(deque(values) if as_deque else values)
    s = sorted(values)
    n = len(s)
    want = None if n == 0 else s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    if got is None:
        assert want is None or want == 0.0
    else:
        assert repr(got) == repr(want)
    assert native.scanner().median([*values, math.nan]) is None
    assert native.scanner().median([*values, 1]) is None


@needs_scanner
def test_the_selections_refuse_what_is_not_a_sequence():
    scan = native.scanner()
    with pytest.raises(TypeError):
        scan.order_statistic(0, 1.0, [2.0])
    with pytest.raises(TypeError):
        scan.median(3.0)
    with pytest.raises(TypeError):
        scan.window_medians([1.0], [2.0], ["1"], 3)
    with pytest.raises(ValueError):
        scan.window_medians([1.0], [2.0], [1], 0)
    assert scan.order_statistic(1, [2.0] * 2000, [1.0]) == 2.0  # (more than the stack holds)


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.data())
def test_window_medians_are_the_running_medians_of_sorted(size, data):
    # The alarm rule's scale samples: a window of `size` (a deque, oldest first) takes `values`, and
    # at each cut (values taken so far) its median is the one sorted() gives, to the bit; None for
    # the whole call where a selection could differ (a zero median) or a cut is out of order.
    from collections import deque

    floats = st.integers(-4, 4).map(lambda i: i / 2) | st.floats(-1e300, 1e300) | st.sampled_from([-0.0, 0.0])
    window = deque(data.draw(st.lists(floats, max_size=size)), maxlen=size)
    values = data.draw(st.lists(floats, max_size=120))
    cuts = sorted(data.draw(st.lists(st.integers(0 if window else 1, len(values)), max_size=8))) \
        if window or values else []
    got = native.scanner().window_medians(window, values, cuts, size)
    want = []
    for c in cuts:
        s = sorted([*window, *values[:c]][-size:])
        n = len(s)
        want.append(s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]))
    if got is None:
        assert 0.0 in want
    else:
        assert repr(got) == repr(want)
    if len(cuts) >= 2 and cuts[0] != cuts[-1]:
        assert native.scanner().window_medians(window, values, cuts[::-1], size) is None
    if values:
        assert native.scanner().window_medians(window, [*values[:-1], 1], cuts, size) is None


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([-0.0, 0.0, 1.0, -1.0, 2.5]) | st.floats(-1e300, 1e300), max_size=700),
       st.lists(st.sampled_from([-0.0, 0.0, 1.0, 2.5]) | st.floats(-1e300, 1e300), max_size=400),
       st.integers(-2, 1200), st.booleans())
def test_order_statistic_is_sorted_s(a, b, k, as_deque):
    # The alarm rule's median ceiling (WindowBaseline.median_ceiling*: a window, a deque, and a
    # chunk's values): sorted(chain(a, b))[k] to the bit, or None where a selection could differ (a
    # zero result: sorted keeps 0.0 and -0.0 in their order) or k is out of range; stack and heap.
    from collections import deque

    got = native.scanner().order_statistic(k, deque(a) if as_deque else a, b)
    together = sorted([*a, *b])
    if not 0 <= k < len(together):
        assert got is None
    elif got is None:
        assert together[k] == 0.0
    else:
        assert repr(got) == repr(together[k])
    if a and 0 <= k < len(together):
        assert native.scanner().order_statistic(k, [*a[:-1], math.nan], b) is None
        assert native.scanner().order_statistic(k, a, [*b, 1]) is None


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([-0.0, 0.0, 1.0, -1.0, 2.5]) | st.floats(-1e300, 1e300), max_size=60),
       st.integers(0, 60), st.integers(0, 60), st.integers(1, 9))
def test_chunk_maxima_are_max_of_each_chunk(values, a, b, chunk):
    # The alarm rule's quiet-chunk screen: max() of each chunk of rows [lo, hi), the first of equal
    # values (-0.0 and 0.0 told apart by repr), the last chunk cut at hi; rows outside refused.
    raw = array("d", values).tobytes()
    lo, hi = sorted((a, b))
    if hi > len(values):
        with pytest.raises(ValueError):
            native.scanner().chunk_maxima(raw, lo, hi, chunk)
        return
    want = [max(values[i:min(hi, i + chunk)]) for i in range(lo, hi, chunk)]
    assert repr(native.scanner().chunk_maxima(raw, lo, hi, chunk)) == repr(want)
    assert repr(native.scanner().chunk_maxima(memoryview(raw)[8 * lo:], 0, hi - lo, chunk)) == repr(want)
    with pytest.raises(ValueError):
        native.scanner().chunk_maxima(raw, lo, hi, 0)


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-3, 3) | st.sampled_from([2**53, -(2**53), 2**53 - 1]), max_size=40),
       st.integers(0, 40), st.integers(0, 40))
def test_a_scanned_batch_s_steps_increase_as_the_ints_do(steps, a, b):
    # KeyColumns.increasing reads the scanner's float64 step column (ints up to 2^53, exact), the
    # whole batch's and a part's; the definition compares the ints.
    steps = steps or [5]
    lines = [encode_record({"type": "step", "step": s, "loss": 1.0}).strip().encode() for s in steps]
    parsed = parse_lines(_pairs(lines), 0)
    cols = parsed.columns
    assert len(parsed.records) == len(steps) and cols.floats("step") is not None
    assert cols.increasing() == all(x < y for x, y in zip(steps, steps[1:]))
    lo, hi = sorted((min(a, len(steps)), min(b, len(steps))))
    part = steps[lo:hi]
    assert cols.sliced(lo, hi).increasing() == all(x < y for x, y in zip(part, part[1:]))


@needs_scanner
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1),
                          st.floats(allow_nan=True) | st.sampled_from([-0.0, math.inf])), max_size=30),
       st.booleans())
def test_rows_of_columns_are_the_level_files_records(rows, short):
    # LevelFile.append's records (levelfiles.FIELD: a count from an 'I' column, steps and values)
    # from a level's columns in one call: the bytes struct gives, NaN bits and -0.0 included.
    from gradmon.server.levelfiles import FIELD

    steps, values = array("q", [r[1] for r in rows]), array("d", [r[2] for r in rows])
    cols = [array("I", [r[0] for r in rows]), *[steps, values] * 4]
    want = b"".join(map(FIELD.pack, *cols))
    assert native.scanner().rows_of_columns(cols, tuple(c.itemsize for c in cols), len(rows)) == want
    if short and rows:
        with pytest.raises(ValueError):
            native.scanner().rows_of_columns(cols, tuple(c.itemsize for c in cols), len(rows) + 1)
        with pytest.raises(ValueError):
            native.scanner().rows_of_columns(cols, (2,) * len(cols), len(rows))


_OTHER_VALUES = ["1", "-2", "1.5", "1e3", '"x"', "true", "null", '""', "9007199254740993"]


@needs_scanner
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_records_of_other_kinds_are_validated_as_decode_record_does(seed, n):
    # Valid step records with system/eval/event records among them whose known fields (step, epoch,
    # ts, start_time, type) hold every kind of value: the records the scanner reads are validated a
    # column at a time (parse._others_valid), else one by one, and parse_lines gives what it gives
    # without the scanner (decode_record): the same records, and the same lines counted malformed.
    rng = random.Random(seed)
    texts = []
    for s in range(n):
        if rng.random() < 0.5:
            step = encode_record({"type": "step", "step": s, "loss": rng.random()})
            texts.append(step.rstrip("\n").encode())
            continue
        kind = json.dumps(rng.choice(["system", "eval", "event", "system", ""]))
        fields = {k: rng.choice(_OTHER_VALUES) if rng.random() < 0.2 else ("1" if k != "ts" else "2.5")
                  for k in rng.sample(["step", "epoch", "ts", "start_time", "cpu"], rng.randrange(1, 5))}
        parts = [f'"type":{kind}', *(f'"{k}":{v}' for k, v in fields.items())]
        texts.append(("{" + ",".join(parts) + "}").encode())
    pairs = _pairs(texts)
    got, want = parse_lines(pairs, 0), parse_lines(pairs, 0, use_native=False)
    assert [repr(r) for r in got.records] == [repr(r) for r in want.records]
    assert (got.raw, got.offsets, got.check, got.malformed) == \
        (want.raw, want.offsets, want.check, want.malformed)


@needs_scanner
def test_a_step_record_off_the_fast_path_is_among_the_step_records():
    # A step line the step scanner leaves (a blank before it) and a system record, both read by
    # scan_records: the batch's step records, and their columns, include that step record.
    lines = [b'{"type":"step","step":1,"loss":1.0}', b' {"type":"step","step":2,"loss":2.0}',
             b'{"type":"system","step":2,"cpu":50.0}', b'{"type":"step","step":3,"loss":3.0}']
    got = parse_lines(_pairs(lines), 0)
    want = parse_lines(_pairs(lines), 0, use_native=False)
    assert [repr(r) for r in got.records] == [repr(r) for r in want.records]
    assert got.raw[1] == lines[1].strip() and got.check == want.check
    for parsed in (got, want):
        if parsed.step_columns is not None:
            assert parsed.step_columns.values("step") == [1, 2, 3]


@needs_scanner
def test_a_step_record_s_non_finite_strings_are_read_by_the_scanner_as_decode_record_reads_them():
    # A diverged run's lines ("NaN" strings, as the writer logs non-finite values): decided by the
    # scanner, as floats with decode_record's bits, and checked for marks; not under a text key.
    recs = [{"type": "step", "step": s, "loss": 0.5, "grad_norm": 1.0} for s in range(1, 6)]
    recs[1] = {"type": "step", "step": 2, "loss": "NaN", "grad_norm": "Infinity", "nonfinite": True}
    recs[2] = {"type": "step", "step": 3, "loss": 0.5, "grad_norm": "NaN"}  # (the next line: one too)
    recs[3] = {"type": "step", "step": 4, "loss": "-Infinity", "grad_norm": 1.0, "note": "NaN"}
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    lines.append(b'{"type":"event","kind":"note","step":5,"message":"NaN"}')  # (a text key: "NaN" is text)
    _shapes, undecided, _columns, types, floats, rows, holes = native.scanner().scan_steps(lines)
    assert (undecided, holes, rows) == ([5], [5], 5)
    assert floats["loss"][8:16] == struct.pack("<d", math.nan) and floats["grad_norm"][8:16] == struct.pack(
        "<d", math.inf) and floats["loss"][24:32] == struct.pack("<d", -math.inf)
    assert types["loss"] & 32 and types["note"] & 32 and not types["step"] & 32
    got, want = parse_lines(_pairs(lines), 0), parse_lines(_pairs(lines), 0, use_native=False)
    assert [repr(r) for r in got.records] == [repr(r) for r in want.records]
    assert got.records[5]["message"] == "NaN" and math.isnan(got.records[3]["note"])
    assert (got.raw, got.check) == (want.raw, want.check) and {1, 2, 3} <= set(got.check)
    assert isinstance(got.step_columns.records, StepRecords)  # (the fast path's columns kept)


@needs_scanner
def test_a_batch_with_a_non_finite_step_summarizes_the_buckets_around_it_from_columns():
    from gradmon.server.index import RunIndex
    from gradmon.server.pyramid import BUCKET

    recs = [{"type": "step", "step": s, "ts": 1.7e9 + s, "loss": 1.0 / s, "grad_norm": 0.5}
            for s in range(1, 1 + 10 * BUCKET)]
    bad = 5 * BUCKET + 3
    recs[bad] = {**recs[bad], "loss": "NaN", "nonfinite": True}
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    pairs = _pairs(lines)
    idx = RunIndex()
    idx.add_lines(pairs[:BUCKET], 0)  # (the fields' first records)
    parsed = idx.add_lines(pairs[BUCKET:], pairs[BUCKET - 1][0])
    assert isinstance(parsed.records, StepRecords)
    made = [i for i, r in enumerate(parsed.records._rows.made or []) if r is not None]
    assert len(made) <= BUCKET and bad - BUCKET in made  # (the non-finite step's bucket only)
    ref = RunIndex()
    for k, pair in enumerate(pairs):
        ref.add_lines([pair], pairs[k - 1][0] if k else 0)
    assert repr(idx.steps.marks) == repr(ref.steps.marks)  # (NaN values: compared by their repr)
    assert idx.steps.marks[0][:3] == (bad + 1, "nonfinite", "loss")
    base, want = idx.steps.pyramid.base, ref.steps.pyramid.base
    assert base.size == want.size == 10
    assert [base.get(i).fields for i in range(10)] == [want.get(i).fields for i in range(10)]
