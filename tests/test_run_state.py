"""What the monitor reads from MindSpore when a segment starts, each part alone: the header fields
(gradmon.monitor.header) and the training state (gradmon.monitor.training_state) — restored step counters, the
loss-scale floor, the epoch length."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from train_util import NanAwareLoss, dataset, mlp, monitored_step, use_graph_mode

from gradmon.monitor.header import header_fields, parallel_info
from gradmon.monitor.training_state import epoch_length, overflow_floor, restored_step


@pytest.fixture(autouse=True)
def _graph_mode():
    use_graph_mode()


def _train(cell, steps: int) -> None:
    for x, y in dataset(steps).create_tuple_iterator():
        cell(x, y)


def test_restored_step_from_the_step_cell_counter_in_a_checkpoint(tmp_path):
    net = mlp()
    cell = monitored_step(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    _train(cell, 3)
    ms.save_checkpoint(cell, str(tmp_path / "s3.ckpt"))

    net = mlp()  # a new process would build the same network afresh
    fresh = monitored_step(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    assert restored_step(fresh, fresh.optimizer) == (0, "step_cell")
    ms.load_param_into_net(fresh, ms.load_checkpoint(str(tmp_path / "s3.ckpt")))
    assert restored_step(fresh, fresh.optimizer) == (3, "step_cell")


def test_restored_step_from_the_optimizer_when_the_cell_has_no_counter(tmp_path):
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    _train(plain, 2)
    assert restored_step(plain, plain.optimizer) == (2, "optimizer")
    net = mlp()
    no_ring = monitored_step(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05),
                             history_size=0)
    _train(no_ring, 2)
    assert restored_step(no_ring, no_ring.optimizer) == (2, "optimizer")
    assert restored_step(None, None) == (0, "none")


def test_a_cell_counter_that_was_not_restored_loses_to_the_optimizer(tmp_path):
    # A checkpoint of a plain TrainOneStepCell loaded under a MonitoredTrainStep: its counter says 0.
    net = mlp()
    plain = nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    _train(plain, 4)
    ms.save_checkpoint(plain, str(tmp_path / "plain.ckpt"))
    net = mlp()
    cell = monitored_step(NanAwareLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.05))
    ms.load_param_into_net(cell, ms.load_checkpoint(str(tmp_path / "plain.ckpt")))
    assert restored_step(cell, cell.optimizer) == (4, "optimizer")


def test_overflow_floor():
    from gradmon.cells import MonitoredTrainStepWithLossScale

    def scaled(sense):
        net = mlp()
        return MonitoredTrainStepWithLossScale(NanAwareLoss(net), nn.SGD(net.trainable_params(), 0.05), sense)

    dynamic = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**24, scale_factor=2, scale_window=1000)
    assert overflow_floor(scaled(dynamic)) == 1.0  # MindSpore's dynamic minimum
    assert overflow_floor(scaled(nn.FixedLossScaleUpdateCell(1024.0))) == math.inf
    assert overflow_floor(scaled(ms.Tensor(np.float32(1024.0)))) == math.inf
    net = mlp()
    assert overflow_floor(nn.TrainOneStepCell(NanAwareLoss(net), nn.SGD(net.trainable_params(), 0.05))) == 1.0
    assert overflow_floor(None) == 1.0


def test_epoch_length():
    data = dataset(12)
    # CPU asked for sink mode (sink_size=4): MindSpore runs without sink, the whole dataset per epoch.
    assert epoch_length({"dataset_sink_mode": False, "batch_num": 4, "train_dataset": data}) == (12, None)
    # A real sink (GPU/Ascend): an epoch is one sink.
    assert epoch_length({"dataset_sink_mode": True, "batch_num": 4, "train_dataset": data}) == (4, None)

    class NoSize:
        def get_dataset_size(self):
            raise RuntimeError("no size")

    steps, reason = epoch_length({"dataset_sink_mode": False, "train_dataset": NoSize()})
    assert steps is None and "no size" in reason


def _header(cell=None, **kw):
    args = dict(cell=cell, config={"a": 1}, log_interval=2, rank=0, world_size=1, batch_size=None,
                steps_per_epoch=None, steps_per_epoch_unknown="why", initial_step=7,
                initial_step_from="argument")
    args.update(kw)
    return header_fields(**args)


def test_header_fields():
    h = _header()
    assert (h["mode"], h["device"], h["parallel_mode"], h["device_num"]) == ("GRAPH", "CPU", "stand_alone", 1)
    assert (h["initial_step"], h["initial_step_from"], h["steps_per_epoch_unknown"]) == (7, "argument", "why")
    assert "steps_per_epoch" not in h and "cell_config" not in h and h["max_norm"] is None
    h = _header(steps_per_epoch=12, batch_size=16)
    assert (h["steps_per_epoch"], h["batch_size"]) == (12, 16) and "steps_per_epoch_unknown" not in h

    class Cell:
        def gradmon_config(self):
            return {"max_norm": 1.0, "spike_mode": "clip", "norm_strategy": "sharded"}

    h = _header(Cell())
    assert (h["max_norm"], h["spike_mode"], h["norm_strategy"]) == (1.0, "clip", "sharded")
    assert h["cell_config"]["norm_strategy"] == "sharded"


def test_parallel_info_follows_the_auto_parallel_context():
    assert parallel_info(1) == {"parallel_mode": "stand_alone", "device_num": 1}
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, device_num=4)
    try:
        assert parallel_info(1) == {"parallel_mode": "semi_auto_parallel", "device_num": 4}
    finally:
        ms.reset_auto_parallel_context()
    assert parallel_info(8)["device_num"] == 8  # not set: the world size
