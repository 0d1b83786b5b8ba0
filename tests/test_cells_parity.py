"""Parity matrix (#16): ``MonitoredTrainStep`` is a drop-in ``nn.TrainOneStepCell``.

For every optimizer MindSpore ships that runs on CPU, grouped learning rates and weight decay,
learning-rate schedules, ``sens``, ``return_grad``, dynamic shapes, networks with several outputs and
``Model.train``, in GRAPH and PYNATIVE mode: the stock cell and ``MonitoredTrainStep`` (defaults, and
with ``max_norm`` above every norm) give bit-identical losses, weights and optimizer state over 20
steps. The loss-scale cell's matrix is in test_cells_parity_loss_scale.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

from tests import parity_util
from tests.parity_util import (
    IN,
    OUT,
    STEPS,
    LossAndLogits,
    Run,
    TinyNet,
    assert_same_bits,
    assert_same_run,
    batches,
    cell_params,
    host,
    loss_net,
    run,
)

# Far above every gradient norm of these runs (checked in each test): clipping must change nothing.
ABOVE_EVERY_NORM = 1e4
OURS = {"defaults": {}, "max_norm": {"max_norm": ABOVE_EVERY_NORM}}

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture


Factory = Callable[[list], nn.Cell]

# Every optimizer of mindspore.nn that runs on CPU, once each (weight decay: see LR_CASES).
OPTIMIZERS: dict[str, Factory] = {
    "SGD": lambda p: nn.SGD(p, 0.05, momentum=0.9, nesterov=True),
    "Momentum": lambda p: nn.Momentum(p, 0.05, 0.9),
    "Adam": lambda p: nn.Adam(p, 0.01),
    "AdamWeightDecay": lambda p: nn.AdamWeightDecay(p, 0.01, weight_decay=0.1),
    "AdamOffload": lambda p: nn.AdamOffload(p, 0.01),
    "LazyAdam": lambda p: nn.LazyAdam(p, 0.01),
    "AdaMax": lambda p: nn.AdaMax(p, 0.01),
    "AdaFactor": lambda p: nn.AdaFactor(p),
    "Adadelta": lambda p: nn.Adadelta(p, 0.5),
    "Adagrad": lambda p: nn.Adagrad(p, learning_rate=0.05),
    "ASGD": lambda p: nn.ASGD(p, 0.05),
    "FTRL": lambda p: nn.FTRL(p, learning_rate=0.05),
    "ProximalAdagrad": lambda p: nn.ProximalAdagrad(p, 0.05, l1=0.001, l2=0.001),
    "RMSProp": lambda p: nn.RMSProp(p, 0.01),
    "Rprop": lambda p: nn.Rprop(p, 0.01),
}
# mindspore.nn optimizers that have no CPU kernels ("Kernel select failed" with the stock cell too),
# or that are not optimizers of a single process's parameters.
NOT_ON_CPU = {"Lamb", "LARS", "OptTFTWrapper"}


def _groups(params: list, lr_weights: Any, lr_biases: Any) -> list[dict]:
    weights = [p for p in params if "weight" in p.name]
    biases = [p for p in params if "weight" not in p.name]
    return [{"params": weights, "lr": lr_weights, "weight_decay": 0.01},
            {"params": biases, "lr": lr_biases, "weight_decay": 0.0},
            {"order_params": params}]


def _cosine() -> nn.LearningRateSchedule:
    return nn.CosineDecayLR(0.001, 0.05, 10)


# Grouped learning rates and weight decay (fixed and scheduled), a schedule cell and a per-step table.
LR_CASES: dict[str, Factory] = {
    "groups-AdamWeightDecay": lambda p: nn.AdamWeightDecay(_groups(p, 0.01, 0.02), 0.01),
    "groups-schedules-Adam": lambda p: nn.Adam(_groups(p, _cosine(), [0.02] * 10 + [0.01] * 10), 0.01),
    "schedule-Momentum": lambda p: nn.Momentum(p, _cosine(), 0.9, weight_decay=0.01),
    "table-SGD": lambda p: nn.SGD(p, nn.piecewise_constant_lr([5, 10, 40], [0.1, 0.05, 0.01])),
}


def _check_no_clipping(cell: MonitoredTrainStep) -> None:
    """With ``max_norm`` set: it was above every norm, so nothing was clipped (the premise of the test)."""
    snap = cell.gradmon_read_history()
    assert snap.total_steps == STEPS
    assert (snap.column("grad_norm") < ABOVE_EVERY_NORM).all() and (snap.column("clip_coef") == 1.0).all()


def _compare(stock_cell: Callable[[], nn.Cell], our_cell: Callable[[dict], MonitoredTrainStep],
             data: list, what: str, compare_outputs: Callable[[Run, Run], None] | None = None) -> None:
    stock = run(stock_cell(), data)
    for variant, options in OURS.items():
        cell = our_cell(options)
        ours = run(cell, data)
        assert_same_run(ours, stock, f"{what}, {variant}")
        if compare_outputs is not None:
            compare_outputs(ours, stock)
        if options:
            _check_no_clipping(cell)


def test_matrix_covers_every_optimizer_mindspore_ships() -> None:
    shipped = {name for name, obj in vars(nn).items()
               if inspect.isclass(obj) and issubclass(obj, nn.Optimizer) and obj is not nn.Optimizer}
    covered = {name.split("-")[0] for name in OPTIMIZERS}
    assert shipped - NOT_ON_CPU == covered, "a MindSpore optimizer is missing from the parity matrix"


@pytest.mark.parametrize("case", list(OPTIMIZERS) + list(LR_CASES))
def test_optimizer_parity(mode: str, case: str) -> None:
    make_opt = OPTIMIZERS.get(case) or LR_CASES[case]

    def stock() -> nn.Cell:
        net = loss_net()
        return nn.TrainOneStepCell(net, make_opt(net.trainable_params()))

    def ours(options: dict) -> MonitoredTrainStep:
        net = loss_net()
        return MonitoredTrainStep(net, make_opt(net.trainable_params()), **options)

    _compare(stock, ours, batches(), f"{case} in {mode}")


def _same_grads(ours: Run, stock: Run) -> None:
    for step, (a, b) in enumerate(zip(ours.outputs, stock.outputs), start=1):
        grads_ours, grads_stock = a[2], b[1]  # (loss, grad_norm, grads) and (loss, grads)
        assert list(grads_ours) == list(grads_stock)
        for name in grads_stock:
            assert_same_bits(grads_ours[name], grads_stock[name], f"gradient of {name} at step {step}")


STOCK_ARGS = [{"sens": 2.0}, {"return_grad": True}, {"sens": 0.5, "return_grad": True}]


@pytest.mark.parametrize("stock_args", STOCK_ARGS, ids=["sens", "return_grad", "sens+return_grad"])
def test_sens_and_return_grad_parity(mode: str, stock_args: dict) -> None:
    def stock() -> nn.Cell:
        net = loss_net()
        return nn.TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.05, 0.9), **stock_args)

    def ours(options: dict) -> MonitoredTrainStep:
        net = loss_net()
        optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        return MonitoredTrainStep(net, optimizer, **stock_args, **options)

    compare = _same_grads if stock_args.get("return_grad") else None
    _compare(stock, ours, batches(), f"{stock_args} in {mode}", compare)


def test_sens_positional_like_the_stock_cell() -> None:
    net = loss_net()
    cell = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), np.float32(4.0), np.bool_(True))
    assert (cell.sens, cell.sense_flag, cell.return_grad) == (4.0, True, True)


def test_dynamic_shape_parity(mode: str) -> None:
    sizes = [8, 5, 8, 3, 7] * 4
    dynamic = (Tensor(shape=[None, IN], dtype=ms.float32), Tensor(shape=[None, OUT], dtype=ms.float32))

    def stock() -> nn.Cell:
        net = loss_net()
        cell = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), 0.01))
        cell.set_inputs(*dynamic)
        return cell

    def ours(options: dict) -> MonitoredTrainStep:
        net = loss_net()
        cell = MonitoredTrainStep(net, nn.Adam(net.trainable_params(), 0.01), **options)
        cell.set_inputs(*dynamic)
        return cell

    _compare(stock, ours, batches(sizes=sizes), f"dynamic shapes in {mode}")


def test_several_outputs_parity(mode: str) -> None:
    """``(loss, logits)`` networks: loss first, every output seeded with ones as the stock cell seeds them."""

    def stock() -> nn.Cell:
        net = LossAndLogits(TinyNet())
        return nn.TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.05, 0.9))

    def ours(options: dict) -> MonitoredTrainStep:
        net = LossAndLogits(TinyNet())
        return MonitoredTrainStep(net, nn.Momentum(net.trainable_params(), 0.05, 0.9), **options)

    def same_logits(ours_run: Run, stock_run: Run) -> None:
        for step, (a, b) in enumerate(zip(ours_run.outputs, stock_run.outputs), start=1):
            assert len(a) == 3 and len(b) == 2  # (loss, grad_norm, logits) and (loss, logits)
            assert_same_bits(a[2], b[1], f"logits at step {step}")

    _compare(stock, ours, batches(), f"(loss, logits) in {mode}", same_logits)


class _Outputs(Callback):
    """Keeps every step's ``net_outputs`` on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[Any] = []

    def on_train_step_end(self, run_context) -> None:
        self.outputs.append(host(run_context.original_args().net_outputs))


def _model_train(cell: nn.Cell) -> Run:
    from mindspore.dataset import GeneratorDataset

    data = [(x.asnumpy(), y.asnumpy()) for x, y in batches(STEPS // 2)]
    initial = cell_params(cell)
    seen = _Outputs()
    dataset = GeneratorDataset(data, ["x", "y"], shuffle=False)
    Model(cell).train(2, dataset, callbacks=[seen], dataset_sink_mode=False)  # 2 epochs of 10 steps
    return Run(seen.outputs, cell_params(cell), initial)


def test_model_train_parity(mode: str) -> None:
    net = loss_net()
    stock = _model_train(nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), 0.01)))
    for variant, options in OURS.items():
        net = loss_net()
        cell = MonitoredTrainStep(net, nn.Adam(net.trainable_params(), 0.01), **options)
        ours = _model_train(cell)
        assert_same_run(ours, stock, f"Model.train, {variant}")
        if options:
            _check_no_clipping(cell)
