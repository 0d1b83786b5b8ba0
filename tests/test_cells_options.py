"""StepOptions: one place that validates and defaults the step cells' options."""

from __future__ import annotations

import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
from gradmon.cells.options import StepOptions
from mindspore import Tensor, nn


def test_numpy_scalars_are_accepted_and_normalised() -> None:
    opts = StepOptions(max_norm=np.float32(1.5), history_size=np.int64(8), spike_warmup=np.int32(5),
                       spike_alpha=np.float64(0.9), spike_z=np.float32(3), skip_nonfinite=np.bool_(False))
    assert opts.max_norm == 1.5 and type(opts.max_norm) is float
    assert opts.history_size == 8 and type(opts.history_size) is int
    assert opts.spike.warmup == 5 and opts.spike.alpha == 0.9 and opts.spike.z_threshold == 3.0
    assert opts.skip_nonfinite is False


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_norm": "1"}, TypeError, "max_norm must be a positive number"),
    ({"max_norm": True}, TypeError, "max_norm must be a positive number"),
    ({"max_norm": 0.0}, ValueError, "positive finite"),
    ({"max_norm": float("inf")}, ValueError, "positive finite"),
    ({"history_size": -1}, ValueError, "history_size"),
    ({"history_size": 2.0}, ValueError, "history_size"),
    ({"skip_nonfinite": 1}, TypeError, "skip_nonfinite must be True or False"),
    ({"spike_mode": "loud"}, ValueError, "spike_mode"),
    ({"spike_alpha": "0.9"}, TypeError, "spike_alpha"),
    ({"spike_warmup": 1}, ValueError, "spike_warmup"),
    # (an integer too big for a float: once an OverflowError from float(), naming nothing)
    ({"max_norm": 10**400}, ValueError, "max_norm must be a positive finite"),
    ({"spike_alpha": 10**400}, ValueError, "spike_alpha must be a number"),
    ({"spike_loss_ratio": -(10**400)}, ValueError, "spike_loss_ratio must be a number"),
])
def test_bad_values_name_the_option(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        StepOptions(**kwargs)


def test_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"unexpected option\(s\) 'max_nrom'.*max_norm"):
        StepOptions.from_kwargs("MonitoredTrainStep", max_nrom=1.0)


def _net() -> nn.Cell:
    return nn.WithLossCell(nn.Dense(3, 2), nn.MSELoss())


def test_both_cells_report_the_same_defaults() -> None:
    net = _net()
    plain = MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), max_norm=np.float32(2.0))
    net2 = _net()
    scaled = MonitoredTrainStepWithLossScale(net2, nn.SGD(net2.trainable_params(), 0.1),
                                             Tensor(np.float32(4.0)), max_norm=np.float32(2.0))
    a, b = plain.gradmon_config(), scaled.gradmon_config()
    assert a["max_norm"] == b["max_norm"] == 2.0
    for name in StepOptions.__dataclass_fields__:
        if name != "skip_nonfinite":
            assert a[name] == b[name], name
    assert b["skip_nonfinite"] is True and b["loss_scale"] is True and a["loss_scale"] is False


def test_loss_scale_cell_refuses_fixed_options() -> None:
    net = _net()
    with pytest.raises(TypeError, match="does not take 'skip_nonfinite'"):
        MonitoredTrainStepWithLossScale(net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(4.0)),
                                        skip_nonfinite=False)
