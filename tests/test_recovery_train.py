"""Automatic recovery in real MindSpore training: snapshots restore to the bit, a divergence is
rolled back (Model.train and a hand-written loop), the log's rollback segment reads back right through
``gradmon serve``, and the cap ends in an abort with its message."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from mindspore import Tensor, nn
from mindspore import dataset as ds
from mindspore.train import Model
from server_helpers import get_json, wait_for
from train_util import BATCH, IN_DIM, MaskedLoss, mlp, records, segments, use_graph_mode

from examples.models import with_loss
from gradmon.monitor.callback import LiveMonitor
from gradmon.monitor.recovery import LossRise
from gradmon.server import start_server


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


def stream(steps: int, bad=()) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` batches; the batches in ``bad`` (1-based) are scaled to overflow: inf loss, NaN grads."""
    rng = np.random.default_rng(0)
    x = rng.random((steps * BATCH, IN_DIM), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype(np.int32)
    for b in bad:
        x[(b - 1) * BATCH:b * BATCH] *= np.float32(1e38)
    return x, y


def dataset(steps: int, bad=()):
    x, y = stream(steps, bad)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def undefended_cell():
    """No defence: a non-finite update goes in and the weights stay NaN."""
    net = mlp()
    opt = nn.Adam(net.trainable_params(), 1e-3)
    return net, MonitoredTrainStep(with_loss(net), opt, skip_nonfinite=False, history_size=32)


def finite(net) -> bool:
    return all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def state(cell) -> dict[str, np.ndarray]:
    return {n: p.asnumpy().copy() for n, p in cell.parameters_and_names()}


@pytest.mark.parametrize("loss_scale", [False, True])
def test_a_restored_snapshot_is_bit_identical_and_replays_the_same_steps(loss_scale):
    # Clipping with a skip possible: the optimizer runs inside a switch branch, the case where
    # set_data (a new buffer) would be ignored by the compiled update. With a dynamic loss scale
    # (scale_window=2: it moves every other step) the scale and its update cell's counters come back too.
    net = mlp()
    opt = nn.Adam(net.trainable_params(), 1e-2)
    if loss_scale:
        manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**10, scale_factor=2, scale_window=2)
        cell = MonitoredTrainStepWithLossScale(with_loss(net), opt, manager, max_norm=0.5, history_size=8)
    else:
        cell = MonitoredTrainStep(with_loss(net), opt, max_norm=0.5, spike_mode="clip", history_size=8)
    x, y = stream(8)
    batch = [(Tensor(x[i * BATCH:(i + 1) * BATCH]), Tensor(y[i * BATCH:(i + 1) * BATCH])) for i in range(8)]
    for b in batch[:2]:
        cell(*b)
    snap = cell.gradmon_snapshot()
    saved = state(cell)
    assert snap.step == 2 and set(snap.arrays) == set(saved)
    assert any(n.startswith("optimizer.moment") for n in saved) and "counts" in saved
    if loss_scale:
        assert "scale_sense" in saved and any(n.startswith("loss_scaling_manager.") for n in saved)
    losses = [cell(*b)[0].asnumpy() for b in batch[2:5]]
    after = state(cell)
    if loss_scale:  # the scale moved after the snapshot: the restore has something to undo
        assert not np.array_equal(after["scale_sense"], saved["scale_sense"])
    for b in batch[5:]:
        cell(*b)
    for _ in range(2):  # a snapshot can be restored again: restoring never hands it to training
        cell.gradmon_restore(snap)
        now = state(cell)
        assert all(np.array_equal(now[n], saved[n]) and now[n].dtype == saved[n].dtype for n in saved)
        replay = [cell(*b)[0].asnumpy() for b in batch[2:5]]
        assert [r.tobytes() for r in replay] == [r.tobytes() for r in losses]
        again = state(cell)
        assert all(np.array_equal(again[n], after[n]) for n in after)


