"""Pure record builders behind LiveMonitor (gradmon.monitor.records): no MindSpore, no I/O."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradmon.monitor.records import (
    BadStepCounter,
    EpochTrack,
    abort_vote,
    classify_step,
    eval_metrics,
    events_for_step,
    history_rows_to_steps,
    interval_timing,
    is_overflow_step,
    resumed_epoch_offset,
    skip_reason,
    skipped_mask,
    step_records,
)

FIELDS = ("loss", "grad_norm", "clipped", "skipped", "nonfinite")


def rows(*values):
    return np.array(values, dtype=np.float64).reshape(-1, len(FIELDS))


# -- history rows ---------------------------------------------------------------------------------


def test_history_rows_map_to_global_steps():
    snap = rows([1.0, 2.0, 0, 0, 0], [1.5, 3.0, 1, 0, 0], [math.nan, math.inf, 0, 1, 1])
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=3, current_step=3, after_step=0)
    assert lost == 0
    assert [s for s, _ in items] == [1, 2, 3]
    assert items[0][1] == {"loss": 1.0, "grad_norm": 2.0}  # zero flags left out
    assert items[1][1]["clipped"] is True
    last = items[2][1]
    assert math.isnan(last["loss"]) and last["skipped"] is True and last["nonfinite"] is True


def test_history_rows_spike_codes_give_the_reason():
    """The ring's spike column: 1 the norm tests, 2 the loss test, 3 the learning-rate test."""
    fields = ("loss", "spike")
    snap = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0], [1.0, 0.0]])
    items, _ = history_rows_to_steps(fields, snap, total_steps=4, current_step=4, after_step=0)
    assert [(f.get("spike"), f.get("spike_reason")) for _, f in items] == [
        (True, None), (True, "loss"), (True, "lr"), (None, None)]
    events = events_for_step({"step": 3, **items[2][1], "lr": 0.1}, ts=0.0)
    event = next(e for e in events if e["kind"] == "spike")
    assert event["spike_reason"] == "lr" and event["lr"] == 0.1
    assert event["message"].startswith("learning-rate spike")


def test_history_rows_with_another_numbering_and_already_written():
    # The cell counts 3 steps; the caller numbers the last one 103 (initial_step=100).
    snap = rows([1, 1, 0, 0, 0], [2, 2, 0, 0, 0], [3, 3, 0, 0, 0])
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=3, current_step=103, after_step=101)
    assert [(s, f["loss"]) for s, f in items] == [(102, 2.0), (103, 3.0)] and lost == 0


def test_history_rows_after_a_restored_checkpoint():
    # Counters restored at 20 (the ring holds steps 19 and 20 of the old run), 2 new steps since.
    snap = rows([19, 1, 0, 0, 0], [20, 1, 0, 0, 0], [21, 1, 0, 0, 0], [22, 1, 0, 0, 0])
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=22, current_step=22, after_step=20)
    assert [(s, f["loss"]) for s, f in items] == [(21, 21.0), (22, 22.0)] and lost == 0


def test_history_ring_overflow_counts_lost_steps():
    snap = rows([7, 7, 0, 0, 0], [8, 8, 0, 0, 0])  # ring of 2, steps 7 and 8
    items, lost = history_rows_to_steps(FIELDS, snap, total_steps=8, current_step=8, after_step=4)
    assert [s for s, _ in items] == [7, 8] and lost == 2
    items, lost = history_rows_to_steps(FIELDS, rows(), total_steps=0, current_step=0, after_step=0)
    assert items == [] and lost == 0


# -- host values of an interval ------------------------------------------------------------------


def test_step_records_align_lr_and_data_time_per_step():
    items = [(4, {"loss": 1.0}), (5, {"loss": 2.0}), (6, {"loss": 3.0})]
    out = step_records(items, first=4, last=6, ts=9.0, epoch_at=lambda s: 1 if s < 6 else 2,
                       lrs=[0.1, 0.2, None], data_times=[0.01, 0.02, 0.03], timing={"step_time": 0.5})
    assert [(r["step"], r["epoch"], r.get("lr"), r["data_time"]) for r in out] == [
        (4, 1, 0.1, 0.01), (5, 1, 0.2, 0.02), (6, 2, None, 0.03)]
    assert all(r["type"] == "step" and r["ts"] == 9.0 and r["step_time"] == 0.5 for r in out)
    assert out[0]["loss"] == 1.0 and "lr" not in out[2]  # an unknown rate is left out


