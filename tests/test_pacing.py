"""The size of a backlog slice while a page is connected (gradmon/server/pacing.py)."""

from __future__ import annotations

import pytest

from gradmon.server.pacing import SlicePacer

KIB = 1 << 10


def test_an_untimed_pacer_reads_its_smallest_slice():
    assert SlicePacer(32 * KIB, 512 * KIB).size() == 32 * KIB


def test_a_slice_takes_about_the_budget_at_the_pace_measured():
    pacer = SlicePacer(32 * KIB, 512 * KIB, budget_s=0.001)
    for _ in range(3):
        pacer.note(64 * KIB, 0.0004)  # 64 KiB in 0.4 ms: 160 KiB in 1 ms
    assert pacer.size() == pytest.approx(160 * KIB, abs=1)


def test_the_size_stays_within_its_bounds():
    fast = SlicePacer(32 * KIB, 512 * KIB, budget_s=0.001)
    fast.note(64 * KIB, 1e-6)
    assert fast.size() == 512 * KIB
    slow = SlicePacer(32 * KIB, 512 * KIB, budget_s=0.001)
    slow.note(64 * KIB, 0.5)
    assert slow.size() == 32 * KIB


def test_a_slow_slice_shrinks_the_next_at_once_and_fast_ones_grow_it_back():
    pacer = SlicePacer(16 * KIB, 1024 * KIB, budget_s=0.001, weight=0.25)
    for _ in range(20):
        pacer.note(100 * KIB, 0.0005)
    steady = pacer.size()
    assert steady == pytest.approx(200 * KIB, abs=1)
    pacer.note(100 * KIB, 0.005)  # ten times slower (a checkpoint, another process on the core)
    after_slow = pacer.size()
    # seconds per byte: 1 + 0.25 * 9 = 3.25 times the steady pace's
    assert after_slow == pytest.approx(steady / 3.25, abs=1)
    sizes = []
    for _ in range(30):
        pacer.note(100 * KIB, 0.0005)
        sizes.append(pacer.size())
    assert sizes == sorted(sizes) and sizes[0] > after_slow
    assert sizes[-1] == pytest.approx(steady, rel=1e-3)


def test_a_live_tail_s_few_lines_and_empty_polls_are_not_timed():
    pacer = SlicePacer(32 * KIB, 512 * KIB)
    pacer.note(300, 0.002)  # a few live lines: the poll's own time, not its bytes'
    pacer.note(0, 0.001)
    pacer.note(64 * KIB, 0.0)
    assert pacer.seconds_per_byte is None and pacer.size() == 32 * KIB
    pacer.note(16 * KIB, 0.0001)  # (half the smallest slice: a slice)
    assert pacer.seconds_per_byte == pytest.approx(0.0001 / (16 * KIB))


@pytest.mark.parametrize("kwargs", [dict(low=0, high=1), dict(low=2, high=1), dict(low=1, high=2, budget_s=0),
                                    dict(low=1, high=2, weight=0), dict(low=1, high=2, weight=1.5)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        SlicePacer(**kwargs)
