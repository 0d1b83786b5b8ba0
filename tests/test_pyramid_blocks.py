"""``Pyramid.push_block`` (a slice's whole buckets appended column-wise, merged in C) builds the
pyramid that :meth:`Pyramid.push` of each summary builds: every level's summaries, their fields
and the fields' order, with levels kept in a sidecar's files and flushed at any point between
pushes (a group of summaries to merge that began before a flush is read back from the files)."""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradmon.server import native, pyramid
from gradmon.server.pyramid import FANOUT, Block, Pyramid, Summary, _block_of

pytestmark = pytest.mark.skipif(native.scanner() is None, reason="needs the compiled scanner")

_NAMES = ("loss", "grad_norm", "lr", "ts")


def _summary(rnd: random.Random, step: int, offset: int, names: tuple[str, ...]) -> Summary:
    s = Summary(offset)
    s.lo, s.hi, s.n = step, step + 9, 10
    for name in names:
        lo = rnd.choice([-0.0, 0.0, 1.0, rnd.uniform(-5, 5)])
        hi = max(lo, rnd.choice([lo, rnd.uniform(-5, 5)]))
        s.fields[name] = [rnd.randint(1, 10), step, rnd.uniform(lo, hi), step + 9, rnd.uniform(lo, hi),
                          step + rnd.randint(0, 9), lo, step + rnd.randint(0, 9), hi]
    return s


def _levels(p: Pyramid) -> list:
    return [(k, lvl.size, list(lvl.fields),
             [(s.lo, s.hi, s.n, s.offset, list(s.fields.items())) for s in map(lvl.get, range(lvl.size))])
            for k, lvl in enumerate(p.levels)]


def _build(ops: list, tmp_path, use_blocks: bool) -> Pyramid:
    p = Pyramid()
    directory = tmp_path / ("blocks" if use_blocks else "one_by_one")
    directory.mkdir()
    p.attach(str(directory))
    for op in ops:
        if op[0] == "flush":
            p.flush(op[1])
            p.release()
        elif use_blocks:
            p.push_block(op[1])
        else:
            for i in range(len(op[1])):
                p.push(op[1].summary(i))
    return p


def _ops(seed: int, count: int, flush_every: float, field_churn: float) -> list:
    """Blocks of 1-40 base summaries (fields mostly all of ``_NAMES``, some now and then missing or
    new), with flushes of the stored levels' tails between them."""
    rnd = random.Random(seed)
    ops: list = []
    step = offset = 0
    names = list(_NAMES[:2])
    for _ in range(count):
        if rnd.random() < field_churn and len(names) < len(_NAMES):
            names.append(_NAMES[len(names)])
        block = []
        for _ in range(rnd.randint(1, 40)):
            have = tuple(n for n in names if rnd.random() > field_churn / 4)
            block.append(_summary(rnd, step, offset, have))
            step += 10
            offset += 1000
        order = [n for n in _NAMES if any(n in s.fields for s in block)]
        ops.append(("push", _block_of(block, order)))
        if rnd.random() < flush_every:
            ops.append(("flush", rnd.choice([1, 2, FANOUT, 64])))
    return ops


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 60), flush_every=st.sampled_from([0.0, 0.3, 1.0]),
       field_churn=st.sampled_from([0.0, 0.05, 0.3]))
def test_a_pushed_block_builds_the_levels_pushing_each_summary_builds(tmp_path_factory, seed, count,
                                                                        flush_every, field_churn):
    tmp = tmp_path_factory.mktemp("pyr")
    ops = _ops(seed, count, flush_every, field_churn)
    blocks, one_by_one = _build(ops, tmp, True), _build(ops, tmp, False)
    assert _levels(blocks) == _levels(one_by_one)
    # (and summaries pushed one by one after blocks merge with them as they would have)
    for p in (blocks, one_by_one):
        rnd = random.Random(seed)
        for i in range(2 * FANOUT + 1):
            p.push(_summary(rnd, 10**9 + 10 * i, 10**9 + i, _NAMES))
    assert _levels(blocks) == _levels(one_by_one)


def test_long_runs_of_blocks_take_the_column_wise_path_and_read_back_flushed_groups(tmp_path):
    """The property above must hold where it matters: most blocks taken column-wise, groups
    merged in C, and groups that straddle a flush read back from the level files."""
    ops = _ops(7, 400, 0.5, 0.0)
    taken, merged, straddled = [], [0], [0]
    takes, merge_tail, block_of = Pyramid._takes, pyramid.Level.merge_tail, pyramid._block_of

    def spy_takes(self, block):
        taken.append(takes(self, block))
        return taken[-1]

    def spy_merge(self, *args):
        merged[0] += 1
        return merge_tail(self, *args)

    def spy_block_of(*args):
        straddled[0] += 1
        return block_of(*args)

    with mock.patch.object(Pyramid, "_takes", spy_takes), \
            mock.patch.object(pyramid.Level, "merge_tail", spy_merge), \
            mock.patch.object(pyramid, "_block_of", spy_block_of):
        blocks = _build(ops, tmp_path, True)
    assert _levels(blocks) == _levels(_build(ops, tmp_path, False))
    assert sum(taken) > 0.9 * len(taken) and merged[0] > 100 and straddled[0] > 0
    assert len(blocks.levels) >= 5 and blocks.levels[0].stored > 0


def test_a_block_with_a_field_the_level_lacks_is_pushed_one_by_one():
    p = Pyramid()
    rnd = random.Random(1)
    p.push_block(_block_of([_summary(rnd, 10 * i, i, ("loss",)) for i in range(2 * FANOUT)], ["loss"]))
    assert not p._takes(_block_of([_summary(rnd, 100, 8, ("loss", "lr"))], ["loss", "lr"]))
    assert p._takes(_block_of([_summary(rnd, 100, 8, ("loss",))], ["loss"]))
    # (a block whose merges would open a new level is pushed one by one too: push opens it)
    big = [_summary(rnd, 100 + 10 * i, 8 + i, ("loss",)) for i in range(3 * FANOUT**2)]
    assert not p._takes(_block_of(big, ["loss"]))


def test_merge_groups_is_merge_summaries_of_each_group():
    rnd = random.Random(3)
    parts = [_summary(rnd, 10 * i, i, tuple(n for n in _NAMES if rnd.random() < 0.7))
             for i in range(4 * FANOUT + 2)]
    block = _block_of(parts, _NAMES)
    columns = [list(block.fields[n]) for n in _NAMES]
    base, fields = native.scanner().merge_groups(list(block.base), columns, 2, 4, FANOUT)
    got = Block(base, dict(zip(_NAMES, fields)))
    for g in range(4):
        want = pyramid.merge_summaries(parts[2 + g * FANOUT: 2 + (g + 1) * FANOUT])
        s = got.summary(g)
        assert (s.lo, s.hi, s.n, s.offset) == (want.lo, want.hi, want.n, want.offset)
        assert s.fields == want.fields  # (values; the order is the block's)
    with pytest.raises(ValueError):
        native.scanner().merge_groups(list(block.base), columns, 2, 5, FANOUT)