def test_step_records_sink_mode_data_time_belongs_to_the_last_step():
    # One callback for a sink of 4 steps: one data time, for the sink's last step.
    items = [(s, {}) for s in range(5, 9)]
    out = step_records(items, first=5, last=8, ts=0.0, epoch_at=lambda s: 1, data_times=[0.3])
    assert [r.get("data_time") for r in out] == [None, None, None, 0.3]


def test_step_records_of_a_plain_cell_log_step():
    # A plain cell: only the log step is read; its rate is the last of the interval's.
    out = step_records([(6, {"loss": 1.0})], first=4, last=6, ts=0.0, epoch_at=lambda s: 3,
                       lrs=[0.1, 0.2, 0.3], data_times=[0.1, 0.2, 0.3])
    assert [(r["step"], r["lr"], r["data_time"], r["epoch"]) for r in out] == [(6, 0.3, 0.3, 3)]


def test_skipped_mask_and_interval_timing():
    items = [(3, {"skipped": True}), (5, {}), (9, {"skipped": True})]  # 9 is outside 3..5
    assert skipped_mask(items, 3, 3) == [True, False, False]
    assert interval_timing(0.5, 64) == {"step_time": 0.5, "throughput": 128.0}
    assert interval_timing(0.5, None) == {"step_time": 0.5, "steps_per_sec": 2.0}
    assert interval_timing(0.0, 64) == {"step_time": 0.0}


def test_epoch_track_is_exact_and_never_goes_back():
    track = EpochTrack(1)
    track.note(1, 1)
    track.note(2, 13)  # the loop reports epoch 2 from step 13 on (12-step epochs)
    track.note(2, 14)
    assert [track.epoch_at(s) for s in (1, 12, 13, 24)] == [1, 1, 2, 2]
    assert track.note(1, 15) == 2  # a report that goes back is held at the current epoch
    track.note(3, 25)
    track.forget_through(20)
    assert [track.epoch_at(s) for s in (21, 24, 25)] == [2, 2, 3]


def test_epoch_track_in_sink_mode():
    # One callback per sink of 4 steps; the loop's epoch changes with the sink that starts at step 9.
    track = EpochTrack()
    for last, epoch in ((4, 1), (8, 1), (12, 2)):
        track.note(epoch, last - 3)
    assert [track.epoch_at(s) for s in range(1, 13)] == [1] * 8 + [2] * 4


def test_resumed_epoch_offset():
    assert resumed_epoch_offset(20, 10, 1) == 2  # restored after 2 epochs, Model counts from 1 again
    assert resumed_epoch_offset(25, 10, 1) == 2  # mid-epoch: the 3rd epoch goes on
    assert resumed_epoch_offset(20, 10, 3) == 0  # Model.train(initial_epoch=2) counts them already
    assert resumed_epoch_offset(20, None, 1) == 0 and resumed_epoch_offset(0, 10, 1) == 0


def test_eval_metrics():
    assert eval_metrics({"accuracy": 0.5, "eval_loss": 9.0}, [1.0, 2.0]) == {"accuracy": 0.5, "loss": 1.5}
    assert eval_metrics({"eval_loss": 9.0}, []) == {"last_batch_loss": 9.0}
    assert eval_metrics({"loss": 3.0, "eval_loss": 9.0}, [1.0]) == {"loss": 3.0}


# -- what a step was ---------------------------------------------------------------------------------


OVERFLOW = {"step": 4, "loss": 2.3, "grad_norm": math.inf, "skipped": True, "nonfinite": True,
            "loss_scale": 2.0**24}