def test_divergence_dies_without_recovery(tmp_path):
    net, cell = undefended_cell()
    monitor = LiveMonitor(tmp_path / "metrics.jsonl")
    Model(cell).train(1, dataset(40, bad=[25]), callbacks=[monitor], dataset_sink_mode=False)
    assert not finite(net)
    assert math.isnan(records(tmp_path / "metrics.jsonl", "step")[-1]["loss"])


def test_divergence_is_rolled_back_under_model_train_and_reads_back(tmp_path):
    root = tmp_path / "logs"
    log = root / "exp" / "metrics.jsonl"
    net, cell = undefended_cell()
    events = []
    monitor = LiveMonitor(log, recovery={"every": 10, "keep": 2, "skip_batches": 2}, on_event=events.append)
    Model(cell).train(1, dataset(40, bad=[25]), callbacks=[monitor], dataset_sink_mode=False)
    assert finite(net) and monitor.rollbacks == 1 and not monitor.should_stop

    first, second = segments(log)
    assert first[-1]["type"] == "end" and first[-1]["status"] == "rolled_back" and first[-1]["steps"] == 25
    header = second[0]
    assert (header["initial_step"], header["initial_step_from"]) == (20, "rollback")
    assert first[0]["recovery"] == header["recovery"] and header["recovery"]["every"] == 10
    rollback = second[1]
    assert rollback["kind"] == "rollback" and rollback["step"] == rollback["restored_step"] == 20
    assert (rollback["from_step"], rollback["incident_step"], rollback["reason"], rollback["detail"]) == (
        25, 25, "alarm", "nonfinite")
    assert rollback["batches_skipped"] == 5 + 2 and rollback in events
    # 40 batches: 1-25, then 5 abandoned + 2 undone: the rollback segment trains steps 21-33.
    steps2 = [r["step"] for r in second if r["type"] == "step"]
    assert steps2 == list(range(21, 34)) and second[-1]["status"] == "finished"
    assert all(math.isfinite(r["loss"]) for r in second if r["type"] == "step")

    handle = start_server(root, port=0, discover_interval=0.1)
    try:
        wait_for(lambda: get_json(handle.port, "/api/runs/exp")[1].get("last_step") == 33, timeout=30)
        status, hist = get_json(handle.port, "/api/runs/exp/history")
    finally:
        handle.stop()
    assert status == 200
    loss = hist["series"]["loss"]
    assert loss["step"] == list(range(1, 34))  # one value per step: 21-25 of the first segment replaced
    by_step = dict(zip(loss["step"], loss["value"]))
    assert [by_step[s] for s in range(21, 34)] == [r["loss"] for r in second if r["type"] == "step"]
    assert all(math.isfinite(v) for v in loss["value"])
    assert any(e.get("kind") == "rollback" and e["step"] == 20 for e in hist["events"])
    assert len(hist["headers"]) == 2


def test_hand_written_loop_rolls_back(tmp_path):
    net, cell = undefended_cell()
    x, y = stream(30, bad=[15])
    monitor = LiveMonitor(tmp_path / "metrics.jsonl", recovery={"every": 5, "skip_batches": 0}).attach(cell)
    with monitor:
        for i in range(30):
            out = cell(Tensor(x[i * BATCH:(i + 1) * BATCH]), Tensor(y[i * BATCH:(i + 1) * BATCH]))
            monitor.after_step(out)
    assert finite(net) and monitor.rollbacks == 1 and monitor.step == 25  # 30 batches, 11-15 abandoned
    _, second = segments(tmp_path / "metrics.jsonl")
    assert second[0]["initial_step"] == 10 and next(r["step"] for r in second if r["type"] == "step") == 11


