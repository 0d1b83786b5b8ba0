"""LiveMonitor in hand-written loops (``log``, ``attach`` + ``after_step``) and where a segment's
step numbering starts when the caller says so (``start(initial_step=...)``, ``initial_step=``)."""

from __future__ import annotations

import mindspore as ms
import pytest
from mindspore import nn, ops
from mindspore.train import Model
from train_util import NanAwareLoss, dataset, history_cell, mlp, records, segments, use_graph_mode

from gradmon.monitor.callback import LiveMonitor


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


def test_log_in_a_custom_loop(tmp_path):
    net = mlp()
    loss_net = NanAwareLoss(net)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)
    path = tmp_path / "metrics.jsonl"
    with LiveMonitor(path, config={"loop": "custom"}) as monitor:
        for step, (x, y) in enumerate(dataset(4).create_tuple_iterator(), start=1):
            loss, grads = grad_fn(x, y)
            opt(grads)
            monitor.log(step, loss=loss, grad_norm=ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads])),
                        my_metric=step * 2)
        monitor.log_eval(accuracy=0.5, loss=1.25)
    recs = records(path)
    assert [r["type"] for r in recs] == ["header"] + ["step"] * 4 + ["eval", "end"]
    assert recs[0]["config"] == {"loop": "custom"}
    assert all(isinstance(r["loss"], float) and r["grad_norm"] > 0 for r in recs[1:5])
    assert [r["my_metric"] for r in recs[1:5]] == [2.0, 4.0, 6.0, 8.0]
    assert recs[5] == {**recs[5], "step": 4, "accuracy": 0.5, "loss": 1.25}
    assert recs[6]["steps"] == 4


def test_attach_and_after_step_in_a_custom_loop(tmp_path):
    cell, _ = history_cell("fake")
    path = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(path, log_interval=3).attach(cell)
    for x, y in dataset(7).create_tuple_iterator():
        monitor.after_step(cell(x, y))
    monitor.close()
    assert [r["step"] for r in records(path, "step")] == list(range(1, 8))
    header = records(path, "header")[0]
    assert header["spike_mode"] == "detect" and header["initial_step"] == 0
    assert "hand-written loop" in header["steps_per_epoch_unknown"]
    assert cell.reads == 1 + 3  # the step counter when the first after_step opens the segment, then 3 reads


def test_after_step_continues_from_a_trained_cell(tmp_path):
    # The same cell after 5 steps (as after load_checkpoint): a new loop continues at step 6.
    cell, _ = history_cell("real")
    for x, y in dataset(5).create_tuple_iterator():
        cell(x, y)
    path = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(path, log_interval=2).attach(cell)
    for x, y in dataset(4).create_tuple_iterator():
        monitor.after_step(cell(x, y))
    monitor.close()
    assert [r["step"] for r in records(path, "step")] == [6, 7, 8, 9]
    assert records(path, "header")[0]["initial_step"] == 5


def test_start_with_an_initial_step_then_model_train_continues_that_segment(tmp_path):
    # Before: the explicit segment stayed empty and Model.train began a new one at step 1.
    cell, _ = history_cell("real")
    path = tmp_path / "metrics.jsonl"
    monitor = LiveMonitor(path).attach(cell)
    monitor.start(initial_step=20)
    Model(cell).train(1, dataset(3), callbacks=[monitor])
    (segment,) = segments(path)
    assert (segment[0]["initial_step"], segment[0]["initial_step_from"]) == (20, "argument")
    assert [r["step"] for r in segment if r["type"] == "step"] == [21, 22, 23]
    assert segment[-1]["type"] == "end" and segment[-1]["steps"] == 23


def test_initial_step_argument_overrides_the_training_state(tmp_path):
    cell, _ = history_cell("real")
    for x, y in dataset(3).create_tuple_iterator():
        cell(x, y)  # the cell's counter says 3
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(2), callbacks=[LiveMonitor(path, initial_step=100)])
    steps = records(path, "step")
    assert [r["step"] for r in steps] == [101, 102]
    assert all(isinstance(r["grad_norm"], float) for r in steps)  # history rows map onto the numbering
