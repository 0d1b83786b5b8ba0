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
from train_util import BATCH, IN_DIM, mlp, records, segments, use_graph_mode

from examples.models import with_loss
from gradmon.monitor.callback import LiveMonitor
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