def test_an_overflow_is_a_skip_not_a_nonfinite_step():
    assert is_overflow_step(OVERFLOW) and skip_reason(OVERFLOW) == "overflow"
    record = classify_step(dict(OVERFLOW))
    assert record["skip_reason"] == "overflow" and "nonfinite" not in record
    assert record["grad_norm"] == math.inf  # as measured
    (ev,) = events_for_step(record, ts=1.0)
    assert (ev["kind"], ev["reason"], ev["loss_scale"]) == ("skip", "overflow", 2.0**24)
    assert ev["grad_norm"] == math.inf
    assert ev["message"] == "update skipped: loss-scale overflow at scale 1.67772e+07"
    # MindSpore's (loss, overflow, scale) outputs: no norm.
    assert skip_reason({"loss": 1.0, "skipped": True, "loss_scale": 1024.0}) == "overflow"


def test_what_is_not_an_overflow():
    assert not is_overflow_step({**OVERFLOW, "loss": math.nan})  # a non-finite loss is broken, scale or not
    assert not is_overflow_step({**OVERFLOW, "grad_norm": 3.0})  # a finite norm: skipped for another reason
    assert not is_overflow_step({k: v for k, v in OVERFLOW.items() if k != "loss_scale"})  # no loss scale
    assert not is_overflow_step({**OVERFLOW, "skipped": False})  # the update ran
    assert skip_reason({**OVERFLOW, "loss": math.nan}) == "nonfinite"
    assert skip_reason({"loss": 1.0, "grad_norm": 9.0, "skipped": True, "spike": True}) == "spike"
    assert skip_reason({"loss": 1.0, "skipped": True}) == "other" and skip_reason({"loss": 1.0}) is None


def test_events_for_step():
    assert events_for_step({"type": "step", "step": 1, "loss": 1.0, "grad_norm": 2.0}) == []
    (ev,) = events_for_step({"step": 3, "loss": math.nan, "grad_norm": math.inf, "skipped": True}, ts=5.0)
    assert ev["kind"] == "nonfinite" and ev["step"] == 3 and ev["ts"] == 5.0
    assert ev["message"] == "non-finite gradient norm; update skipped"
    events = events_for_step({"step": 5, "loss": 1.0, "grad_norm": 9.0, "spike": True, "skipped": True,
                              "zscore": 7.5})
    assert [(e["kind"], e.get("reason")) for e in events] == [("skip", "spike"), ("spike", None)]
    (spike,) = events_for_step({"step": 6, "grad_norm": 9.0, "spike": True, "zscore": 7.5})
    assert spike["zscore"] == 7.5 and "z = 7.5" in spike["message"]


@pytest.mark.parametrize(("record", "floor", "vote"), [
    ({"loss": 1.0, "grad_norm": 1.0}, 1.0, False),  # healthy: the count starts again
    ({"loss": math.nan}, 1.0, True),
    ({"loss": 1.0, "nonfinite": True}, 1.0, True),
    ({"loss": 1.0, "grad_norm": 5.0, "skipped": True, "spike": True}, 1.0, True),  # the spike rule
    (OVERFLOW, 1.0, None),  # a dynamic scale settling: neither
    ({**OVERFLOW, "loss_scale": 1.0}, 1.0, True),  # overflowing at the minimum scale
    ({**OVERFLOW, "loss_scale": 1024.0}, math.inf, True),  # a fixed scale: every overflow counts
    ({**OVERFLOW, "loss": math.nan}, 1.0, True),  # a non-finite loss always counts
])
def test_abort_vote(record, floor, vote):
    assert abort_vote(record, floor) is vote


def test_bad_step_counter():
    counter = BadStepCounter(3)
    assert [counter.update(b) for b in (True, True, False, True, True, True, True)] == [
        False, False, False, False, False, True, True]
    assert not any(BadStepCounter(None).update(True) for _ in range(10))
    counter = BadStepCounter(2)  # a neutral vote neither counts nor resets
    assert [counter.update(b) for b in (True, None, None, True)] == [False, False, False, True]


def test_lr_step_indices():
    from gradmon.monitor.lr import step_indices

    assert step_indices(5, [False] * 3) == [2, 3, 4]
    assert step_indices(4, [False, True, False]) == [2, 3, 3]
    assert step_indices(4, [False, False, True]) == [2, 3, 4]
    assert step_indices(1, [False, False, False]) == [0, 0, 0]  # never negative
