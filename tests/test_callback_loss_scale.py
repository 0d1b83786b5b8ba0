"""Loss-scale overflows under real MindSpore training: a ``skip`` event with reason ``overflow``,
not ``nonfinite``, and no abort while a dynamic scale settles; a run that keeps overflowing at the
minimum scale, or whose loss is not finite, is aborted."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStepWithLossScale
from mindspore import nn, ops
from mindspore.train import Model
from train_util import CpuLossScaleStep, NanAwareLoss, dataset, mlp, records, use_graph_mode

from examples.models import with_loss
from gradmon.monitor.callback import LiveMonitor


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


class LossTimes(nn.Cell):
    """The loss (in float32) times ``factor``: a broken loss whose fp16 gradients overflow even
    unscaled, while the loss itself stays finite."""

    def __init__(self, inner: nn.Cell, factor: float) -> None:
        super().__init__(auto_prefix=False)
        self.inner = inner
        self.factor = factor

    def construct(self, x, y):
        return ops.cast(self.inner(x, y), ms.float32) * self.factor


def fp16_step(initial_scale: float, *, loss_factor: float = 1.0, nan_loss: bool = False):
    """An fp16 MLP (AMP-style: the whole network in float16) under MonitoredTrainStepWithLossScale
    with MindSpore's dynamic loss scale: at 2**24 the scaled fp16 gradients overflow until the
    scale has come down to ~2**15."""
    net = mlp()
    net.to_float(ms.float16)
    body = NanAwareLoss(net) if nan_loss else with_loss(net)
    if loss_factor != 1.0:
        body = LossTimes(body, loss_factor)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=initial_scale, scale_factor=2, scale_window=1000)
    return MonitoredTrainStepWithLossScale(body, nn.SGD(net.trainable_params(), learning_rate=0.05), manager,
                                           history_size=64)


@pytest.mark.parametrize("exponent", [24, 32])
def test_a_healthy_fp16_run_with_a_settling_scale_is_not_aborted(tmp_path, exponent):
    path = tmp_path / "metrics.jsonl"
    seen = []
    monitor = LiveMonitor(path, log_interval=4, abort_after=5, on_event=seen.append)
    Model(fp16_step(2.0**exponent)).train(1, dataset(24), callbacks=[monitor])
    recs = records(path)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 25)) and recs[-1]["status"] == "finished"
    overflow = [r for r in steps if r.get("skip_reason") == "overflow"]
    assert len(overflow) >= 5  # enough to have aborted the run when overflows counted
    assert [r["step"] for r in overflow] == list(range(1, len(overflow) + 1))  # the scale settling
    for r in overflow:
        assert r["skipped"] is True and "nonfinite" not in r and math.isfinite(r["loss"])
        assert not math.isfinite(r["grad_norm"])  # the norm as measured
    scales = [r["loss_scale"] for r in overflow]
    assert scales == [2.0 ** (exponent - i) for i in range(len(overflow))]  # halved after each overflow
    events = [r for r in recs if r["type"] == "event"]
    assert {(e["kind"], e.get("reason")) for e in events} == {("skip", "overflow")}
    assert [e["step"] for e in events] == [r["step"] for r in overflow]
    assert events[0]["loss_scale"] == 2.0**exponent and f"{2.0**exponent:g}" in events[0]["message"]
    assert [e["kind"] for e in seen] == ["skip"] * len(overflow)  # on_event sees what is written
    assert all(math.isfinite(r["grad_norm"]) for r in steps[len(overflow):])  # then it trains


def test_a_nonfinite_loss_aborts_a_loss_scaled_run(tmp_path):
    path = tmp_path / "metrics.jsonl"
    executed = []
    step = fp16_step(2.0**10, nan_loss=True)

    class Counter(ms.train.Callback):
        def on_train_step_end(self, run_context):
            executed.append(run_context.original_args().cur_step_num)

    Model(step).train(1, dataset(12, nan_steps=range(1, 13)),
                      callbacks=[Counter(), LiveMonitor(path, log_interval=4, abort_after=5)])
    recs = records(path)
    abort = [r for r in recs if r.get("kind") == "abort"]
    assert len(abort) == 1 and abort[0]["step"] == 5 and recs[-1]["status"] == "aborted"
    assert {r["kind"] for r in recs if r["type"] == "event"} == {"nonfinite", "abort", "alarm", "alarm_end"}
    (alarm,) = [r for r in recs if r.get("kind") == "alarm"]  # one incident, the abort joining it
    assert (alarm["step"], alarm["reason"]) == (1, "nonfinite")
    assert executed == list(range(1, 9))  # the next log step (8) is where the monitor learns of it


def test_overflows_at_the_minimum_scale_abort(tmp_path):
    # A loss x 1e5: fp16 gradients overflow even at scale 1. From 2**2 the scale reaches its minimum
    # (1.0) at step 3; from there overflows count, and the 5th is step 7.
    path = tmp_path / "metrics.jsonl"
    Model(fp16_step(4.0, loss_factor=1e5)).train(1, dataset(16),
                                                 callbacks=[LiveMonitor(path, log_interval=1, abort_after=5)])
    recs = records(path)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["loss_scale"] for r in steps[:4]] == [4.0, 2.0, 1.0, 1.0]
    assert all(r["skip_reason"] == "overflow" for r in steps)
    (abort,) = [r for r in recs if r.get("kind") == "abort"]
    assert abort["step"] == 7 and abort["consecutive"] == 5 and recs[-1]["status"] == "aborted"


def test_mindspore_loss_scale_cell_outputs(tmp_path):
    # nn.TrainOneStepWithLossScaleCell returns (loss, overflow, scale): no norm. A NaN batch makes
    # the loss NaN: non-finite, not an overflow.
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**12, scale_factor=2, scale_window=1000)
    cell = CpuLossScaleStep(NanAwareLoss(net), opt, scale_sense=manager)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(5, nan_steps=[3]), callbacks=[LiveMonitor(path)])
    recs = records(path)
    steps = {r["step"]: r for r in recs if r["type"] == "step"}
    assert steps[2]["loss_scale"] == 2.0**12 and "skipped" not in steps[2]
    assert steps[3]["skipped"] is True and steps[3]["nonfinite"] is True
    assert steps[3]["skip_reason"] == "nonfinite"
    assert steps[4]["loss_scale"] == 2.0**11 and "skipped" not in steps[4]  # scale halved, training goes on
    events = [(r["kind"], r["step"]) for r in recs if r["type"] == "event"]
    assert events == [("nonfinite", 3), ("alarm", 3), ("alarm_end", 3)]  # the incident ends with the run


def test_mindspore_loss_scale_cell_overflow_is_a_skip(tmp_path):
    # The same cell with an overflow check that reports overflow on the first two steps (a finite
    # loss): skip events with reason overflow; the fixed-scale rule does not apply (dynamic scale).
    class OverflowFirstSteps(CpuLossScaleStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = ms.Parameter(ms.Tensor(np.zeros(1, np.int32)), name="calls", requires_grad=False)

        def get_overflow_status(self, status, compute_output):
            ops.assign_add(self.calls, ms.Tensor(np.ones(1, np.int32)))
            return (self.calls <= 2).all()

    net = mlp()
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**12, scale_factor=2, scale_window=1000)
    cell = OverflowFirstSteps(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                              scale_sense=manager)
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, dataset(4), callbacks=[LiveMonitor(path, abort_after=1)])
    recs = records(path)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r.get("skip_reason") for r in steps] == ["overflow", "overflow", None, None]
    assert [(r["kind"], r.get("reason")) for r in recs if r["type"] == "event"] == [("skip", "overflow")] * 2
    assert recs[-1]["status"] == "finished"  # abort_after=1, yet a settling scale never aborts