@pytest.mark.parametrize("masked, steps, loss_rise", [(25, 45, False), (50, 130, True)])
def test_masked_batches_at_the_start_neither_alarm_nor_roll_back(tmp_path, masked, steps, loss_rise):
    # 25 steps with no gradient and a loss of 0: the alarm rule took the first real loss for a
    # loss_spike, and recovery rolled the run back for it, five times (the snapshot after step 25
    # held the same rule), then gave up and aborted the run. 50 of them: LossRise read the real
    # losses as a 2x rise once its window held as many of them as zeros (its median half theirs).
    rule = {"rule": LossRise()} if loss_rise else {}
    net = mlp()
    cell = MonitoredTrainStep(MaskedLoss(with_loss(net)), nn.Adam(net.trainable_params(), 1e-3),
                              history_size=32)
    x, y = stream(steps)
    log = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(log, log_interval=1, recovery={"every": 5, "skip_batches": 0, **rule}).attach(cell)
    with monitor:
        for i in range(steps):
            batch = slice(i * BATCH, (i + 1) * BATCH)
            keep = Tensor(np.float32(0.0 if i < masked else 1.0))
            monitor.after_step(cell(Tensor(x[batch]), Tensor(y[batch]), keep))
    assert monitor.rollbacks == 0 and not monitor.should_stop and finite(net)
    [segment] = segments(log)
    assert [r for r in segment if r["type"] == "event" and r["kind"] in ("alarm", "rollback")] == []
    logged = [r for r in segment if r["type"] == "step"]
    assert [r["step"] for r in logged] == list(range(1, steps + 1))
    assert all(r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in logged[:masked])
    assert all(r["loss"] > 1.0 and r["grad_norm"] > 0.01 for r in logged[masked:])


def test_the_cap_ends_in_an_abort_with_its_message(tmp_path):
    net, cell = undefended_cell()
    log = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(log, recovery={"every": 10, "skip_batches": 1, "max_rollbacks": 2})
    Model(cell).train(1, dataset(60, bad=range(25, 61)), callbacks=[monitor], dataset_sink_mode=False)
    assert monitor.should_stop and monitor.rollbacks == 2 and finite(net)
    segs = segments(log)
    assert [s[-1]["status"] for s in segs] == ["rolled_back", "rolled_back", "aborted"]
    abort = [r for r in segs[-1] if r.get("kind") == "abort"]
    assert len(abort) == 1 and abort[0]["recovery"] is True
    assert "recovery gave up" in abort[0]["message"] and "max_rollbacks=2" in abort[0]["message"]


def test_recovery_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="below abort_after"):
        LiveMonitor(tmp_path / "m.jsonl", abort_after=3, recovery={"skipped_steps": 5})
    monitor = LiveMonitor(tmp_path / "m.jsonl", recovery=True)
    with pytest.raises(ValueError, match="recovery needs the step cell"):
        monitor.log(1, loss=1.0)
    ms.set_context(mode=ms.GRAPH_MODE)


def test_dataset_sink_mode_on_cpu_rolls_back_as_without(tmp_path):
    # CPU cannot sink: MindSpore still calls back after every step, so recovery acts per step.
    net, cell = undefended_cell()
    monitor = LiveMonitor(tmp_path / "metrics.jsonl", recovery={"every": 10, "skip_batches": 2})
    Model(cell).train(1, dataset(40, bad=[25]), callbacks=[monitor], dataset_sink_mode=True, sink_size=40)
    assert finite(net) and monitor.rollbacks == 1 and monitor.step == 33


# ---------------------------------------------------------------------- gradient accumulation


def accumulating_cell(**options):
    net = mlp()
    return net, MonitoredTrainStep(with_loss(net), nn.Adam(net.trainable_params(), 1e-2), grad_accum_steps=2,
                                   **options)


