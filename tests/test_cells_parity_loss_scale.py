"""Parity matrix (#16) of ``MonitoredTrainStepWithLossScale`` against ``nn.TrainOneStepWithLossScaleCell``.

The stock cell does not run on CPU (its overflow check reads Ascend status registers or uses GPU
kernels), so the reference is the stock cell with only that read replaced (``CpuLossScaleStep``: any
non-finite unscaled gradient, the rule of its GPU path). Over 20 steps with overflows, skipped steps and
scale changes, in GRAPH and PYNATIVE: bit-identical losses, weights, optimizer and loss-scale state, the
same overflow flag, and the same reported scale (the stock cell returns the scale after the step's
update: the one the next step uses). The history ring keeps the scale each step used.
"""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStepWithLossScale
from mindspore import Tensor, nn

from tests import parity_util
from tests.parity_util import (
    STEPS,
    CpuLossScaleStep,
    assert_same_bits,
    assert_same_run,
    batches,
    loss_net,
    run,
)

ABOVE_EVERY_NORM = 1e4

mode = parity_util.mode  # the GRAPH / PYNATIVE fixture


def _with_nan_batch(data: list, step: int) -> list:
    """``data`` with the inputs of ``step`` (from 1) replaced by NaN: that step must overflow."""
    x, y = data[step - 1]
    data = list(data)
    data[step - 1] = (Tensor(np.full(x.shape, np.nan, np.float32)), y)
    return data


# name: (scale_sense factory, optimizer factory, batches). The dynamic case starts near float32's top
# so that gradients overflow every few steps, the scale halves and grows back (and reaches inf at the
# last step: the stock update cell has no ceiling); the fixed ones overflow on a NaN batch.
CASES: dict[str, tuple[Callable, Callable, Callable]] = {
    "dynamic-Adam": (lambda: nn.DynamicLossScaleUpdateCell(2.0**126, 2, 4),
                     lambda p: nn.Adam(p, 0.01), lambda: batches(x_scale=3.0)),
    "fixed-cell-Momentum": (lambda: nn.FixedLossScaleUpdateCell(2.0**10),
                            lambda p: nn.Momentum(p, 0.05, 0.9), lambda: _with_nan_batch(batches(), 7)),
    "tensor-()-AdamWeightDecay": (lambda: Tensor(2.0**10, ms.float32),
                                  lambda p: nn.AdamWeightDecay(p, 0.01, weight_decay=0.1),
                                  lambda: _with_nan_batch(batches(), 7)),
    "tensor-(1,)-SGD": (lambda: Tensor([2.0**8], ms.float32), lambda p: nn.SGD(p, 0.05),
                        lambda: _with_nan_batch(batches(), 12)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_scale_parity(mode: str, case: str) -> None:
    make_scale, make_opt, make_data = CASES[case]
    data = make_data()
    net = loss_net()
    reference = CpuLossScaleStep(net, make_opt(net.trainable_params()), make_scale())
    scale_before: list[np.ndarray] = []
    stock = run(reference, data, lambda _: scale_before.append(reference.scale_sense.asnumpy().copy()))
    overflows = [bool(out[1]) for out in stock.outputs]
    assert any(overflows) and not all(overflows), f"{case}: the run must have overflow and normal steps"

    for variant, options in {"defaults": {}, "max_norm": {"max_norm": ABOVE_EVERY_NORM}}.items():
        net = loss_net()
        cell = MonitoredTrainStepWithLossScale(net, make_opt(net.trainable_params()), make_scale(), **options)
        ours = run(cell, data)
        what = f"{case} in {mode}, {variant}"
        assert_same_run(ours, stock, what)
        for step, (mine, theirs) in enumerate(zip(ours.outputs, stock.outputs), start=1):
            assert len(mine) == 4  # (loss, grad_norm, overflow, scale)
            assert bool(mine[2]) == bool(theirs[1]), f"{what}: overflow flag at step {step}"
            assert_same_bits(mine[3], theirs[2], f"{what}: reported scale at step {step}")
        snap = cell.gradmon_read_history()
        assert snap.total_steps == STEPS
        used = np.array([float(np.asarray(s).reshape(-1)[0]) for s in scale_before])
        np.testing.assert_array_equal(snap.column("loss_scale"), used.astype(np.float32))
        assert snap.column("skipped").tolist() == [float(o) for o in overflows]
        if options:
            finite = np.isfinite(snap.column("grad_norm"))
            assert (snap.column("grad_norm")[finite] < ABOVE_EVERY_NORM).all()
            assert (snap.column("clip_coef") == 1.0).all()
