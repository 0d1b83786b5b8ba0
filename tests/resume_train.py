"""A run that is checkpointed and resumed (driven by tests/test_callback_resume.py, in the test's
process and in new ones): MonitoredTrainStep on a tiny MLP, 10 steps per epoch, a per-step
learning-rate table, LiveMonitor, optionally MindSpore's ModelCheckpoint every 10 steps.

Usage: ``python tests/resume_train.py LOG_FILE EPOCHS [--load CKPT] [--save-dir DIR] [--data-seed N]``
"""

from __future__ import annotations

import argparse
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import CheckpointConfig, Model, ModelCheckpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradmon.cells import MonitoredTrainStep

from examples.models import MLP, with_loss
from gradmon.monitor.callback import LiveMonitor

STEPS_PER_EPOCH = 10
LR_TABLE = [round(0.05 / (1 + 0.1 * k), 6) for k in range(100)]  # step s uses LR_TABLE[s - 1]


def data(seed: int = 0) -> ds.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.random((STEPS_PER_EPOCH * 8, 16), dtype=np.float32)
    y = rng.integers(0, 10, len(x)).astype(np.int32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)


def train(log_file: str, epochs: int, load: str | None = None, save_dir: str | None = None,
          data_seed: int = 0) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = MLP(in_dim=16, hidden=32)
    cell = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), learning_rate=LR_TABLE),
                              history_size=64)
    if load:
        ms.load_param_into_net(cell, ms.load_checkpoint(load))  # weights, optimizer, gradmon counters
    callbacks: list = [LiveMonitor(log_file, log_interval=3)]
    if save_dir:
        config = CheckpointConfig(save_checkpoint_steps=STEPS_PER_EPOCH, keep_checkpoint_max=10)
        callbacks.append(ModelCheckpoint(prefix="run", directory=save_dir, config=config))
    Model(cell).train(epochs, data(data_seed), callbacks=callbacks, dataset_sink_mode=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("log_file")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--load")
    parser.add_argument("--save-dir")
    parser.add_argument("--data-seed", type=int, default=0)
    args = parser.parse_args()
    train(args.log_file, args.epochs, args.load, args.save_dir, args.data_seed)
