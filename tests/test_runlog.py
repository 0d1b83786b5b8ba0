"""RunLogWriter (append, one line per write, I/O failures never raise) and read_records."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradmon.logformat.jsonl import encode_record
from gradmon.logformat.lines import MAX_LINE_BYTES
from gradmon.logformat.reader import ReadStats, read_records
from gradmon.monitor.writer import RunLogWriter


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def strict_lines(path: str) -> list[dict]:
    """Every line must be strict JSON (no NaN/Infinity tokens)."""

    def reject(token: str):
        raise AssertionError(f"non-standard token {token}")

    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    return [json.loads(line, parse_constant=reject) for line in text.splitlines()]


# -- writer -------------------------------------------------------------------------------------


def test_writer_header_records_end_and_append(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with RunLogWriter(path, header={"config": {"lr": 0.1}, "log_interval": 1}) as w:
        w.write({"type": "step", "step": 1, "loss": math.nan, "grad_norm": math.inf})
        # Visible to a reader before close (no user-space buffer).
        assert [r["type"] for r in read_records(path)] == ["header", "step"]
    w2 = RunLogWriter(path, header={"log_interval": 2})
    w2.write({"type": "step", "step": 1, "loss": 1.0})
    w2.close("aborted", steps=1)
    lines = strict_lines(str(path))
    assert [r["type"] for r in lines] == ["header", "step", "end", "header", "step", "end"]
    assert lines[1]["loss"] == "NaN" and lines[1]["grad_norm"] == "Infinity"
    assert lines[0]["schema"] == 1 and lines[0]["config"] == {"lr": 0.1}
    assert lines[0]["run_id"] != lines[3]["run_id"]
    assert lines[2] == {**lines[2], "status": "finished", "dropped_records": 0}
    assert lines[5]["status"] == "aborted" and lines[5]["steps"] == 1
    records = list(read_records(path))
    assert math.isnan(records[1]["loss"]) and records[1]["grad_norm"] == math.inf


def test_writer_refuses_overlong_record(tmp_path):
    path = tmp_path / "m.jsonl"
    w = RunLogWriter(path)
    with pytest.warns(RuntimeWarning, match="line limit"):
        assert not w.write({"type": "step", "step": 1, "blob": "x" * MAX_LINE_BYTES})
    assert w.write({"type": "step", "step": 2})
    assert w.dropped_records == 1
    w.close()
    assert [r.get("step") for r in read_records(path)] == [2, None]


def test_writer_file_in_the_way_is_named_checked_every_retry_max_and_summarised_at_close(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the run directory should be")
    path = blocker / "metrics.jsonl"  # open() fails with ENOTDIR (works as root, unlike chmod)
    clock = FakeClock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = RunLogWriter(path, header={"log_interval": 1}, retry_initial=5.0, retry_max=20.0, clock=clock)
        for step in range(1, 4):
            assert w.write({"type": "step", "step": step}) is False
        blocker.unlink()  # the user moves the file away
        clock.t += 6  # past retry_initial: a lasting error is not retried at the short back-off
        assert w.write({"type": "step", "step": 4}) is False
        clock.t += 15  # past retry_max: checked again, and it heals
        assert w.write({"type": "step", "step": 5}) is True
    ours = [str(c.message) for c in caught if "gradmon" in str(c.message)]
    assert ours == [f"gradmon: cannot open run log {path}: {blocker} is a file, not a directory "
                    "(LiveMonitor(path) takes a run directory, or a file path ending in .jsonl: move that "
                    "file or choose another path); its records are dropped (checked again every 20 s, not "
                    "at every step)"]
    assert "File exists" not in ours[0] and "retrying" not in ours[0]
    assert w.dropped_records == 5  # header + steps 1..4
    with pytest.warns(RuntimeWarning, match=rf"gradmon: 5 records could not be written to {path}: "
                                            rf"{blocker} is a file, not a directory"):
        w.close()
    records = list(read_records(path))
    assert [r["type"] for r in records] == ["event", "step", "end"]
    assert records[0]["kind"] == "io_error" and records[0]["dropped"] == 5
    assert records[1]["step"] == 5 and records[2]["dropped_records"] == 5


def test_writer_transient_error_backs_off_doubling_and_recovers(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / "metrics.jsonl"
    os.symlink("/dev/full", path)  # every write fails with ENOSPC: the disk may free up
    clock = FakeClock()
    with pytest.warns(RuntimeWarning, match="No space left on device; dropping records and retrying"):
        w = RunLogWriter(path, header={}, retry_initial=5.0, clock=clock)
    assert w.write({"type": "step", "step": 1}) is False
    clock.t += 6  # past the first back-off, still full: retried, and the back-off doubles
    assert w.write({"type": "step", "step": 2}) is False
    os.unlink(path)
    clock.t += 6  # within the doubled back-off (10 s): not retried yet
    assert w.write({"type": "step", "step": 3}) is False
    clock.t += 5
    assert w.write({"type": "step", "step": 4}) is True
    with pytest.warns(RuntimeWarning, match="4 records could not be written to .*No space left on device"):
        w.close()
    assert [r.get("kind", r["type"]) for r in read_records(path)] == ["io_error", "step", "end"]


def test_writer_full_disk_then_recovers(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / "metrics.jsonl"
    os.symlink("/dev/full", path)  # every write fails with ENOSPC
    clock = FakeClock()
    with pytest.warns(RuntimeWarning, match="No space left"):
        w = RunLogWriter(path, header={}, retry_initial=0.0, clock=clock)
    w.write({"type": "step", "step": 1})
    assert w.dropped_records == 2
    os.unlink(path)  # space again: a regular file
    assert w.write({"type": "step", "step": 2})
    w.close()
    assert [r.get("kind", r["type"]) for r in read_records(path)] == ["io_error", "step", "end"]


def test_writer_recreates_deleted_directory(tmp_path):
    run = tmp_path / "run"
    path = run / "metrics.jsonl"
    clock = FakeClock()
    w = RunLogWriter(path, header={}, check_interval=1.0, clock=clock)
    w.write({"type": "step", "step": 1})
    shutil.rmtree(run)
    clock.t += 2  # next write checks the path and finds the file gone
    assert w.write({"type": "step", "step": 2})
    w.close()
    # The new file holds what came after the deletion; nothing was dropped.
    assert [r.get("step") for r in read_records(path)] == [2, None]
    assert w.dropped_records == 0


def test_write_after_close_is_an_error(tmp_path):
    w = RunLogWriter(tmp_path / "m.jsonl")
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError):
        w.write({"type": "step", "step": 1})


# -- reader -------------------------------------------------------------------------------------


def test_reader_skips_and_counts_bad_lines_never_takes_partial_tail():
    good = [{"type": "step", "step": 1, "loss": 2.0}, {"type": "event", "kind": "spike", "step": 1}]
    data = (
        encode_record(good[0]).encode()
        + b"garbage\n"
        + b'{"type":"step","step":2,"loss":NaN,}\n'  # not JSON
        + b'{"type":"step","step":"3"}\n'  # wrong field type
        + b"\xff\xfe\n"  # not UTF-8
        + b"[1,2]\n"
        + b"\n"
        + encode_record(good[1]).encode()
        + b'{"type":"step","st'  # being written
    )
    stats = ReadStats()
    assert list(read_records(io.BytesIO(data), stats=stats)) == good
    assert (stats.lines, stats.records, stats.malformed) == (8, 2, 6)
    assert stats.partial_tail_bytes == len(b'{"type":"step","st')
    assert stats.consumed_bytes == len(data) - stats.partial_tail_bytes


def test_reader_huge_line_is_skipped_without_holding_it(tmp_path):
    path = tmp_path / "m.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"type":"step","step":1,"blob":"' + b"x" * (3 * MAX_LINE_BYTES) + b'"}\n')
        f.write(encode_record({"type": "step", "step": 2}).encode())
    stats = ReadStats()
    assert [r["step"] for r in read_records(path, stats=stats)] == [2]
    assert stats.malformed == 1 and stats.partial_tail_bytes == 0


def test_reader_rejects_text_files(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("")
    with open(path) as f, pytest.raises(TypeError):
        list(read_records(f))


_finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
# Text that spells a non-finite number decodes to a float by design (docs/format.md): not generated here.
_text = st.text(max_size=8).filter(lambda s: s not in ("NaN", "Infinity", "-Infinity"))
_value = st.one_of(st.floats(width=32), st.integers(-(2**40), 2**40), _text, st.booleans(), st.none())
_valid_record = st.fixed_dictionaries(
    {"type": st.sampled_from(["step", "event", "eval", "custom"]), "step": st.integers(1, 10**6)},
    optional={"loss": st.floats(width=32), "ts": _finite,
              "extra": st.dictionaries(st.text(max_size=5), _value, max_size=3)},
)


def _invalid_line(draw) -> bytes:
    """A complete line (without its newline) that is certainly not a valid record."""
    kind = draw(st.sampled_from(["garbage", "nan", "type", "prefix", "huge", "scalar", "utf8"]))
    if kind == "garbage":
        return b"#" + draw(st.binary(max_size=40)).replace(b"\n", b"")
    if kind == "nan":  # tokens no writer produces (Python's are NaN, Infinity, -Infinity)
        token = draw(st.sampled_from([b"nan", b"inf", b"+Infinity", b"NAN"]))
        return b'{"type":"step","step":1,"loss":' + token + b"}"
    if kind == "type":
        return draw(st.sampled_from([b'{"type":"step","step":"1"}', b'{"type":"step","step":1.5}',
                                     b'{"type":"step"}', b'{"step":1.5}', b'{"step":true}', b'{"loss":1}',
                                     b'{"type":null,"step":1}', b'{"type":"x","ts":"now"}',
                                     b'{"type":"x","pid":true}']))
    if kind == "prefix":  # a valid line cut short (it has no trailing whitespace, so no prefix parses)
        full = encode_record(draw(_valid_record)).encode()[:-1]
        return full[: draw(st.integers(0, len(full) - 1))]
    if kind == "huge":
        return encode_record({"type": "step", "step": 1, "pad": "y" * 300}).encode()[:-1]
    if kind == "scalar":
        return draw(st.sampled_from([b"1", b'"x"', b"null", b"[]", b"true"]))
    return b'{"type":"step","step":1,"s":"\xc3"}'


_CAP = 200  # max_line_bytes of the property test


@st.composite
def _log_file(draw):
    parts, expected, bad = [], [], 0
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.booleans()):
            record = draw(_valid_record)
            line = encode_record(record).encode()
            if draw(st.booleans()):  # another writer's line: Python's json.dumps (bare NaN), no type
                record = {"type": "step", **{k: v for k, v in record.items() if k != "type"}}
                line = (json.dumps({k: v for k, v in record.items() if k != "type"}) + "\n").encode()
            parts.append(line)
            if len(line) - 1 > _CAP:  # valid, but over the line limit: skipped as malformed
                bad += 1
            else:
                expected.append(record)
        else:
            parts.append(_invalid_line(draw) + b"\n")
            bad += 1
    tail = b""
    if draw(st.booleans()):
        tail = draw(st.one_of(st.just(encode_record({"type": "step", "step": 9}).encode()[:-1]),
                              st.binary(max_size=30).map(lambda b: b.replace(b"\n", b""))))
    return b"".join(parts) + tail, expected, bad, len(tail)


def _same(a, b) -> bool:
    """Record equality with NaN == NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_log_file(), st.integers(1, 64))
def test_reader_property(log, chunk_size):
    data, expected, bad, tail = log
    stats = ReadStats()
    got = list(read_records(io.BytesIO(data), stats=stats, max_line_bytes=_CAP, chunk_size=chunk_size))
    assert len(got) == len(expected) and all(_same(g, e) for g, e in zip(got, expected))
    assert stats.records == len(expected)
    assert stats.malformed == bad
    assert stats.lines == len(expected) + bad
    assert stats.partial_tail_bytes == tail
    assert stats.consumed_bytes == len(data) - tail
