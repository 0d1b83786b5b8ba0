"""What the monitored steps return: output layouts, ``return_grad``, ``(loss, *extra)`` networks, and
``LiveMonitor`` reading those outputs. (Bit-parity with the stock cells: test_cells_parity*.py.)"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from gradmon.cells.options import StepOptions, check_stock_arguments
from mindspore import Tensor, nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

from gradmon.logformat.reader import ReadStats, read_records
from gradmon.monitor.callback import LiveMonitor
from tests import parity_util
from tests.parity_util import (
    LossAndLogits,
    TinyNet,
    batches,
    host,
    loss_net,
)

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture


def _norm(grads) -> float:
    return math.sqrt(sum(float((np.asarray(g, np.float64) ** 2).sum()) for g in grads))


def _nan_batch() -> tuple[Tensor, Tensor]:
    x, y = batches(1)[0]
    return Tensor(np.full(x.shape, np.nan, np.float32)), y


# ------------------------------------------------------------------------------ the stock arguments


def test_stock_arguments_are_checked_and_normalised() -> None:
    assert check_stock_arguments(np.float32(2.0), np.bool_(True), "gradmon") == (2.0, True)
    assert check_stock_arguments(None, False, "mindformers") == (None, False)
    with pytest.raises(ValueError, match="sens can not be 0"):
        check_stock_arguments(0, False, "gradmon")
    with pytest.raises(TypeError, match="sens must be a number"):
        check_stock_arguments("2", False, "gradmon")
    with pytest.raises(TypeError, match="return_grad must be True or False"):
        check_stock_arguments(None, 1, "gradmon")
    with pytest.raises(ValueError, match="return_grad=True does not fit output_layout='mindformers'"):
        check_stock_arguments(None, True, "mindformers")
    with pytest.raises(ValueError, match="output_layout must be one of"):
        StepOptions(output_layout="megatron")


def test_loss_scale_cell_refuses_return_grad() -> None:
    net = loss_net()
    with pytest.raises(TypeError, match="does not take 'return_grad'"):
        MonitoredTrainStepWithLossScale(net, nn.SGD(net.trainable_params(), 0.1), Tensor(1.0, ms.float32),
                                        return_grad=True)


# ----------------------------------------------------------------------------------- return_grad


def test_return_grad_gives_the_named_gradients_and_their_norm(mode: str) -> None:
    net, twin = loss_net(), loss_net()
    step = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), return_grad=True, max_norm=0.01)
    x, y = batches(1)[0]
    _, ref = ms.value_and_grad(twin, None, twin.trainable_params())(x, y)
    _, norm, grads = host(step(x, y))
    assert list(grads) == [p.name for p in net.trainable_params()]
    for got, want in zip(grads.values(), ref):
        np.testing.assert_allclose(got, want.asnumpy(), rtol=1e-6, atol=1e-7)  # before clipping
    assert float(norm) == pytest.approx(_norm(grads.values()), rel=1e-6)
    assert float(norm) > 0.01 and step.gradmon_read_history().column("clipped").tolist() == [1.0]


# ------------------------------------------------------------------------ networks with several outputs


def _reference_grads(net: nn.Cell, x: Tensor, y: Tensor, seed: float) -> list[np.ndarray]:
    """Gradients of ``seed * (loss + sum(logits))``: both outputs of ``(loss, logits)`` seeded with it."""

    def seeded(x, y):
        loss, logits = net(x, y)
        return seed * (loss + logits.sum())

    _, grads = ms.value_and_grad(seeded, None, net.trainable_params())(x, y)
    return [g.asnumpy() for g in grads]


def test_several_outputs_seed_every_output_with_sens(mode: str) -> None:
    net, twin = LossAndLogits(TinyNet()), LossAndLogits(TinyNet())
    step = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), sens=2.0, return_grad=True)
    x, y = batches(1)[0]
    loss, norm, grads, logits = host(step(x, y))
    want_loss, want_logits = host(twin(x, y))
    np.testing.assert_array_equal(loss, want_loss)
    np.testing.assert_array_equal(logits, want_logits)
    ref = _reference_grads(twin, x, y, 2.0)
    for got, want in zip(grads.values(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert float(norm) == pytest.approx(_norm(ref), rel=1e-5)
    assert float(step.gradmon_read_history().column("loss")[0]) == float(loss)


def test_several_outputs_with_loss_scale(mode: str) -> None:
    net, twin = LossAndLogits(TinyNet()), LossAndLogits(TinyNet())
    scale = Tensor(2.0**10, ms.float32)
    step = MonitoredTrainStepWithLossScale(net, nn.SGD(net.trainable_params(), 0.1), scale)
    x, y = batches(1)[0]
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    _, norm, overflow, scale, logits = host(step(x, y))
    ref = _reference_grads(twin, x, y, 1.0)  # the scale is undone: gradients of loss + sum(logits)
    assert not overflow and float(scale) == 2.0**10 and logits.shape == (8, 3)
    assert float(norm) == pytest.approx(_norm(ref), rel=1e-5)
    for w0, w1, g in zip(before, net.trainable_params(), ref):
        np.testing.assert_allclose(w1.asnumpy(), w0 - 0.1 * g, rtol=1e-5, atol=1e-6)


class _Nested(nn.Cell):
    """``((loss, logits), y)`` with ``loss_first=False``, else ``(loss, (logits, y))``."""

    def __init__(self, loss_first: bool) -> None:
        super().__init__()
        self.net = TinyNet()
        self.loss_first = loss_first

    def construct(self, x, y):
        logits = self.net(x)
        loss = ((logits - y) ** 2).mean()
        if self.loss_first:
            return loss, (logits, y)
        return (loss, logits), y


@pytest.mark.parametrize(("loss_first", "sens", "match"), [
    (False, None, r"tuple \(loss, \*extra\) whose first element is the loss Tensor"),
    (True, 2.0, r"every output must be a Tensor.*Return a flat tuple \(loss, \*extra\)"),
])
def test_unreadable_outputs_are_refused_with_a_hint(mode: str, loss_first: bool, sens, match) -> None:
    net = _Nested(loss_first)
    step = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), sens=sens)
    with pytest.raises(TypeError, match=match):
        step(*batches(1)[0])


# --------------------------------------------------------------------------- mindformers layout


def _cosine() -> nn.LearningRateSchedule:
    return nn.CosineDecayLR(0.001, 0.05, 6)


def _schedule_at(step: int) -> np.float32:
    return np.float32(_cosine()(Tensor(np.array(step, np.int32))).asnumpy())


TABLE = [0.1, 0.05, 0.02, 0.01]
LR_KINDS = {
    "fixed": (lambda p: nn.AdamWeightDecay(p, 0.02), lambda step: np.float32(0.02)),
    "schedule": (lambda p: nn.AdamWeightDecay(p, _cosine()), _schedule_at),
    # The first group's rate, as gradmon.monitor.lr reads it on the host.
    "groups": (lambda p: nn.AdamWeightDecay([{"params": p[:2], "lr": _cosine()},
                                             {"params": p[2:], "lr": 0.5}]), _schedule_at),
    "table": (lambda p: nn.SGD(p, TABLE), lambda step: np.float32(TABLE[step])),
}


@pytest.mark.parametrize("lr_kind", list(LR_KINDS))
def test_mindformers_layout(mode: str, lr_kind: str) -> None:
    """``(loss, overflow, scale, lr, grad_norm)`` like MFTrainOneStepCell: same loss and norm as the default
    layout, the rate each step's update used (a skipped step's is the one it would have used)."""
    make_opt, rate_at = LR_KINDS[lr_kind]
    net, twin = loss_net(), loss_net()
    step = MonitoredTrainStep(net, make_opt(net.trainable_params()), output_layout="mindformers")
    plain = MonitoredTrainStep(twin, make_opt(twin.trainable_params()))
    data = batches(4)
    data.insert(2, _nan_batch())
    optimizer_steps = 0
    for i, batch in enumerate(data):
        out = host(step(*batch))
        loss, norm = host(plain(*batch))
        assert len(out) == 5 and all(isinstance(v, np.ndarray) and v.shape == () for v in out)
        assert [v.dtype for v in out] == [np.float32, np.bool_, np.float32, np.float32, np.float32]
        np.testing.assert_array_equal(out[0], loss, err_msg=f"loss at step {i + 1}")
        np.testing.assert_array_equal(out[4], norm, err_msg=f"norm at step {i + 1}")
        skipped = i == 2
        assert bool(out[1]) is skipped and out[2] == 1.0
        assert out[3] == rate_at(optimizer_steps), f"lr at step {i + 1}"
        optimizer_steps += 0 if skipped else 1
    assert step.gradmon_config()["output_layout"] == "mindformers"


def test_mindformers_layout_with_loss_scale(mode: str) -> None:
    net, twin = loss_net(), loss_net()
    update = nn.DynamicLossScaleUpdateCell(2.0**10, 2, 2)
    step = MonitoredTrainStepWithLossScale(net, nn.Momentum(net.trainable_params(), 0.05, 0.9), update,
                                           output_layout="mindformers")
    plain = MonitoredTrainStepWithLossScale(twin, nn.Momentum(twin.trainable_params(), 0.05, 0.9),
                                            nn.DynamicLossScaleUpdateCell(2.0**10, 2, 2))
    data = batches(5)
    data.insert(1, _nan_batch())
    scales = []
    for batch in data:
        loss, overflow, scale, lr, norm = host(step(*batch))
        want = host(plain(*batch))  # (loss, grad_norm, overflow, scale)
        np.testing.assert_array_equal(loss, want[0])
        np.testing.assert_array_equal(norm, want[1])
        assert bool(overflow) is bool(want[2]) and scale == want[3] and lr == np.float32(0.05)
        scales.append(float(scale))
    # The scale after each step: halved by the overflow at step 2, doubled after two good steps.
    assert scales == [2.0**10, 2.0**9, 2.0**9, 2.0**10, 2.0**10, 2.0**11]


# ------------------------------------------------------------------------ LiveMonitor reads them


def _train_logged(cell: nn.Cell, tmp_path, nan_step: int | None = None) -> dict[int, dict]:
    data = [(x.asnumpy(), y.asnumpy()) for x, y in batches(6)]
    if nan_step is not None:
        data[nan_step - 1] = (np.full_like(data[0][0], np.nan), data[nan_step - 1][1])
    path = tmp_path / "metrics.jsonl"
    Model(cell).train(1, GeneratorDataset(data, ["x", "y"], shuffle=False),
                      callbacks=[LiveMonitor(path, log_interval=1)], dataset_sink_mode=False)
    stats = ReadStats()
    steps = {r["step"]: r for r in read_records(path, stats=stats) if r["type"] == "step"}
    assert stats.malformed == 0 and sorted(steps) == [1, 2, 3, 4, 5, 6]
    return steps


@pytest.mark.parametrize("history_size", [0, 8])
def test_live_monitor_reads_return_grad_and_extra_outputs(tmp_path, history_size: int) -> None:
    net = LossAndLogits(TinyNet())
    cell = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.05), return_grad=True,
                              history_size=history_size)
    steps = _train_logged(cell, tmp_path)
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps.values())


def test_live_monitor_reads_the_loss_scale_outputs(tmp_path) -> None:
    """Without the history ring LiveMonitor parses (loss, grad_norm, overflow, scale)."""
    net = loss_net()
    cell = MonitoredTrainStepWithLossScale(net, nn.SGD(net.trainable_params(), 0.05),
                                           nn.DynamicLossScaleUpdateCell(2.0**10, 2, 1000), history_size=0)
    steps = _train_logged(cell, tmp_path, nan_step=3)
    assert steps[3].get("skipped") is True and not math.isfinite(steps[3]["grad_norm"])
    assert all(math.isfinite(steps[s]["grad_norm"]) and "skipped" not in steps[s] for s in (1, 2, 4, 5, 6))
    assert steps[2]["loss_scale"] == 2.0**10 and steps[4]["loss_scale"] == 2.0**9


def test_live_monitor_reads_the_mindformers_layout_from_the_history(tmp_path) -> None:
    net = loss_net()
    cell = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.05), output_layout="mindformers")
    steps = _train_logged(cell, tmp_path)
    assert all(r["grad_norm"] > 0 and math.isfinite(r["loss"]) for r in steps.values())
