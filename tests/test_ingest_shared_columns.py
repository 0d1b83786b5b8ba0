"""The cold ingest's shared work gives what the general code gives: each key's values taken once
per batch (``parse.KeyColumns``) and shared by the pyramid's open bucket, the alarm rule and the
sidecar's rows (``columns.step_rows``), and the pyramid merging the summaries it was just given
instead of reading them back from its levels."""

from __future__ import annotations

import json
import pickle
import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import lines_of

from gradmon.logformat.values import number
from gradmon.server import pyramid as pyramid_mod
from gradmon.server.columns import MISSING_BITS, step_rows
from gradmon.server.index import RunIndex
from gradmon.server.parse import parse_lines
from gradmon.server.pyramid import Pyramid, Summary
from gradmon.server.steps import StepSeries

_NAMES = ["loss", "grad_norm", "lr", "late", "odd"]


def _value(rng: random.Random, name: str):
    if name == "odd":  # a key whose values are not always numbers
        return rng.choice([1, 2.5, True, None, 2**70])
    huge = [-(2**1100)] if name == "lr" else []  # an integer too big for a float: -inf, marked
    return rng.choice([rng.random(), rng.random(), 3, 2**60 + 1, -1.5, 1e300, *huge])


def _records(rng: random.Random, n: int) -> list[dict]:
    recs = [{"type": "header", "run_id": "r"}]
    for i in range(1, n + 1):
        rec = {"type": "step", "step": i, "ts": 1e9 + i}
        for name in _NAMES:
            if i == 1 and name in ("loss", "lr"):  # (known from the first record on)
                rec[name] = 0.5
            elif (name != "late" or i > n // 2) and rng.random() < 0.9:
                rec[name] = _value(rng, name)
        if rng.random() < 0.02:
            rec["spike"] = True
        recs.append(rec)
        if rng.random() < 0.01:
            recs.append({"type": "event", "kind": "note", "step": i, "message": "m"})
    return recs


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _levels(pyr: Pyramid) -> list:
    out = []
    for lvl in pyr.levels:
        summaries = map(lvl.get, range(lvl.size))
        out.append([(s.lo, s.hi, s.n, s.offset, list(s.fields.items())) for s in summaries])
        out.append(list(lvl.fields))
    pyr.release()
    return out


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32))
def test_rows_from_shared_columns_are_each_record_s_numbers(seed):
    """Batches of random sizes, keys that start late, non-number values, integers too big for a
    float: every row holds ``number(value)`` (``MISSING`` where none) from its key's first number."""
    rng = random.Random(seed)
    pairs = lines_of(_records(rng, rng.randrange(1, 700)))
    known: dict[str, tuple[int, int]] = {}
    seen: set[str] = set()
    got: dict[str, list[int]] = {}
    rows_steps: list[int] = []
    k = 0
    while k < len(pairs):
        n = rng.choice([1, 7, 130, 400])
        parsed = parse_lines(pairs[k:k + n], pairs[k - 1][0] if k else 0)
        rows = step_rows(parsed, known, seen)
        for name, (first, values) in rows.columns.items():
            if name not in known:
                known[name] = (len(known), len(rows_steps) + first)
                got[name] = [MISSING_BITS] * (len(rows_steps) + first)
            got[name] += [_bits(v) for v in values]
        for name in known:
            if name not in rows.columns:
                got[name] += [MISSING_BITS] * len(rows)
        rows_steps += list(rows.steps)
        k += n
    steps = [r for r in (json.loads(line) for _end, line in pairs) if r["type"] == "step"]
    assert rows_steps == [r["step"] for r in steps]
    want: dict[str, list[int]] = {}
    for i, rec in enumerate(steps):
        for name, raw in rec.items():
            if name in ("type", "step") or number(raw) is None or name in want:
                continue
            want[name] = [MISSING_BITS] * i
        for name, col in want.items():
            v = number(rec.get(name))
            col.append(MISSING_BITS if v is None else _bits(v))
    assert got == want


