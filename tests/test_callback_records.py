"""Pure record builders behind LiveMonitor (gradmon.records)."""

from __future__ import annotations

import math

import numpy as np

from gradmon.records import BadStepCounter, epoch_of, events_for_step, history_rows_to_steps

FIELDS = ("loss", "grad_norm", "clipped", "skipped", "nonfinite")


def rows(*values):
    return np.array(values, dtype=np.float64).reshape(-1, len(FIELDS))


def test_history_rows_map_to_global_steps():
    snap = rows([1.0, 2.0, 0, 0, 0], [1.5, 3.0, 1, 0, 0], [math.nan, math.inf, 0, 1, 1])
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=3, current_step=3, after_step=0)
    assert lost == 0
    assert [s for s, _ in items] == [1, 2, 3]
    assert items[0][1] == {"loss": 1.0, "grad_norm": 2.0}  # zero flags left out
    assert items[1][1]["clipped"] is True
    last = items[2][1]
    assert math.isnan(last["loss"]) and last["skipped"] is True and last["nonfinite"] is True


def test_history_rows_after_resume_and_already_written():
    # The cell counts from its construction (3 steps); the run resumed at global step 100.
    snap = rows([1, 1, 0, 0, 0], [2, 2, 0, 0, 0], [3, 3, 0, 0, 0])
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=3, current_step=103, after_step=101)
    assert [(s, f["loss"]) for s, f in items] == [(102, 2.0), (103, 3.0)] and lost == 0


def test_history_ring_overflow_counts_lost_steps():
    snap = rows([7, 7, 0, 0, 0], [8, 8, 0, 0, 0])  # ring of 2, steps 7 and 8
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=8, current_step=8, after_step=4)
    assert [s for s, _ in items] == [7, 8] and lost == 2
    items, lost = history_rows_to_steps(FIELDS, rows(), total_steps=0, current_step=0, after_step=0)
    assert items == [] and lost == 0


def test_epoch_of():
    assert epoch_of(8, 8, 2, 4) == 2 and epoch_of(4, 8, 2, 4) == 1 and epoch_of(5, 8, 2, 4) == 2
    assert epoch_of(3, 8, 2, None) == 2


def test_events_for_step():
    assert events_for_step({"type": "step", "step": 1, "loss": 1.0, "grad_norm": 2.0}) == []
    (ev,) = events_for_step({"step": 3, "loss": math.nan, "grad_norm": math.inf, "skipped": True}, ts=5.0)
    assert ev["kind"] == "nonfinite" and ev["step"] == 3 and ev["ts"] == 5.0
    assert ev["message"] == "non-finite gradient norm; update skipped"
    (ev,) = events_for_step({"step": 4, "loss": 1.0, "skipped": True, "loss_scale": 1024.0})
    assert ev["kind"] == "skip" and "loss-scale overflow" in ev["message"]
    kinds = [e["kind"] for e in events_for_step({"step": 5, "loss": 1.0, "grad_norm": 9.0, "spike": True,
                                                 "skipped": True, "zscore": 7.5})]
    assert kinds == ["skip", "spike"]
    (spike,) = events_for_step({"step": 6, "grad_norm": 9.0, "spike": True, "zscore": 7.5})
    assert spike["zscore"] == 7.5 and "z = 7.5" in spike["message"]


def test_bad_step_counter():
    counter = BadStepCounter(3)
    assert [counter.update(b) for b in (True, True, False, True, True, True, True)] == [
        False, False, False, False, False, True, True]
    assert not any(BadStepCounter(None).update(True) for _ in range(10))


def test_lr_step_indices():
    from gradmon.lr import step_indices

    assert step_indices(5, [False] * 3) == [2, 3, 4]
    assert step_indices(4, [False, True, False]) == [2, 3, 3]
    assert step_indices(4, [False, False, True]) == [2, 3, 4]
    assert step_indices(1, [False, False, False]) == [0, 0, 0]  # never negative
