"""What the data-parallel training scripts under msrun share (tests/dp_*_train.py): starting data
parallel, a rank's slice of a global dataset, random data, and saving the weights at a step.

Imported by the worker processes (the scripts put the checkout on ``sys.path``) and by the tests
that rebuild a script's data for their reference.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore.train import Callback


def start_data_parallel(mode: int = ms.GRAPH_MODE, seed: int = 0) -> tuple[int, int]:
    """Set ``mode``, start communication, ``DATA_PARALLEL`` with mean-reduced gradients, seed the
    initialisers; returns ``(rank, world)``."""
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_context(mode=mode)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(seed)
    return get_rank(), get_group_size()


def classification_data(rows: int, in_dim: int = 16, classes: int = 10,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` uniform float32 inputs and int32 labels below ``classes``."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, in_dim), dtype=np.float32)
    return x, rng.integers(0, classes, len(x)).astype(np.int32)


def poisoned_regression_data(rows: int, in_dim: int, out_dim: int, bad_row: int,
                             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` uniform float32 inputs and normal float32 targets; row ``bad_row``'s inputs x1000."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, in_dim), dtype=np.float32)
    y = rng.standard_normal((rows, out_dim)).astype(np.float32)
    x[bad_row] *= 1000.0
    return x, y


def shard_dataset(x: np.ndarray, y: np.ndarray, rank: int, world: int, batch: int) -> ds.Dataset:
    """This rank's shard of ``(x, y)`` as MindSpore's sampler deals it (``num_shards``), unshuffled."""
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    return data.batch(batch)


def indexed_rank_dataset(x: np.ndarray, y: np.ndarray, rank: int, world: int, batch: int) -> ds.Dataset:
    """This rank's rows ``rank, rank + world, ...`` of ``(x, y)`` (its own slice, no sampler), with an
    ``index`` column of their global ids, whole batches only (``forensics_ids=batch`` needs them):
    rank ``r``'s local row ``j`` is global row ``world * j + r``."""
    ids = np.arange(len(x), dtype=np.int32)
    mine = slice(rank, None, world)
    data = ds.NumpySlicesDataset({"x": x[mine], "y": y[mine], "index": ids[mine]}, shuffle=False)
    return data.batch(batch, drop_remainder=True)


class SaveWeightsAt(Callback):
    """Save the train cell's weights (``.npz`` by parameter name) at the end of ``Model``'s step
    ``step`` (``Model`` counts calls: micro-steps under gradient accumulation)."""

    def __init__(self, path: str, step: int) -> None:
        super().__init__()
        self.path = path
        self.step = int(step)

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        if cb.cur_step_num == self.step:
            np.savez(self.path, **{p.name: p.asnumpy() for p in cb.train_network.weights})