class _Discard(dict):
    """An open bucket's columns that keep nothing: every summary reads its records (the general code)."""

    def __setitem__(self, key, value) -> None:
        pass


def _index(pairs: list[tuple[int, bytes]], sizes: list[int], restart: int) -> RunIndex:
    idx = RunIndex()
    k = 0
    for b, n in enumerate(sizes):
        if k >= len(pairs):
            break
        idx.add_lines(pairs[k:k + n], pairs[k - 1][0] if k else 0)
        k += n
        if b == restart:
            idx = pickle.loads(pickle.dumps(idx))  # (a restored index: no shared columns kept)
    return idx


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32))
def test_an_index_built_from_shared_columns_is_the_one_built_record_by_record(seed):
    """The pyramid (every level, its fields in order), marks, fields and events of an index fed
    batches whose columns are shared, checkpointed and restored mid-way, equal those of the same
    batches indexed by the general code (each summary from its records, each merge from its
    parts read back)."""
    rng = random.Random(seed)
    pairs = lines_of(_records(rng, rng.randrange(1, 1500)))
    sizes = [rng.choice([1, 50, 333, 1000]) for _ in range(len(pairs))]
    restart = rng.randrange(0, 6)
    shared = _index(pairs, sizes, restart)
    init, ordered = StepSeries._init_columns, pyramid_mod._level_ordered

    def general_init(self) -> None:
        init(self)
        self._ob_cols = _Discard()

    try:
        StepSeries._init_columns = general_init
        pyramid_mod._level_ordered = lambda parts, names: False
        general = _index(pairs, sizes, restart)
    finally:
        StepSeries._init_columns, pyramid_mod._level_ordered = init, ordered
    assert _levels(shared.steps.pyramid) == _levels(general.steps.pyramid)
    assert shared.steps.fields == general.steps.fields and shared.steps.count == general.steps.count
    assert repr(shared.steps.marks) == repr(general.steps.marks)
    assert list(shared.event_json) == list(general.event_json)
    a, b = shared.steps.open_summary(), general.steps.open_summary()
    assert (a is None and b is None) or list(a.fields.items()) == list(b.fields.items())


def _summary(rng: random.Random, step: int, offset: int) -> Summary:
    s = Summary(offset)
    names = [n for n in _NAMES if rng.random() < 0.8]
    if rng.random() < 0.3:
        rng.shuffle(names)  # fields in another order than the level's
    for k in range(rng.randrange(1, 4)):
        s.add(step + k, [(n, rng.choice([1.0, -2.0, rng.random()])) for n in names])
    return s


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32), st.booleans())
def test_merging_the_summaries_pushed_gives_the_merge_of_those_read_back(tmp_path_factory, seed, stored):
    """Fields missing from some summaries or in another order, stored levels (a sidecar's files)
    or not, a pickled pyramid restored mid-way: the levels equal those of a pyramid that reads
    every merge's parts back (``Level.get``), as it did before."""
    rng = random.Random(seed)
    summaries = [_summary(rng, b * 10, b * 100) for b in range(rng.randrange(1, 400))]
    restart = rng.randrange(len(summaries) + 1)
    built = []
    for read_back in (False, True):
        pyr = Pyramid()
        directory = str(tmp_path_factory.mktemp("lvl"))
        if stored:
            pyr.attach(directory)
        ordered = pyramid_mod._level_ordered
        if read_back:
            pyramid_mod._level_ordered = lambda parts, names: False
        try:
            for b, s in enumerate(summaries):
                if b == restart:
                    pyr.flush()
                    pyr = pickle.loads(pickle.dumps(pyr))
                    if stored:
                        pyr.attach(directory)
                pyr.push(pickle.loads(pickle.dumps(s)))  # (each pyramid its own copy)
                if stored and b % 7 == 0:
                    pyr.flush()
        finally:
            pyramid_mod._level_ordered = ordered
        built.append(_levels(pyr))
    assert built[0] == built[1]
