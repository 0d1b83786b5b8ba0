"""parse_step_outputs over the shapes train cells return, with real MindSpore tensors."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest

from gradmon.outputs import parse_step_outputs, to_float


def t(value, dtype=ms.float32):
    return ms.Tensor(np.array(value), dtype)


@pytest.mark.parametrize(
    "outputs, loss",
    [(t(2.5), 2.5), (np.float32(2.5), 2.5), (2.5, 2.5), (3, 3.0), (np.array([[2.5]]), 2.5),
     (t([1.0, 3.0]), 2.0)],
)
def test_scalar_shapes(outputs, loss):
    parsed = parse_step_outputs(outputs)
    assert parsed.loss == pytest.approx(loss)
    assert parsed.grad_norm is None and parsed.overflow is None and parsed.loss_scale is None


def test_loss_and_grad_norm():
    parsed = parse_step_outputs((t(1.5), t(4.0)))
    assert (parsed.loss, parsed.grad_norm, parsed.overflow) == (1.5, 4.0, None)
    assert parse_step_outputs([1.5, np.float64(4.0)]).grad_norm == 4.0


def test_loss_scale_cell_shape():
    # mindspore.nn.TrainOneStepWithLossScaleCell returns (loss, overflow, scaling_sens)
    parsed = parse_step_outputs((t(0.7), t(True, ms.bool_), t(1024.0)))
    assert parsed.loss == pytest.approx(0.7)
    assert parsed.overflow is True and parsed.loss_scale == 1024.0 and parsed.grad_norm is None
    parsed = parse_step_outputs((t(0.7), t(False, ms.bool_), t(1024.0)))
    assert parsed.overflow is False
    # A longer tuple: norm, then the overflow flag and the scale.
    parsed = parse_step_outputs((t(0.7), t(3.0), np.bool_(True), 256.0, "ignored"))
    assert (parsed.grad_norm, parsed.overflow, parsed.loss_scale) == (3.0, True, 256.0)


def test_nonfinite_values():
    parsed = parse_step_outputs((t(float("nan")), t(float("inf"))))
    assert math.isnan(parsed.loss) and parsed.grad_norm == math.inf and parsed.nonfinite
    assert not parse_step_outputs((1.0, 2.0)).nonfinite


def test_mapping_and_nested():
    parsed = parse_step_outputs({"loss": t(1.0), "grad_norm": 2.0, "overflow": False, "loss_scale": 8.0,
                                 "accuracy": t(0.5), "name": "text"})
    assert (parsed.loss, parsed.grad_norm, parsed.overflow, parsed.loss_scale) == (1.0, 2.0, False, 8.0)
    assert parsed.extra == {"accuracy": 0.5}
    assert parse_step_outputs(((t(1.0), t(9.0)), t(2.0))).loss == 1.0  # network with several outputs


def test_empty_and_odd():
    assert parse_step_outputs(None).loss is None
    assert parse_step_outputs(()).loss is None
    assert to_float("text") is None and to_float(np.array([])) is None and to_float(True) == 1.0