def test_an_accumulating_cell_restores_to_the_bit_at_and_inside_a_step():
    """The snapshot holds the accumulator and the micro-step counter: one taken at a step boundary
    (empty accumulator) and one after a micro-batch (a half-done step) both replay to the bit."""
    _, cell = accumulating_cell(max_norm=0.5, spike_mode="clip", history_size=8)
    x, y = stream(12)
    batch = [(Tensor(x[i * BATCH:(i + 1) * BATCH]), Tensor(y[i * BATCH:(i + 1) * BATCH])) for i in range(12)]
    for b in batch[:4]:
        cell(*b)
    at_step = cell.gradmon_snapshot()
    assert at_step.step == 2 and int(at_step.arrays["micro_step"]) == 0
    accum = [n for n in at_step.arrays if n.startswith("gradmon_accum.")]
    assert len(accum) == len(cell.weights) and not any(at_step.arrays[n].any() for n in accum)
    cell(*batch[4])
    inside = cell.gradmon_snapshot()
    assert int(inside.arrays["micro_step"]) == 1 and all(inside.arrays[n].any() for n in accum)
    saved = {"at_step": (at_step, 4), "inside": (inside, 5)}
    first = {k: None for k in saved}
    for b in batch[5:]:
        cell(*b)
    end = state(cell)
    for _ in range(2):
        for name, (snap, start) in saved.items():
            cell.gradmon_restore(snap)
            assert all(np.array_equal(p.asnumpy(), snap.arrays[n]) for n, p in cell.parameters_and_names())
            outs = [tuple(t.asnumpy().tobytes() for t in cell(*b)) for b in batch[start:]]
            assert first[name] is None or outs == first[name]
            first[name] = outs
            now = state(cell)
            assert all(np.array_equal(now[n], end[n]) for n in end)  # the same end state, to the bit


def test_an_accumulating_run_rolls_back_at_optimizer_steps(tmp_path):
    """N = 2 under Model.train: 80 batches are 40 optimizer steps; batch 49 (step 25's first
    micro-batch) overflows. Recovery counts optimizer steps: snapshots every 10 steps, a rollback
    to step 20, 2 held steps (4 batches), and the steps go on 21-33 as in the run without accumulation."""
    net, cell = accumulating_cell(skip_nonfinite=False, history_size=32)
    log = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(log, recovery={"every": 10, "keep": 2, "skip_batches": 2})
    Model(cell).train(1, dataset(80, bad=[49]), callbacks=[monitor], dataset_sink_mode=False)
    assert finite(net) and monitor.rollbacks == 1 and not monitor.should_stop
    first, second = segments(log)
    assert first[0]["steps_per_epoch"] == 40
    assert first[-1]["status"] == "rolled_back" and first[-1]["steps"] == 25
    rollback = second[1]
    got = (rollback["restored_step"], rollback["from_step"], rollback["incident_step"], rollback["detail"])
    assert got == (20, 25, 25, "nonfinite")
    assert rollback["batches_skipped"] == 5 + 2  # optimizer steps
    steps2 = [r["step"] for r in second if r["type"] == "step"]
    assert steps2 == list(range(21, 34))
    assert all(math.isfinite(r["loss"]) for r in second if r["type"] == "step")
    # Snapshots are taken at step boundaries only: an empty accumulator, no micro-step under way.
    kept = monitor.recovery.policy.ring
    assert [e.step for e in kept] == [20, 30]
    assert all(int(e.snapshot.arrays["micro_step"]) == 0 and e.snapshot.arrays["counts"][0] == e.step
               for e in kept)
    # The cell trained 33 optimizer steps' worth (its counter went back to 20 with the snapshot).
    assert cell.gradmon_read_history().total_steps == 33 and int(cell.micro_step.asnumpy()) == 0


def test_an_accumulating_hand_written_loop_rolls_back(tmp_path):
    net, cell = accumulating_cell(skip_nonfinite=False, history_size=32)
    x, y = stream(60, bad=[30])  # step 15's second micro-batch
    monitor = LiveMonitor(tmp_path / "metrics.jsonl", recovery={"every": 5, "skip_batches": 1}).attach(cell)
    with monitor:
        for i in range(60):
            rows = slice(i * BATCH, (i + 1) * BATCH)
            monitor.after_step(cell(Tensor(x[rows]), Tensor(y[rows])))
    # 30 optimizer steps' batches: 1-15, 11-15 abandoned, 1 held step: 30 - 5 - 1 = 24.
    assert finite(net) and monitor.rollbacks == 1 and monitor.step == 24
    _, second = segments(tmp_path / "metrics.jsonl")
    assert second[0]["initial_step"] == 10 and next(r["step"] for r in second if r["type"] == "step") == 11
